"""What the server and every client derive identically from the run config and the seed.

Supernet, subnet cache, client budgets, the server's held-out splits and each client's partition. Clients rebuild
their partition locally (no data crosses the wire), so both sides must call the same functions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fl_app.data.images import DATASETS, ImageData, Splits, load_dataset, split_train, stratified_holdout
from fl_app.data.partition import draw_budgets, make_partitioner, partition_indices
from fl_app.models.supernet_space import SupernetConfig, count_costs, load_supernet_config
from fl_app.run.config import MAX_MACS, MAX_MODEL_BYTES, RunConfig
from fl_app.supernet.subnets import SubnetCache

# Tiers are written as rounded MACs (596e6 names the paper cache's largest subnet, 595.7M MACs at 100 classes): a
# tier this far (relative) outside the cached range still names the subnet at that end.
TIER_ROUNDING = 0.01
# A budget above the whole supernet is a device stronger than the model (the reference's normal case): it runs the
# whole supernet. Beyond this many times the supernet a budget is a typo, not a device: refused.
MAX_BUDGET_FACTOR = 1e6


@dataclass
class SupernetSetup:
    """The supernet family's shared setup as the run config and the seed define it, identical on the server and every
    client (``build``): the supernet, its subnet cache, every partition's drawn budget and the supernet's MACs.
    ``client_budgets`` turns it into the run's budgets (a node's declared ``budget-macs`` wins) and ``tiers`` into the
    reporting tiers; both refuse, before training, what the setup cannot serve."""

    cfg: SupernetConfig
    cache: SubnetCache
    budgets: np.ndarray  # drawn budget of every partition id
    num_partitions: int
    supernet_macs: int  # MACs of the whole supernet (its largest subnet): a larger budget runs nothing larger

    @property
    def budget_range(self) -> tuple[int, float]:
        """The budgets a client may have: the smallest cached subnet (a client must run one) .. ``MAX_BUDGET_FACTOR``
        times the whole supernet (a budget above the supernet trains and is scored with the whole supernet and counts
        as the supernet in the γ shares: ``data_budgets``)."""
        return self.cache.min_macs, min(MAX_BUDGET_FACTOR * self.supernet_macs, MAX_MACS)

    def range_text(self) -> str:
        low, high = self.budget_range
        return (
            f"[{low}, {high:.6g}] MACs (the smallest cached subnet .. {MAX_BUDGET_FACTOR:g} x the whole supernet "
            f"'{self.cfg.name}' of {self.supernet_macs} MACs; a budget above the supernet runs the whole supernet)"
        )

    def data_budgets(self, budgets) -> np.ndarray:
        """The budgets the γ-allocation splits the rows by: a budget above the whole supernet counts as the supernet
        (it trains nothing larger), then ``max-training-macs`` caps them further where set."""
        return np.minimum(np.asarray(budgets, dtype=float), float(self.supernet_macs))

    @staticmethod
    def build(run: RunConfig, num_partitions: int) -> "SupernetSetup":
        cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
        supernet_macs, supernet_params = count_costs(cfg, cfg.max_subnet())
        if 4 * supernet_params > MAX_MODEL_BYTES:  # counted, not built: nothing is allocated yet
            raise ValueError(
                f"supernet='{run['supernet']}': its largest subnet holds {supernet_params:,} float32 parameters "
                f"({4 * supernet_params / 2**30:.4g} GiB), beyond the {MAX_MODEL_BYTES / 2**30:g} GiB ceiling on "
                "one model; allowed: a supernet JSON with smaller widths, depths or expansion ratios"
            )
        cache = SubnetCache.load(cfg, run.subnet_cache)
        setup = SupernetSetup(cfg, cache, np.empty(0), num_partitions, supernet_macs)
        low, high = setup.budget_range
        key, max_budget = "budget-max-macs", run["budget-max-macs"] or cache.max_macs
        if run["budget-max-factor"]:  # the reference's spread: budgets up to k x the whole model
            key, max_budget = "budget-max-factor", run["budget-max-factor"] * supernet_macs
        if not low <= max_budget <= high:
            side = f"below the smallest cached subnet ({low} MACs)" if max_budget < low else "too large"
            raise ValueError(
                f"{key}={run[key]:g} gives a largest budget of {max_budget:.0f} MACs, {side}; allowed: 0 (the "
                f"largest cached subnet) or a largest budget in {setup.range_text()}"
            )
        setup.budgets = draw_budgets(
            num_partitions, cache.min_macs, max_budget, run["budget-zipf-a"], run["seed"], run["budget-levels"]
        )
        return setup

    def client_budgets(
        self, run: RunConfig, declared: dict[int, object], node_of_partition: dict[int, int] | None = None
    ) -> dict[int, float]:
        """Budget per partition id: a node's declared ``budget-macs`` (node config) wins over the drawn one.

        Raises before training when the setup cannot serve the run config, or when a declared budget is not a
        finite number in ``budget_range`` (naming the node, from ``node_of_partition``, and the key). A budget above
        the whole supernet is valid: that client runs the whole supernet."""
        run.clients_per_round(self.num_partitions)
        low, high = self.budget_range
        for pid, value in sorted(declared.items()):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high):
                who = f"partition-id={pid}"
                if node_of_partition is not None:
                    who = f"SuperNode {node_of_partition[pid]} ({who})"
                shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
                raise ValueError(
                    f"{who} declared budget-macs={shown} in its node-config; allowed: a number in {self.range_text()}"
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


def server_test_set(run: RunConfig, test: ImageData) -> ImageData:
    """The test images the server scores the tiers on during a run: all of ``test``, or with ``test-size`` N > 0
    below its size a seeded class-stratified sample of N (a stream of its own: the other splits do not move)."""
    size = run["test-size"]
    if not 0 < size < len(test):
        return test
    return test.subset(stratified_holdout(test.labels.numpy(), size, np.random.default_rng([run["seed"], 79])))


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
    setup = SupernetSetup.build(run, num_partitions)
    train, _ = dataset_for(run, setup.cfg)
    return pool_partitions(run, train.labels.numpy(), setup.data_budgets(setup.budgets if budgets is None else budgets))


def partition_rows(run: RunConfig, num_partitions: int, budgets=None) -> tuple[np.ndarray, ...]:
    """Row indices into the training set of every client's partition (cached per process).

    ``budgets``: every partition's budget, declared where a node declared one (``SupernetSetup.client_budgets``); the
    drawn budgets when None. Server and clients must pass the same ones (the server sends them with each round)."""
    key = None if budgets is None else tuple(float(b) for b in budgets)
    if key is not None and len(key) != num_partitions:
        raise ValueError(f"partition-budgets: {len(key)} values for {num_partitions} partitions")
    return _all_partitions(tuple(sorted(run.values.items())), num_partitions, key)


def client_data(run: RunConfig, partition_id: int, num_partitions: int, budgets=None) -> ImageData:
    cfg = load_supernet_config(run["supernet"], n_classes=DATASETS[run["dataset"]].num_classes)
    train, _ = dataset_for(run, cfg)
    return train.subset(partition_rows(run, num_partitions, budgets)[partition_id])
