"""Drive a model-heterogeneous run in one process, without Ray or SuperNodes (tests and experiments): the app's own
strategy and client functions (``fl_app.multiarch_app``) exchange messages through ``InProcessGrid``, which hands each
message to the client function of its partition. What a Flower runtime would set on the messages is set by
``experiments.runner.flower_internals``."""

from __future__ import annotations

from flwr.app import Context, MessageType, RecordDict

from experiments.runner.flower_internals import message_identity, set_reply_source
from fl_app.multiarch_app import evaluate_multiarch, run_multiarch, train_multiarch
from fl_app.run.config import RunConfig


class InProcessGrid:
    """A Grid stand-in that delivers each message to ``train_multiarch`` / ``evaluate_multiarch`` of its partition, in
    order, with one persistent ``Context`` per node (as a SuperNode keeps one per run)."""

    def __init__(self, run: RunConfig, num_clients: int, first_node_id: int = 100):
        self.run, self.num_clients = run, num_clients
        self.node_of_partition = {pid: first_node_id + pid for pid in range(num_clients)}
        self.partition_of_node = {n: p for p, n in self.node_of_partition.items()}
        self.contexts = {
            pid: Context(
                run_id=1,
                node_id=node,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": pid, "num-partitions": num_clients},
            )
            for pid, node in self.node_of_partition.items()
        }

    def nodes(self) -> dict[int, dict]:
        return {pid: {"node_id": node} for pid, node in self.node_of_partition.items()}

    def get_node_ids(self):
        return list(self.partition_of_node)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            pid = self.partition_of_node[msg.metadata.dst_node_id]
            handler = evaluate_multiarch if msg.metadata.message_type == MessageType.EVALUATE else train_multiarch
            reply = handler(msg, self.run, pid, self.num_clients, self.contexts[pid])
            set_reply_source(reply, msg.metadata.dst_node_id)
            replies.append(reply)
        return replies


def run_in_process(run: RunConfig, num_clients: int, grid: InProcessGrid | None = None) -> dict:
    grid = grid or InProcessGrid(run, num_clients)
    with message_identity():
        return run_multiarch(grid, run, grid.nodes())
