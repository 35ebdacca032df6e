"""ScaleFL baseline (Ilhan et al., CVPR 2023): each client trains the largest level its budget affords, a model
scaled down in depth and width together with an early exit per level (``fl_app.models.early_exit``); every element
of the global model, exits included, is averaged over the clients whose level holds it (the reference weighs them
by their number of examples, as the run's ``aggregation-weights`` does). BatchNorm is static: running statistics
are neither sent nor averaged, and evaluation recalibrates them. A level's reported accuracy is its deepest exit's.

``scalefl-levels = "reference"`` takes the FEAST repository's levels instead of HeteroFL's tiers' MACs
(``fl_app.models.early_exit.scalefl_levels``): 4 levels at 0.061, 0.13, 0.25 and 1 of the whole model's MACs, a
client below the smallest trains the smallest, and only the levels some client trains are reported."""

from __future__ import annotations

import torch

from fl_app.models.early_exit import (
    DeepestExit,
    EarlyExitResNet,
    level_index,
    level_shapes,
    scalefl_config,
    scalefl_levels,
)
from fl_app.models.supernet_space import Subnet, SupernetConfig
from fl_app.run.device import preferred_device
from fl_app.supernet.evaluation import accuracy, recalibrate_bn
from fl_app.supernet.message import EARLY_EXIT
from fl_app.supernet.slicing import slice_state
from strategies.supernet_base import SupernetStrategy


def evaluate_level(cfg: SupernetConfig, state, arch: Subnet, calibration, *splits, rule: str = "tiers") -> list[float]:
    """Accuracy of level ``arch``'s deepest exit on each split, its BatchNorm recalibrated on ``calibration``."""
    model = EarlyExitResNet(cfg, level_index(cfg, arch, rule), rule)
    sliced = slice_state(state, level_shapes(cfg, arch, rule))
    model.load_state_dict({k: torch.as_tensor(v) for k, v in sliced.items()}, strict=False)
    deepest = DeepestExit(model).to(preferred_device())
    recalibrate_bn(deepest, calibration.images)
    return [accuracy(deepest, split) for split in splits]


class ScaleFLStrategy(SupernetStrategy):
    def __init__(self, *args, rule: str = "tiers", **kwargs):
        super().__init__(*args, **kwargs)
        self.rule = rule
        self.scalefl_cfg = scalefl_config(self.cfg)
        self.levels = scalefl_levels(self.scalefl_cfg, rule)
        # reporting tiers: each level, scored at its deepest exit; under the reference's levels only those some
        # client trains (the reference reports no level no client is assigned)
        trained = {self.level_index(b) for b in self.budgets.values()} if rule == "reference" else None
        self.tiers = [lv for i, lv in enumerate(self.levels) if trained is None or i in trained]

    @property
    def model_cfg(self) -> SupernetConfig:
        return self.scalefl_cfg

    def global_model(self) -> torch.nn.Module:
        return EarlyExitResNet(self.scalefl_cfg, len(self.levels) - 1, self.rule)

    def evaluate_tier(self, cfg: SupernetConfig, state, arch: Subnet, calibration, *splits) -> list[float]:
        return evaluate_level(cfg, state, arch, calibration, *splits, rule=self.rule)

    def level_index(self, budget: float) -> int:
        affordable = [i for i, level in enumerate(self.levels) if level.macs <= budget]
        return affordable[-1] if affordable else 0

    def assign(self, partition_id: int, server_round: int):
        arch = self.levels[self.level_index(self.budgets[partition_id])].arch
        return arch, arch

    def routed_shapes(self, arch):
        return level_shapes(self.scalefl_cfg, arch, self.rule)

    def routed_macs(self, partition_id: int) -> tuple[float, float]:
        """The routed level with its exits: its MACs per step, as the client costs it."""
        _, arch = self.routed[partition_id]
        macs = self.levels[level_index(self.scalefl_cfg, arch, self.rule)].macs
        return macs, macs

    def instruction_fields(self, partition_id: int, bounds) -> dict:
        return dict(model=EARLY_EXIT, width_rate=1.0)  # no HeteroFL scaler in ScaleFL
