"""Round bookkeeping shared by every strategy (the round skeleton itself is ``strategies.skeleton``): seeded client
sampling over partition ids, the per-round log of who was sampled, who failed, whose reply was rejected, and what it
cost, and the nodes taking part: the partition query a node answers and the set of partitions whose node is
connected now (nodes leave, join and rejoin in a deployment)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from logging import INFO, WARNING
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log

from fl_app.run.config import RunConfig
from fl_app.run.costs import LocalTraining
from fl_app.run.lr_schedule import lr_schedule
from strategies.screening import raised


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


@dataclass
class RoundLog:
    """What happened in one round. Every sampled partition ends in exactly one of ``accepted``, ``rejected`` (its
    reply failed screening) or ``failed`` (it raised, its node was unavailable, or it never answered)."""

    sampled: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    unreached: list[int] = field(default_factory=list)  # failed without the message reaching the node
    bytes_down: int = 0  # payloads sent; after ``close``, only those delivered to a node that answered
    bytes_down_unanswered: int = 0  # payloads sent to partitions whose node never answered (dead, gone, timed out)
    bytes_up: int = 0
    train_loss: float = math.nan
    seconds: float = math.nan  # wall time of the whole round (training, aggregation, evaluation)
    client_seconds: float = 0.0  # sum of the accepted clients' own time in their ClientApp function
    server_rss_mb: float = math.nan  # server process memory after the round: resident and peak so far
    server_peak_rss_mb: float = math.nan
    answered: set[int] = field(default_factory=set)
    diagnostics: dict[str, float] = field(default_factory=dict)  # a method's own per-round numbers (extra columns)

    def to_dict(self) -> dict:
        return {**asdict(self), "answered": sorted(self.answered)}

    @staticmethod
    def from_dict(saved: dict) -> "RoundLog":
        return RoundLog(**{**saved, "answered": set(saved["answered"])})

    def row(self, server_round: int) -> dict:
        """This round's line of rounds.csv."""
        return {
            "round": server_round,
            "sampled": len(self.sampled),
            "replies": len(self.accepted),
            "failed": len(self.failed),
            "rejected": len(self.rejected),
            "train_loss": self.train_loss,
            "bytes_down": self.bytes_down,
            "bytes_down_unanswered": self.bytes_down_unanswered,
            "bytes_up": self.bytes_up,
            "seconds": self.seconds,
            "client_seconds": self.client_seconds,
            "server_rss_mb": self.server_rss_mb,
            "server_peak_rss_mb": self.server_peak_rss_mb,
            **self.diagnostics,
        }

    def screen(
        self, server_round: int, replies: Iterable[Message], sent: Mapping[int, Message]
    ) -> list[tuple[int, Message]]:
        """(partition id, reply) of the replies without error, in partition order; errors are logged as failures.

        A reply is credited to partition p only when it answers the message ``sent[p]`` of this round
        (``metadata.reply_to_message_id`` is the id the grid gave that message when it pushed it) and comes from the
        node that message was sent to. The one exception is the SuperLink's own error reply for a message it could
        not deliver (a node that died: NODE_UNAVAILABLE), which carries the SuperLink's node id as sender: an error
        from ``SUPERLINK_NODE_ID`` that answers ``sent[p]`` counts as p's failure. Every other reply (one that
        answers a message of another round, a replayed one, one from a node answering another node's message) is
        logged and ignored, as is a second reply for a partition: each partition counts once."""
        partition_of_message = {m.metadata.message_id: p for p, m in sent.items() if m.metadata.message_id}
        partition_of_node = {m.metadata.dst_node_id: p for p, m in sent.items()}
        usable = []
        for reply in replies:
            pid, why_not = self._partition_of(reply, sent, partition_of_message, partition_of_node)
            if pid is None:
                log(
                    WARNING,
                    "round %d: a reply from node %d %s: ignored",
                    server_round,
                    reply.metadata.src_node_id,
                    why_not,
                )
                continue
            if pid in self.answered:
                log(WARNING, "round %d: a second reply for client %d: ignored", server_round, pid)
                continue
            self.answered.add(pid)
            if reply.has_error():
                log(WARNING, "round %d: client %d failed: %s", server_round, pid, reply.error.reason)
                self.failed.append(pid)
                if reply.error.code == ErrorCode.NODE_UNAVAILABLE or reply.metadata.src_node_id == SUPERLINK_NODE_ID:
                    self.unreached.append(pid)
            else:
                usable.append((pid, reply))
        return sorted(usable, key=lambda answer: answer[0])

    @staticmethod
    def _partition_of(
        reply: Message, sent: Mapping[int, Message], partition_of_message: dict, partition_of_node: dict
    ) -> tuple[int | None, str]:
        """(the partition ``reply`` is credited to, or None and why not); see ``screen``."""
        meta = reply.metadata
        if meta.src_node_id == SUPERLINK_NODE_ID and reply.has_error():
            pid = partition_of_message.get(meta.reply_to_message_id)
            return pid, "" if pid is not None else "(the SuperLink's error) answers no message of this round"
        pid = partition_of_node.get(meta.src_node_id)
        if pid is None:
            answered = partition_of_message.get(meta.reply_to_message_id)
            if answered is not None:
                return None, f"answers the message sent to client {answered}, on another node"
            return None, "was sent no message this round"
        if sent[pid].metadata.message_id != meta.reply_to_message_id:
            answered = partition_of_message.get(meta.reply_to_message_id)
            if answered is not None:
                return None, f"(client {pid}'s node) answers the message sent to client {answered}"
            return None, f"(client {pid}'s node) answers no message of this round (another round's, or none)"
        return pid, ""

    def accept(
        self,
        server_round: int,
        replies: Iterable[Message],
        sent: Mapping[int, Message],
        problem_of: Callable[[int, Message], tuple[str | None, Any]],
        what: str = "reply",
    ) -> list[tuple[int, Message, Any]]:
        """(partition id, reply, its decoded form) of the replies ``screen`` credits whose ``problem_of(partition id,
        reply)`` gives (None, decoded form), in partition order; they become ``accepted``. The others are logged with
        their reason and ``rejected``: whatever ``problem_of`` raises is that reply's rejection (``raised``), never
        the end of the round."""
        usable = []
        for pid, reply in self.screen(server_round, replies, sent):
            try:
                problem, decoded = problem_of(pid, reply)
            except Exception as error:  # whatever one reply makes a check raise rejects that reply only
                problem, decoded = raised(error), None
            if problem:
                log(WARNING, "round %d: %s from client %d rejected: %s", server_round, what, pid, problem)
                self.rejected.append(pid)
                continue
            usable.append((pid, reply, decoded))
        self.accepted = [pid for pid, _, _ in usable]
        return usable

    def close(
        self, server_round: int, valid: int, min_reply_fraction: float, sent_bytes: Mapping[int, int] | None = None
    ) -> None:
        """Count sampled clients that never answered as failed; move the bytes sent to partitions whose node never
        answered (``sent_bytes``: partition id -> bytes) out of ``bytes_down``; fail the round below the minimum of
        valid replies."""
        silent = [pid for pid in self.sampled if pid not in self.answered]
        if silent:
            log(WARNING, "round %d: no reply from clients %s", server_round, silent)
        self.failed += silent
        self.unreached += silent
        for pid, size in (sent_bytes or {}).items():  # counted in bytes_down when sent; moved if never delivered
            if pid in self.unreached:
                self.bytes_down -= size
                self.bytes_down_unanswered += size
        if not self.sampled:
            raise RuntimeError(f"round {server_round}: no client to sample: no partition has a connected node")
        needed = math.ceil(min_reply_fraction * len(self.sampled))
        if valid < needed:
            raise RuntimeError(
                f"round {server_round}: {valid} valid replies of {len(self.sampled)} sampled "
                f"(min-reply-fraction={min_reply_fraction} needs {needed}); "
                f"failed: {self.failed}, rejected: {self.rejected}"
            )


