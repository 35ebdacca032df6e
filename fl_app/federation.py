"""What the server and every client derive identically from the run config and the seed.

Supernet, subnet cache, client budgets, the server's held-out splits and each client's partition. Clients rebuild
their partition locally (no data crosses the wire), so both sides must call the same functions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fl_app.config import RunConfig
from fl_app.data import DATASETS, ImageData, Splits, load_dataset, split_train
from fl_app.partition import make_partitioner, partition_indices
from fl_app.subnets import SubnetCache, draw_budgets
from fl_app.supernet import SupernetConfig, load_supernet_config


@dataclass
class Federation:
    cfg: SupernetConfig
    cache: SubnetCache
    budgets: np.ndarray  # drawn budget of every partition id
    num_partitions: int

    @staticmethod
    def build(run: RunConfig, num_partitions: int) -> "Federation":
        cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
        cache = SubnetCache.load(cfg, run.subnet_cache)
        max_budget = run["budget-max-macs"] or cache.max_macs
        if max_budget < cache.min_macs:
            raise ValueError(f"budget-max-macs={max_budget:.0f} is below the smallest cached subnet "
                             f"({cache.min_macs} MACs); allowed: >= {cache.min_macs} or 0 for the cache maximum")
        budgets = draw_budgets(num_partitions, cache.min_macs, max_budget, run["budget-zipf-a"], run["seed"],
                               run["budget-levels"])
        return Federation(cfg, cache, budgets, num_partitions)

    def client_budgets(self, run: RunConfig, declared: dict[int, float]) -> dict[int, float]:
        """Budget per partition id: a node's declared ``budget-macs`` (node config) wins over the drawn one.

        Raises before training when the federation cannot serve the run config."""
        run.clients_per_round(self.num_partitions)
        budgets = {pid: float(declared.get(pid, self.budgets[pid])) for pid in range(self.num_partitions)}
        for pid, budget in budgets.items():
            if budget < self.cache.min_macs:
                raise ValueError(f"budget-macs={budget:.0f} of partition {pid} is below the smallest cached "
                                 f"subnet ({self.cache.min_macs} MACs); allowed: >= {self.cache.min_macs}")
        return budgets

    def tiers(self, run: RunConfig):
        targets = run.tier_targets
        if targets and min(targets) < self.cache.min_macs:
            raise ValueError(f"tiers: {min(targets):.0f} MACs is below the smallest cached subnet "
                             f"({self.cache.min_macs} MACs)")
        return self.cache.tiers(targets)


def dataset_for(run: RunConfig, cfg: SupernetConfig) -> tuple[ImageData, ImageData]:
    return load_dataset(run["dataset"], run["data-source"], run["data-path"], cfg.initial_input_hw)


def server_splits(run: RunConfig, train: ImageData) -> Splits:
    return split_train(train.labels.numpy(), run["val-size"], run["calib-size"], run["seed"])


@lru_cache(maxsize=2)
def _all_partitions(run_items: tuple, num_partitions: int) -> tuple[np.ndarray, ...]:
    run = RunConfig(dict(run_items))
    fed = Federation.build(run, num_partitions)
    train, _ = dataset_for(run, fed.cfg)
    pool = server_splits(run, train).client_pool
    partitioner = make_partitioner(run["partitioner"], num_partitions, run["seed"], run["dirichlet-alpha"],
                                   run["gamma"], fed.budgets, run["max-training-macs"])
    return tuple(pool[idx] for idx in partition_indices(train.labels.numpy()[pool], partitioner))


def partition_rows(run: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Row indices into the training set of every client's partition (cached per process)."""
    return _all_partitions(tuple(sorted(run.values.items())), num_partitions)


def client_data(run: RunConfig, partition_id: int, num_partitions: int) -> ImageData:
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    train, _ = dataset_for(run, cfg)
    return train.subset(partition_rows(run, num_partitions)[partition_id])
