"""How a server finds its SuperNodes: each node answers a partition query with its partition id (and optional
budget); the answers must form one federation of partitions 0..N-1."""

from __future__ import annotations

import time

from flwr.app import Message
from flwr.serverapp import Grid

from fl_app.run.node_query import NODE_ID, NUM_PARTITIONS, PARTITION_ID, partition_info, partition_query


def discover_nodes(grid: Grid, timeout: float = 60.0, while_waiting=None, settle: float = 1.0) -> dict[int, dict]:
    """Ask every connected node for its partition id (and optional budget); returns partition id -> info.

    The queries go out as soon as a node is seen; ``while_waiting()`` (the server's own preparation) runs while the
    nodes start their ClientApps and answer. Nodes that connect later are asked too, until every query is answered
    and no new node has appeared for ``settle`` seconds (SuperNodes of a deployment connect one by one).
    ``timeout`` bounds the wait for a first node and, counted after the preparation, the wait for the answers."""
    deadline = time.time() + timeout
    while not grid.get_node_ids() and time.time() < deadline:  # in a deployment SuperNodes may still be connecting
        time.sleep(0.2)
    asked: set[int] = set()
    pending: set[str] = set()  # ids of queries without a reply yet (a pulled reply is gone from the grid)
    replies: list[Message] = []

    last_new = time.time()

    def ask_new_nodes() -> None:
        nonlocal last_new
        new = sorted(set(grid.get_node_ids()) - asked)
        if new:
            asked.update(new)
            last_new = time.time()
            pending.update(grid.push_messages([partition_query(n) for n in new]))

    ask_new_nodes()
    if not asked:
        raise RuntimeError("no SuperNode connected")
    if while_waiting is not None:
        while_waiting()
    deadline = time.time() + timeout  # many simulated nodes share few actors: answers may take a while
    while time.time() < deadline:
        ask_new_nodes()
        pulled = list(grid.pull_messages(pending)) if pending else []
        pending.difference_update(reply.metadata.reply_to_message_id for reply in pulled)
        replies += pulled
        if not pending and time.time() - last_new >= settle:
            break
        time.sleep(0.1)
    nodes = {}
    for reply in replies:
        info = partition_info(reply)
        pid = info[PARTITION_ID]
        if pid in nodes:
            raise ValueError(f"two SuperNodes claim partition-id={pid} (node-config)")
        nodes[pid] = info
    if len(nodes) < len(asked):
        raise RuntimeError(
            f"{len(asked) - len(nodes)} of {len(asked)} nodes did not answer the partition query within {timeout:.0f}s"
        )
    return nodes


def check_federation(nodes: dict[int, dict]) -> None:
    """The SuperNodes that answered must hold partitions 0..N-1 of one federation of N: each one's num-partitions
    is N (a node set up for another federation would train on the wrong rows)."""
    n = len(nodes)
    if sorted(nodes) != list(range(n)):
        raise ValueError(f"partition-id values {sorted(nodes)} must be 0..{n - 1} (node-config)")
    for pid, info in sorted(nodes.items()):
        if info[NUM_PARTITIONS] != n:
            raise ValueError(
                f"SuperNode {info[NODE_ID]} (partition-id={pid}) has num-partitions="
                f"{info[NUM_PARTITIONS]} in its node-config, but {n} SuperNodes answered (partition-id "
                f"0..{n - 1}): every SuperNode needs num-partitions={n}"
            )