def arrays_bytes(reply: Message, name: str) -> int:
    """Bytes of a reply's ArrayRecord ``name`` that arrived (0 for an error reply or one without it)."""
    if reply.has_error():
        return 0
    record = reply.content.array_records.get(name)
    return record.count_bytes() if isinstance(record, ArrayRecord) else 0


def round_totals(rounds: Mapping[int, RoundLog]) -> dict:
    """Run totals for summary.json: every failure and rejection counted once, bytes delivered and not."""
    return {
        "bytes_down": sum(r.bytes_down for r in rounds.values()),
        "bytes_down_unanswered": sum(r.bytes_down_unanswered for r in rounds.values()),
        "bytes_up": sum(r.bytes_up for r in rounds.values()),
        "accepted_replies": sum(len(r.accepted) for r in rounds.values()),
        "failed_replies": sum(len(r.failed) for r in rounds.values()),
        "rejected_replies": sum(len(r.rejected) for r in rounds.values()),
        "failed_by_partition": _per_partition(r.failed for r in rounds.values()),
        "rejected_by_partition": _per_partition(r.rejected for r in rounds.values()),
    }


def _per_partition(lists: Iterable[list[int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pids in lists:
        for pid in pids:
            counts[str(pid)] = counts.get(str(pid), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: int(item[0])))


# -- which nodes hold which partition, followed as nodes leave, join and rejoin -----------------------------------
def partition_query(node_id: int) -> Message:
    """The QUERY a node answers with its node config's partition-id and num-partitions (and budget, if set)."""
    return Message(RecordDict({"config": ConfigRecord({})}), message_type=MessageType.QUERY, dst_node_id=node_id)


def partition_info(reply: Message, num_partitions: int | None = None) -> dict:
    """A node's answer to ``partition_query``: {"node_id", "partition-id", "num-partitions", ...}. Raises ValueError
    naming the node and its values when the answer is malformed, or when ``num_partitions`` (the federation's) is
    given and the node's num-partitions or partition-id does not fit it."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        raise ValueError(f"SuperNode {node} did not answer the partition query: {reply.error.reason}")
    config = reply.content.config_records.get("config")
    info = dict(config) if config is not None else {}
    pid, num = info.get("partition-id"), info.get("num-partitions")
    for key, value in (("partition-id", pid), ("num-partitions", num)):
        if isinstance(value, bool):  # a bool is an int to Python, never a partition
            raise ValueError(f"SuperNode {node} answered {key}={value!r}: a bool, its node-config needs an integer")
    if not (isinstance(pid, int) and isinstance(num, int) and 0 <= pid < num):
        raise ValueError(
            f"SuperNode {node} answered partition-id={pid!r}, num-partitions={num!r}: its node-config "
            f"needs integers with 0 <= partition-id < num-partitions"
        )
    if num_partitions is not None and num != num_partitions:
        raise ValueError(
            f"SuperNode {node} (partition-id={pid}) has num-partitions={num} in its node-config, but "
            f"this federation has {num_partitions} partitions (0..{num_partitions - 1}): "
            f"start it with num-partitions={num_partitions}"
        )
    return {**info, "node_id": node}


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
            pid = info["partition-id"]
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
