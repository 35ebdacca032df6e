"""Drive a run of any method in one process, without Ray or SuperNodes (tests and experiments): the app's own server
run and client functions (``fl_app.server_app.SERVER_RUNS``, ``fl_app.client_app.CLIENT_TRAINING`` and
``CLIENT_EVALUATION``) exchange messages through ``InProcessGrid``, which hands each message to the client function
of its partition. What a Flower runtime would set on the messages is set by ``experiments.runner.flower_internals``;
what only Flower does (serialising the messages, Ray's actors, the SuperNodes' node configs) the `flwr run` tests
cover."""

from __future__ import annotations

from flwr.app import Context, MessageType, RecordDict

from experiments.runner.flower_internals import message_identity, set_reply_source
from fl_app.client_app import CLIENT_EVALUATION, CLIENT_TRAINING
from fl_app.run.config import RunConfig
from fl_app.server_app import SERVER_RUNS


class InProcessGrid:
    """A Grid stand-in that delivers each message to its partition's client function for the run's method, in
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
        method, replies = self.run["method"], []
        for msg in messages:
            pid = self.partition_of_node[msg.metadata.dst_node_id]
            evaluate = msg.metadata.message_type == MessageType.EVALUATE
            handler = CLIENT_EVALUATION[method] if evaluate else CLIENT_TRAINING[method]
            reply = handler(msg, self.run, pid, self.num_clients, self.contexts[pid])
            set_reply_source(reply, msg.metadata.dst_node_id)
            replies.append(reply)
        return replies


def run_in_process(run: RunConfig, num_clients: int, grid: InProcessGrid | None = None) -> dict:
    """The run's summary, as the ServerApp's run of its method returns it (its result files written as in a
    `flwr run`)."""
    grid = grid or InProcessGrid(run, num_clients)
    with message_identity():
        return SERVER_RUNS[run["method"]](grid, run, grid.nodes())
