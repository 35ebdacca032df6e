"""Round bookkeeping shared by every strategy (the round skeleton itself is ``strategies.skeleton``; the per-round
log is the core's ``fl_app.run.round_log.RoundLog``): the options every strategy takes from the run config, seeded
client sampling over partition ids, and the nodes taking part: the set of partitions whose node is connected now
(nodes leave, join and rejoin in a deployment), asked with the core's partition query (``fl_app.run.node_query``)."""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.common.logger import log

from fl_app.run.config import RunConfig
from fl_app.run.costs import LocalTraining
from fl_app.run.lr_schedule import lr_schedule
from fl_app.run.node_query import PARTITION_ID, partition_info, partition_query
from fl_app.run.round_log import raised


def round_options(run: RunConfig, num_partitions: int) -> dict:
    """The keyword arguments every strategy here takes from the run config: sampling, wire format, reply quorum,
    the learning rate each round's clients get and the shape of their local training."""
    return dict(
        clients_per_round=run.clients_per_round(num_partitions),
        seed=run["seed"],
        payload_dtype=run["payload-dtype"],
        min_reply_fraction=run["min-reply-fraction"],
        lr_of_round=lr_schedule(run),
        local_training=LocalTraining.of(run),
    )


def sample_partitions(partition_ids: Iterable[int], k: int, seed: int, server_round: int) -> list[int]:
    """Seeded client sampling over partition ids (node ids are random per run)."""
    ids = sorted(partition_ids)
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(p) for p in rng.choice(ids, size=min(k, len(ids)), replace=False))


def arrays_bytes(reply: Message, name: str) -> int:
    """Bytes of a reply's ArrayRecord ``name`` that arrived (0 for an error reply or one without it)."""
    if reply.has_error():
        return 0
    record = reply.content.array_records.get(name)
    return record.count_bytes() if isinstance(record, ArrayRecord) else 0


# -- which nodes hold which partition, followed as nodes leave, join and rejoin -----------------------------------
class LiveNodes:
    """Which partitions have a connected node now, followed round by round.

    ``refresh(grid)`` reads ``grid.get_node_ids()``: a partition whose node is gone is not sampled while it is gone;
    a node id not seen before (a node that joined late, or rejoined after a restart with a new id) is asked its
    partition (``partition_query``) and used from this round on, unless its num-partitions differs from the
    federation's or its partition is held by another live node (refused, with the reason logged once). A node that
    does not answer within ``query_timeout`` counts as a failed query (``failed_queries``) and is not asked again
    while it stays connected (a round never waits for it twice); once it leaves, it is asked again if it returns. In a
    simulation the node set never changes, so every partition stays live and sampling is exactly what the seed
    gives. ``node_of_partition`` is updated in place (the strategy addresses its messages through it)."""

    def __init__(self, node_of_partition: dict[int, int], num_partitions: int, query_timeout: float = 60.0):
        self.node_of_partition, self.num_partitions = node_of_partition, num_partitions
        self.query_timeout = query_timeout
        self.live: set[int] = set(node_of_partition)
        self.refused: dict[int, str] = {}  # node id -> why it is not used
        self.silent: set[int] = set()  # connected nodes that never answered their partition query
        self.failed_queries = 0  # partition queries that went unanswered within the timeout, over the run

    def partitions(self, grid, server_round: int) -> list[int]:
        """The partitions to sample from this round, sorted: the live ones (``refresh``), or every partition when
        there is no grid to ask (a strategy driven directly, without Flower's runtime)."""
        return self.refresh(grid, server_round) if grid is not None else sorted(self.node_of_partition)

    def refresh(self, grid, server_round: int) -> list[int]:
        """The live partition ids this round, sorted."""
        connected = set(grid.get_node_ids())
        known = set(self.node_of_partition.values())
        self.silent &= connected  # a silent node that left is asked again when it returns
        self._ask(grid, server_round, sorted(connected - known - set(self.refused) - self.silent), connected)
        live = {pid for pid, node in self.node_of_partition.items() if node in connected}
        for pid in sorted(self.live - live):
            log(
                WARNING,
                "round %d: client %d (node %d) is gone: not sampled while it is away",
                server_round,
                pid,
                self.node_of_partition[pid],
            )
        for pid in sorted(live - self.live):
            log(INFO, "round %d: client %d (node %d) is back", server_round, pid, self.node_of_partition[pid])
        self.live = live
        return sorted(live)

    def _ask(self, grid, server_round: int, nodes: list[int], connected: set[int]) -> None:
        if not nodes:
            return
        node_of_query = dict(zip(grid.push_messages([partition_query(n) for n in nodes]), nodes))
        pending = set(node_of_query)
        replies, deadline = [], time.time() + self.query_timeout
        while pending and time.time() < deadline:
            pulled = list(grid.pull_messages(pending))
            pending.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
            replies += pulled
            if pending:
                time.sleep(0.2)
        if pending:
            silent = sorted(node_of_query[query] for query in pending)
            self.silent.update(silent)
            self.failed_queries += len(silent)
            log(
                WARNING,
                "round %d: node(s) %s did not answer the partition query within %.0fs: failed, not asked again "
                "while connected",
                server_round,
                silent,
                self.query_timeout,
            )
        for reply in replies:
            node = reply.metadata.src_node_id
            try:
                info = partition_info(reply, self.num_partitions)
            except Exception as problem:  # a malformed answer refuses that node; it never ends the round
                reason = raised(problem)  # a ValueError's message names the node already
                self._refuse(node, reason if isinstance(problem, ValueError) else f"SuperNode {node}: {reason}")
                continue
            pid = info[PARTITION_ID]
            previous = self.node_of_partition.get(pid)
            if previous is not None and previous in connected and previous != node:
                self._refuse(node, f"SuperNode {node} claims partition-id={pid}, held by live SuperNode {previous}")
                continue
            log(
                INFO,
                "round %d: client %d is on node %d%s",
                server_round,
                pid,
                node,
                f" (was node {previous})" if previous is not None else " (joined)",
            )
            self.node_of_partition[pid] = node

    def _refuse(self, node: int, reason: str) -> None:
        log(WARNING, "refused: %s", reason)
        self.refused[node] = reason
