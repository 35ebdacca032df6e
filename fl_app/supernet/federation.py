"""What the server and every client derive identically from the run config and the seed.

Supernet, subnet cache, client budgets, the server's held-out splits and each client's partition. Clients rebuild
their partition locally (no data crosses the wire), so both sides must call the same functions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fl_app.data.images import DATASETS, ImageData, Splits, load_dataset, split_train
from fl_app.data.partition import make_partitioner, partition_indices
from fl_app.run.config import RunConfig
from fl_app.supernet.space import SupernetConfig, load_supernet_config
from fl_app.supernet.subnets import SubnetCache, draw_budgets


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
            raise ValueError(
                f"budget-max-macs={max_budget:.0f} is below the smallest cached subnet "
                f"({cache.min_macs} MACs); allowed: >= {cache.min_macs} or 0 for the cache maximum"
            )
        budgets = draw_budgets(
            num_partitions, cache.min_macs, max_budget, run["budget-zipf-a"], run["seed"], run["budget-levels"]
        )
        return Federation(cfg, cache, budgets, num_partitions)

    def client_budgets(self, run: RunConfig, declared: dict[int, float]) -> dict[int, float]:
        """Budget per partition id: a node's declared ``budget-macs`` (node config) wins over the drawn one.

        Raises before training when the federation cannot serve the run config."""
        run.clients_per_round(self.num_partitions)
        budgets = {pid: float(declared.get(pid, self.budgets[pid])) for pid in range(self.num_partitions)}
        for pid, budget in budgets.items():
            if budget < self.cache.min_macs:
                raise ValueError(
                    f"budget-macs={budget:.0f} of partition {pid} is below the smallest cached "
                    f"subnet ({self.cache.min_macs} MACs); allowed: >= {self.cache.min_macs}"
                )
        return budgets

    def tiers(self, run: RunConfig):
        targets = run.tier_targets
        if targets and min(targets) < self.cache.min_macs:
            raise ValueError(
                f"tiers: {min(targets):.0f} MACs is below the smallest cached subnet ({self.cache.min_macs} MACs)"
            )
        return self.cache.tiers(targets)


def dataset_for(run: RunConfig, cfg: SupernetConfig) -> tuple[ImageData, ImageData]:
    return load_dataset(run["dataset"], run["data-source"], run["data-path"], cfg.initial_input_hw)


def server_splits(run: RunConfig, train: ImageData) -> Splits:
    return split_train(train.labels.numpy(), run["val-size"], run["calib-size"], run["seed"])


def pool_partitions(run: RunConfig, labels: np.ndarray, budgets) -> tuple[np.ndarray, ...]:
    """Row indices into the training set of every client's partition, given the training labels and every
    partition's budget (the γ-allocation's input): the client pool left after the server's held-out splits, split by
    the run's partitioner."""
    pool = split_train(labels, run["val-size"], run["calib-size"], run["seed"]).client_pool
    partitioner = make_partitioner(
        run["partitioner"],
        len(budgets),
        run["seed"],
        run["dirichlet-alpha"],
        run["gamma"],
        np.asarray(budgets, dtype=float),
        run["max-training-macs"],
    )
    return tuple(pool[idx] for idx in partition_indices(labels[pool], partitioner))


@lru_cache(maxsize=2)
def _all_partitions(run_items: tuple, num_partitions: int, budgets: tuple | None) -> tuple[np.ndarray, ...]:
    run = RunConfig(dict(run_items))
    fed = Federation.build(run, num_partitions)
    train, _ = dataset_for(run, fed.cfg)
    return pool_partitions(run, train.labels.numpy(), fed.budgets if budgets is None else budgets)


def partition_rows(run: RunConfig, num_partitions: int, budgets=None) -> tuple[np.ndarray, ...]:
    """Row indices into the training set of every client's partition (cached per process).

    ``budgets``: every partition's budget, declared where a node declared one (``Federation.client_budgets``); the
    drawn budgets when None. Server and clients must pass the same ones (the server sends them with each round)."""
    key = None if budgets is None else tuple(float(b) for b in budgets)
    if key is not None and len(key) != num_partitions:
        raise ValueError(f"partition-budgets: {len(key)} values for {num_partitions} partitions")
    return _all_partitions(tuple(sorted(run.values.items())), num_partitions, key)


def client_data(run: RunConfig, partition_id: int, num_partitions: int, budgets=None) -> ImageData:
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    train, _ = dataset_for(run, cfg)
    return train.subset(partition_rows(run, num_partitions, budgets)[partition_id])
