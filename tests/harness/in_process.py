"""In-process runs of the FedTopo family for tests (``experiments.runner.in_process_grid``): the smallest settings
that still exercise a whole run, and a grid whose server dies in a chosen round."""

from __future__ import annotations

from flwr.app import MessageType

from experiments.runner.in_process_grid import InProcessGrid

# three rounds of two clients, one local step of 8 images, a few prototypes and a 5% test split: seconds on a CPU
TINY_RUN = {
    "num-server-rounds": 3,
    "clients-per-round": 2,
    "max-local-steps": 1,
    "batch-size": 8,
    "eval-every": 2,
    "proto-max-samples": 16,
    "test-fraction": 0.05,
}


class CrashingGrid(InProcessGrid):
    """The server process dies when it sends round ``crash_round``'s training messages (None: it never does)."""

    def __init__(self, run, num_clients: int, crash_round: int | None = None):
        super().__init__(run, num_clients)
        self.crash_round = crash_round

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if any(
            m.metadata.message_type == MessageType.TRAIN
            and m.content.config_records["config"]["server-round"] == self.crash_round
            for m in messages
        ):
            raise RuntimeError("the server died")
        return super().send_and_receive(messages, timeout)
