"""What the server and every client derive identically from the run config and the seed.

Supernet, subnet cache, client budgets, the server's held-out splits and each client's partition. Clients rebuild
their partition locally (no data crosses the wire), so both sides must call the same functions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fl_app.data.images import DATASETS, ImageData, Splits, load_dataset, split_train
from fl_app.data.partition import draw_budgets, make_partitioner, partition_indices
from fl_app.models.supernet_space import SupernetConfig, count_costs, load_supernet_config
from fl_app.run.config import MAX_MODEL_BYTES, RunConfig
from fl_app.supernet.subnets import SubnetCache

# Tiers are written as rounded MACs (596e6 names the paper cache's largest subnet, 595.7M MACs at 100 classes): a
# tier this far (relative) outside the cached range still names the subnet at that end.
TIER_ROUNDING = 0.01


@dataclass
class Federation:
    """The supernet family's federation as the run config and the seed define it, identical on the server and every
    client (``build``): the supernet, its subnet cache, every partition's drawn budget and the supernet's MACs.
    ``client_budgets`` turns it into the run's budgets (a node's declared ``budget-macs`` wins) and ``tiers`` into the
    reporting tiers; both refuse, before training, what the federation cannot serve."""

    cfg: SupernetConfig
    cache: SubnetCache
    budgets: np.ndarray  # drawn budget of every partition id
    num_partitions: int
    supernet_macs: int  # MACs of the whole supernet (its largest subnet): no budget is useful beyond it

    @property
    def budget_range(self) -> tuple[int, int]:
        """The budgets a client may have: the smallest cached subnet (a client must run one) .. the whole supernet
        (a larger budget trains nothing larger, only takes more of the γ-allocated rows)."""
        return self.cache.min_macs, self.supernet_macs

    @staticmethod
    def build(run: RunConfig, num_partitions: int) -> "Federation":
        cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
        supernet_macs, supernet_params = count_costs(cfg, cfg.max_subnet())
        if 4 * supernet_params > MAX_MODEL_BYTES:  # counted, not built: nothing is allocated yet
            raise ValueError(
                f"supernet='{run['supernet']}': its largest subnet holds {supernet_params:,} float32 parameters "
                f"({4 * supernet_params / 2**30:.4g} GiB), beyond the {MAX_MODEL_BYTES / 2**30:g} GiB ceiling on "
                "one model; allowed: a supernet JSON with smaller widths, depths or expansion ratios"
            )
        cache = SubnetCache.load(cfg, run.subnet_cache)
        low, high = cache.min_macs, supernet_macs
        max_budget = run["budget-max-macs"] or cache.max_macs
        if not low <= max_budget <= high:
            side = f"below the smallest cached subnet ({low} MACs)" if max_budget < low else "above the whole supernet"
            raise ValueError(
                f"budget-max-macs={max_budget:.0f} is {side}; allowed: 0 for the largest cached subnet, or a number "
                f"in [{low}, {high}] MACs (the smallest cached subnet .. the whole supernet '{cfg.name}')"
            )
        budgets = draw_budgets(
            num_partitions, cache.min_macs, max_budget, run["budget-zipf-a"], run["seed"], run["budget-levels"]
        )
        return Federation(cfg, cache, budgets, num_partitions, supernet_macs)

    def client_budgets(
        self, run: RunConfig, declared: dict[int, object], node_of_partition: dict[int, int] | None = None
    ) -> dict[int, float]:
        """Budget per partition id: a node's declared ``budget-macs`` (node config) wins over the drawn one.

        Raises before training when the federation cannot serve the run config, or when a declared budget is not a
        finite number in ``budget_range`` (naming the node, from ``node_of_partition``, and the key): a budget is
        the node's own claim, and beyond the supernet it would only take the γ-allocation's rows from the others."""
        run.clients_per_round(self.num_partitions)
        low, high = self.budget_range
        for pid, value in sorted(declared.items()):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high):
                who = f"partition-id={pid}"
                if node_of_partition is not None:
                    who = f"SuperNode {node_of_partition[pid]} ({who})"
                shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
                raise ValueError(
                    f"{who} declared budget-macs={shown} in its node-config; allowed: a number "
                    f"in [{low}, {high}] MACs (the smallest cached subnet .. the whole supernet '{self.cfg.name}')"
                )
        return {pid: float(declared.get(pid, self.budgets[pid])) for pid in range(self.num_partitions)}

    def tiers(self, run: RunConfig):
        """The reporting tiers: the cached subnet each tier names. A tier outside the cached range (beyond
        ``TIER_ROUNDING``), or two tiers naming the same cached subnet, would report other or fewer tiers than the
        run config lists: refused before training."""
        targets = run.tier_targets
        low, high = self.cache.min_macs, self.cache.max_macs
        for target in targets:
            if not low * (1 - TIER_ROUNDING) <= target <= high * (1 + TIER_ROUNDING):
                side = "below the smallest" if target < low else "above the largest"
                raise ValueError(
                    f"tiers: {target:.0f} MACs is {side} cached subnet ({low if target < low else high} MACs); "
                    f"allowed: MACs in [{low}, {high}] (the cached subnets' range)"
                )
        named: dict[int, float] = {}
        for target in targets:
            subnet = self.cache.nearest(target)
            if subnet.macs in named:
                raise ValueError(
                    f"tiers: {named[subnet.macs]:.0f} and {target:.0f} MACs both name the cached subnet of "
                    f"{subnet.macs} MACs; allowed: one tier per cached subnet"
                )
            named[subnet.macs] = target
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
