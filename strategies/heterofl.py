"""HeteroFL and FedRolex baselines: static width slicing into rate tiers, per-element averaging with a count of one
per client, classifier rows counted only for the labels a client holds; FedRolex rolls the kept channel window."""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord

from fl_app.models.supernet_space import SupernetConfig, count_costs, width_sliced_config, width_tier
from fl_app.supernet.message import WIDTH_SLICED
from fl_app.supernet.slicing import subnet_shapes
from fl_app.supernet.subnets import CachedSubnet
from strategies.supernet_base import SupernetStrategy

RUNNING_STATS = ("running_mean", "running_var")


def rate_tiers(cfg: SupernetConfig) -> list[CachedSubnet]:
    """The width tiers of a width-sliced config, cheapest first."""
    return [
        CachedSubnet(width_tier(cfg, i), *count_costs(cfg, width_tier(cfg, i)))
        for i in range(len(cfg.width_multiplier_choices))
    ]


def elastic_dims(cfg: SupernetConfig) -> dict[str, tuple[int, ...]]:
    """Per tensor, the dimensions whose size changes with the width rate (channel dimensions)."""
    full, smallest = (
        subnet_shapes(cfg, width_tier(cfg, len(cfg.width_multiplier_choices) - 1)),
        subnet_shapes(cfg, width_tier(cfg, 0)),
    )
    return {name: tuple(i for i, (a, b) in enumerate(zip(full[name], smallest[name])) if a != b) for name in full}


def roll_state(state: dict, dims: dict[str, tuple[int, ...]], server_round: int, direction: int = 1) -> dict:
    """FedRolex's window: with ``direction=1`` the prefix of each channel dimension of size C holds the channels
    ``roll(arange(C), round % C)``; ``direction=-1`` undoes it."""
    rolled = {}
    for name, value in state.items():
        for axis in dims.get(name, ()):
            value = np.roll(value, direction * (server_round % value.shape[axis]), axis=axis)
        rolled[name] = value
    return rolled


class HeteroFLStrategy(SupernetStrategy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.width_cfg = width_sliced_config(self.cfg)
        self.tiers = rate_tiers(self.width_cfg)

    @property
    def model_cfg(self) -> SupernetConfig:
        return self.width_cfg

    def tier_index(self, budget: float) -> int:
        affordable = [i for i, tier in enumerate(self.tiers) if tier.macs <= budget]
        return affordable[-1] if affordable else 0

    def assign(self, partition_id: int, server_round: int):
        arch = self.tiers[self.tier_index(self.budgets[partition_id])].arch
        return arch, arch

    def routed_shapes(self, arch):
        # static BN: running statistics are neither sent nor averaged; evaluation recalibrates them
        return {k: v for k, v in subnet_shapes(self.width_cfg, arch).items() if not k.endswith(RUNNING_STATS)}

    def instruction_fields(self, partition_id: int, bounds) -> dict:
        rate = self.width_cfg.width_multiplier_choices[bounds.w[0]]
        return dict(model=WIDTH_SLICED, width_rate=float(rate), mask_labels=True)

    def reply_weights(self, server_round: int, entries: list[tuple[int, MetricRecord]]) -> list[float]:
        return [1.0] * len(entries)  # HeteroFL counts every client once per element

    def reply_mask(self, partition_id: int, metrics: MetricRecord) -> dict:
        held = np.zeros(self.width_cfg.n_classes, dtype=bool)
        held[np.asarray(metrics.get("labels", []), dtype=int)] = True
        return {"classifier.weight": held[:, None], "classifier.bias": held}


class FedRolexStrategy(HeteroFLStrategy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dims = elastic_dims(self.width_cfg)

    def to_wire_view(self, state: dict, server_round: int) -> dict:
        return roll_state(state, self.dims, server_round, 1)

    def from_wire_view(self, state: dict, server_round: int) -> dict:
        return roll_state(state, self.dims, server_round, -1)
