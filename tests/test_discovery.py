"""Node discovery: partition queries go out at once, the server prepares meanwhile, late nodes are asked too; a
partition answer is ints, never bools; a node that never answers is asked once while it stays connected."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import Error

from experiments.runner.flower_internals import set_message_id, set_reply_source
from fl_app.node_discovery import check_federation, discover_nodes
from fl_app.run.node_query import partition_answer, partition_info, partition_query
from strategies.rounds import LiveNodes


class SlowGrid:
    """Nodes answer one reply per pull; a reply, once pulled, is gone (asking for it again is an error), as on
    Flower's grids. ``late`` nodes connect while the server prepares."""

    def __init__(self, nodes: dict[int, int], late: dict[int, int] | None = None, latest: dict[int, int] | None = None):
        self.nodes, self.late, self.latest = dict(nodes), dict(late or {}), dict(latest or {})
        self.waiting: dict[str, Message] = {}
        self.delivered: set[str] = set()

    def connect_late_nodes(self):
        self.nodes.update(self.late)

    def get_node_ids(self):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 4:  # one more node connects while the answers come in
            self.nodes.update(self.latest)
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = f"q{msg.metadata.dst_node_id}"
            set_message_id(msg, mid)
            reply = partition_answer(msg, self.nodes[msg.metadata.dst_node_id], 4)
            set_reply_source(reply, msg.metadata.dst_node_id)
            self.waiting[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        out = []
        for mid in ids:
            if mid in self.delivered:
                gone = Message(error=Error(3, "Message Unavailable"), reply_to=self.waiting[mid])
                out.append(gone)
            elif mid in self.waiting and not out:
                self.delivered.add(mid)
                out.append(self.waiting[mid])
        return out


def test_every_node_is_found_across_several_pulls_and_late_nodes_are_asked(flower_ids):
    grid = SlowGrid({10: 0, 11: 1}, late={12: 2}, latest={13: 3})
    prepared = []
    nodes = discover_nodes(
        grid, timeout=10, settle=0.5, while_waiting=lambda: (prepared.append(True), grid.connect_late_nodes())
    )
    assert prepared == [True]
    assert {pid: info["node_id"] for pid, info in nodes.items()} == {0: 10, 1: 11, 2: 12, 3: 13}


def test_two_nodes_claiming_one_partition_are_refused(flower_ids):
    with pytest.raises(ValueError, match="two SuperNodes claim partition-id=0"):
        discover_nodes(SlowGrid({10: 0, 11: 0}), timeout=10)


def test_a_supernode_of_another_federation_size_is_refused_by_name(flower_ids):
    nodes = discover_nodes(SlowGrid({10: 0, 11: 1}), timeout=10, settle=0.2)  # both say num-partitions=4
    with pytest.raises(
        ValueError,
        match=r"SuperNode 10 \(partition-id=0\) has num-partitions=4 .* 2 SuperNodes "
        r"answered .* every SuperNode needs num-partitions=2",
    ):
        check_federation(nodes)
    check_federation({0: {"node_id": 10, "num-partitions": 2}, 1: {"node_id": 11, "num-partitions": 2}})


def test_a_malformed_partition_answer_names_the_node(flower_ids):
    grid = SlowGrid({10: 0})
    grid.nodes[10] = -1
    with pytest.raises(ValueError, match=r"SuperNode 10 answered partition-id=-1, num-partitions=4"):
        discover_nodes(grid, timeout=10, settle=0.2)


@pytest.mark.parametrize("key", ["partition-id", "num-partitions"])
def test_a_bool_partition_answer_is_refused_naming_the_field(flower_ids, key):
    grid = SlowGrid({10: 1})
    query = partition_query(10)
    set_message_id(query, "q10")
    answer = {"partition-id": 1, "num-partitions": 4, key: True}  # True == 1 to Python: it must not be partition 1
    reply = Message(RecordDict({"config": ConfigRecord(answer)}), reply_to=query)
    set_reply_source(reply, 10)
    with pytest.raises(ValueError, match=rf"SuperNode 10 answered {key}=True: a bool, .* needs an integer"):
        partition_info(reply)
    grid.nodes[10] = True
    with pytest.raises(ValueError, match=r"partition-id=True: a bool"):
        discover_nodes(grid, timeout=10, settle=0.2)


class SilentNodeGrid:
    """Nodes 10 and 11 hold partitions 0 and 1; node 12 is connected but never answers its partition query."""

    def __init__(self):
        self.connected, self.queried = [10, 11, 12], []

    def get_node_ids(self):
        return list(self.connected)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            self.queried.append(msg.metadata.dst_node_id)
            ids.append(f"q{msg.metadata.dst_node_id}-{len(self.queried)}")
        return ids

    def pull_messages(self, ids):
        return []  # node 12 never answers


def test_a_node_that_never_answers_is_queried_once_while_connected_and_counted_failed(flower_ids):
    nodes = LiveNodes({0: 10, 1: 11}, num_partitions=2, query_timeout=0.0)
    grid = SilentNodeGrid()
    assert [nodes.refresh(grid, r) for r in (1, 2, 3)] == [[0, 1]] * 3
    assert grid.queried == [12]  # asked once across three rounds, not once per round
    assert nodes.failed_queries == 1 and nodes.silent == {12}
    grid.connected = [10, 11]  # it leaves ...
    nodes.refresh(grid, 4)
    grid.connected = [10, 11, 12]  # ... and returns: a membership change, asked again
    nodes.refresh(grid, 5)
    nodes.refresh(grid, 6)
    assert grid.queried == [12, 12] and nodes.failed_queries == 2


def test_the_client_apps_answer_reads_back_as_its_node_config(flower_ids):
    """The query's two sides in one protocol (``fl_app.run.node_query``): what the ClientApp's query handler answers
    from its node config is what the server reads, budget included."""
    from flwr.app import Context

    from fl_app.client_app import query as answer_query

    node_config = {"partition-id": 2, "num-partitions": 4, "budget-macs": 3e6}
    message = partition_query(12)
    set_message_id(message, "q12")
    context = Context(run_id=1, node_id=12, node_config=node_config, state=RecordDict(), run_config={})
    reply = answer_query(message, context)
    set_reply_source(reply, 12)
    assert partition_info(reply, 4) == {**node_config, "node_id": 12}
    without_budget = Context(
        run_id=1, node_id=12, node_config={"partition-id": 2, "num-partitions": 4}, state=RecordDict(), run_config={}
    )
    reply = answer_query(message, without_budget)
    set_reply_source(reply, 12)
    assert partition_info(reply) == {"partition-id": 2, "num-partitions": 4, "node_id": 12}
