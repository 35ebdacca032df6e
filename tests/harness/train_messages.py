"""The config of every round-1 TRAIN message a supernet-family method's server sends, for a small federation: what
``tests/test_train_message.py`` compares with the recorded ``tests/data/supernet_train_configs.json``."""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord

NUM = 4
# every supernet method, and the run-config values that change what its messages say
CASES = {
    "feast": {},
    "feast-unrouted": {"method": "feast", "routing": False},
    "superfednas": {},
    "deepfednas": {},
    "heterofl": {},
    "fedrolex": {},
    "scalefl": {},
    "scalefl-reference": {"method": "scalefl", "scalefl-levels": "reference"},
    "fiarse": {},
    "fiarse-reference": {"method": "fiarse", "fiarse-mapping": "reference"},
    "fedavg-min": {},
}


def train_configs(case: str) -> dict[str, dict]:
    """Partition id (as text) -> the config record of its round-1 TRAIN message, every partition sampled."""
    from fl_app.run.config import validate_run_config
    from fl_app.run.payload import state_to_record
    from fl_app.supernet.shared_setup import SupernetSetup
    from fl_app.supernet_app import make_supernet_strategy

    run = validate_run_config({"method": case, "clients-per-round": NUM, "max-local-steps": 1, **CASES[case]})
    setup = SupernetSetup.build(run, NUM)
    node_of_partition = {p: 100 + p for p in range(NUM)}
    strategy = make_supernet_strategy(run, setup, setup.client_budgets(run, {}), node_of_partition)
    torch.manual_seed(0)  # FIARSE's thresholds depend on the initial weights
    state = {
        k: v.numpy() for k, v in strategy.global_model().state_dict().items() if not k.endswith("num_batches_tracked")
    }
    messages = strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)
    partition_of_node = {node: p for p, node in node_of_partition.items()}
    return {str(partition_of_node[m.metadata.dst_node_id]): dict(m.content.config_records["config"]) for m in messages}
