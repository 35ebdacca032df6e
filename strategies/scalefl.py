"""ScaleFL baseline (Ilhan et al., CVPR 2023): each client trains the largest level its budget affords, a model
scaled down in depth and width together with an early exit per level (``fl_app.models.early_exit``); every element
of the global model, exits included, is averaged over the clients whose level holds it (the reference weighs them
by their number of examples, as the run's ``aggregation-weights`` does). BatchNorm is static: running statistics
are neither sent nor averaged, and evaluation recalibrates them. A level's reported accuracy is its deepest exit's."""

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
from fl_app.supernet.slicing import slice_state
from strategies.feast import FeastStrategy


def evaluate_level(cfg: SupernetConfig, state, arch: Subnet, calibration, *splits) -> list[float]:
    """Accuracy of level ``arch``'s deepest exit on each split, its BatchNorm recalibrated on ``calibration``."""
    model = EarlyExitResNet(cfg, level_index(cfg, arch))
    sliced = slice_state(state, level_shapes(cfg, arch))
    model.load_state_dict({k: torch.as_tensor(v) for k, v in sliced.items()}, strict=False)
    deepest = DeepestExit(model).to(preferred_device())
    recalibrate_bn(deepest, calibration.images)
    return [accuracy(deepest, split) for split in splits]


class ScaleFLStrategy(FeastStrategy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scalefl_cfg = scalefl_config(self.cfg)
        self.levels = scalefl_levels(self.scalefl_cfg)
        self.tiers = list(self.levels)  # reporting tiers: each level, scored at its deepest exit

    @property
    def model_cfg(self) -> SupernetConfig:
        return self.scalefl_cfg

    def global_model(self) -> torch.nn.Module:
        return EarlyExitResNet(self.scalefl_cfg, len(self.levels) - 1)

    def evaluate_tier(self, cfg: SupernetConfig, state, arch: Subnet, calibration, *splits) -> list[float]:
        return evaluate_level(cfg, state, arch, calibration, *splits)

    def level_index(self, budget: float) -> int:
        affordable = [i for i, level in enumerate(self.levels) if level.macs <= budget]
        return affordable[-1] if affordable else 0

    def assign(self, partition_id: int, server_round: int):
        arch = self.levels[self.level_index(self.budgets[partition_id])].arch
        return arch, arch

    def routed_shapes(self, arch):
        return level_shapes(self.scalefl_cfg, arch)

    def routed_macs(self, partition_id: int) -> tuple[float, float]:
        """The routed level with its exits: its MACs per step, as the client costs it."""
        _, arch = self.routed[partition_id]
        macs = self.levels[level_index(self.scalefl_cfg, arch)].macs
        return macs, macs

    def client_config(self, partition_id: int, bounds) -> dict:
        return {"model": "early-exit", "width-rate": 1.0}  # no HeteroFL scaler in ScaleFL
