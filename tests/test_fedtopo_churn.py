"""FedTopo-family runs in a deployment whose nodes come and go: a partition whose node is gone is neither sampled
nor asked to evaluate while it is away, and a node that rejoins under a new node id is asked its partition and used
again (the same ``LiveNodes`` bookkeeping as the supernet strategies)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import MessageType

from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from fl_app.run.config import validate_run_config
from tests.hostile import answered_queries

TINY = {
    "num-server-rounds": 4,
    "clients-per-round": 3,
    "max-local-steps": 1,
    "batch-size": 16,
    "eval-every": 1,
    "proto-max-samples": 32,
    "test-fraction": 0.05,
}


class ChurningGrid(InProcessGrid):
    """Partition 1's node (101) leaves after round 1 and comes back as node 201 before round 4 (changes happen
    between rounds: after a round's evaluation, before the next round's training is configured)."""

    def __init__(self, run, num_clients):
        super().__init__(run, num_clients)
        self.round, self.queries, self.delivered = 0, {}, []
        self.between_rounds = True  # False from a round's training until its evaluation went out

    def get_node_ids(self):
        if self.between_rounds and self.round == 1:
            self.partition_of_node.pop(101, None)
        if self.between_rounds and self.round == 3:
            self.partition_of_node[201] = 1
        return list(self.partition_of_node)

    def push_messages(self, messages):  # the partition query a new node answers
        answers = answered_queries(messages, lambda node: (self.partition_of_node[node], self.num_clients))
        self.queries.update(answers)
        return list(answers)

    def pull_messages(self, ids):
        return [self.queries.pop(mid) for mid in list(ids) if mid in self.queries]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == MessageType.TRAIN:
            self.round += 1
        self.between_rounds = bool(messages) and messages[0].metadata.message_type == MessageType.EVALUATE
        for msg in messages:
            self.delivered.append((self.round, msg.metadata.message_type, msg.metadata.dst_node_id))
        return super().send_and_receive(messages, timeout)


@pytest.mark.parametrize("method", ["fedtopo", "fedproto"])
def test_gone_nodes_are_skipped_and_rejoined_nodes_used(tmp_path, method):
    torch.set_num_threads(1)
    run = validate_run_config({**TINY, "method": method, "output-dir": str(tmp_path / method)})
    grid = ChurningGrid(run, 3)
    summary = run_in_process(run, 3, grid)

    def nodes(server_round, kind):
        return sorted(node for r, k, node in grid.delivered if r == server_round and k == kind)

    assert [nodes(r, MessageType.TRAIN) for r in (1, 2, 3, 4)] == [
        [100, 101, 102],
        [100, 102],
        [100, 102],
        [100, 102, 201],
    ]
    assert [nodes(r, MessageType.EVALUATE) for r in (1, 2, 3, 4)] == [
        [100, 101, 102],
        [100, 102],
        [100, 102],
        [100, 102, 201],
    ]
    # nobody was counted as failed for being away, and the run completed with every round evaluated
    assert summary["completed"] and summary["failed_replies"] == 0 and summary["failed_evaluations"] == 0
    assert [h["round"] for h in summary["history"]] == [1, 2, 3, 4]
