"""ScaleFL's models: the elastic ResNet scaled in depth and width together, with an early-exit classifier per level.

A *level* runs the first ``blocks`` blocks of the network (stage by stage; the stages after the one it ends in are
not run at all) at one width rate, and predicts with its own exit head after its last block. Every level is a prefix
of the next in both depth and width, so its tensors are prefix slices of the global model's (the one slicing
primitive, ``fl_app.supernet.slicing``). A level is encoded as a ``Subnet`` of the ScaleFL config (blocks per stage
in ``d``, the width index in ``w``; stages it does not run have ``d = 0``) plus the number of stages it runs.

The global model is the deepest level with every exit: the backbone's ``classifier`` is the deepest exit and
``exits.<j>`` the exit of level ``j``. ``ElasticResNet`` itself is unchanged: this model reuses its modules and
runs them with its own forward, which returns the logits of every exit, shallowest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import (
    WIDTH_RATES,
    Subnet,
    SupernetConfig,
    count_costs,
    width_sliced_config,
    width_tier,
)

# ScaleFL's width ratios: a fine grid (the reference searches 0.05 .. 1 in steps of 0.05), so that depth and width
# can be balanced at each level's budget
SCALEFL_RATES = tuple(i / 20 for i in range(1, 21))
# how far below its target a level's MACs may fall and still count as hitting it (one-sided: it must fit)
TARGET_TOLERANCE = 0.25
# the FEAST repository's ScaleFL levels (``scalefl-levels = "reference"``): fractions of the full model's MACs, and
# how far (either side) a level's MACs may lie from its target
REFERENCE_FRACTIONS = (0.061, 0.13, 0.25, 1.0)
REFERENCE_TOLERANCE = 0.15
LEVEL_RULES = ("tiers", "reference")
RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


def scalefl_config(cfg: SupernetConfig) -> SupernetConfig:
    """The supernet at full expansion with one global width rate from ``SCALEFL_RATES`` (channels ``round(C r)``),
    its depth elastic: the backbone HeteroFL and FedRolex slice, with finer rates."""
    return width_sliced_config(cfg, SCALEFL_RATES)


@dataclass(frozen=True)
class Level:
    """One ScaleFL level: ``arch`` (a subnet of the ScaleFL config), the number of ``stages`` it runs, its total
    number of ``blocks``, and the MACs and parameters of its deepest exit's path (what a client deploys)."""

    arch: Subnet
    stages: int
    blocks: int
    macs: int
    params: int

    @property
    def last_stage_blocks(self) -> int:
        return 1 + self.arch.d[self.stages - 1]


def truncated(cfg: SupernetConfig, arch: Subnet, stages: int) -> tuple[SupernetConfig, Subnet]:
    """The config and subnet of the first ``stages`` stages: an elastic ResNet whose classifier sits after them."""
    data = cfg.to_dict()
    data.update(
        num_stages=stages,
        original_stage_base_channels=list(cfg.original_stage_base_channels[:stages]),
        stage_downsample_factors=list(cfg.stage_downsample_factors[:stages]),
    )
    return SupernetConfig.from_dict(data), Subnet(arch.d[:stages], arch.e[:stages], arch.w[: stages + 1])


def level_of(cfg: SupernetConfig, blocks: int, width: int) -> Level:
    """The level running the first ``blocks`` blocks at width index ``width`` of ``cfg``."""
    per_stage = 1 + cfg.max_extra_blocks_per_stage
    if not 1 <= blocks <= per_stage * cfg.num_stages:
        raise ValueError(f"level blocks={blocks}: need 1..{per_stage * cfg.num_stages}")
    stages = -(-blocks // per_stage)
    d = [per_stage - 1] * (stages - 1) + [blocks - per_stage * (stages - 1) - 1] + [0] * (cfg.num_stages - stages)
    arch = Subnet(d, (max(cfg.expansion_ratio_choices),) * cfg.num_stages, (width,) * (cfg.num_stages + 1))
    macs, params = count_costs(*truncated(cfg, arch, stages))
    return Level(arch, stages, blocks, macs, params)


def level_targets(cfg: SupernetConfig) -> list[int]:
    """The MACs each level must fit: HeteroFL's rate tiers on the same backbone (width ``WIDTH_RATES`` at full
    depth), so that both methods serve the same budgets."""
    tiers = width_sliced_config(cfg, WIDTH_RATES)
    return [count_costs(tiers, width_tier(tiers, i))[0] for i in range(len(WIDTH_RATES))]


def _inside(cfg: SupernetConfig, above: Level) -> list[Level]:
    """Every level strictly inside ``above``: fewer or as many blocks, a width index no larger, not ``above``."""
    return [
        level_of(cfg, blocks, width)
        for blocks in range(1, above.blocks + 1)
        for width in range(above.arch.w[0] + 1)
        if (blocks, width) != (above.blocks, above.arch.w[0])
    ]


def _tiers_level(cfg: SupernetConfig, above: Level, target: float, total: int) -> Level:
    """Among the pairs inside ``above`` whose MACs fit ``target`` and lie within ``TARGET_TOLERANCE`` below it, the
    most balanced (the larger MACs on ties); when none lies that close, the largest that fits."""
    rates = cfg.width_multiplier_choices
    fitting = [lv for lv in _inside(cfg, above) if lv.macs <= target]
    if not fitting:
        raise ValueError(f"scalefl: no level of supernet '{cfg.name}' fits {target} MACs")
    close = [lv for lv in fitting if lv.macs >= (1 - TARGET_TOLERANCE) * target]
    if close:
        return min(close, key=lambda lv: (abs(lv.blocks / total - rates[lv.arch.w[0]]), -lv.macs))
    return max(fitting, key=lambda lv: lv.macs)


def _reference_level(cfg: SupernetConfig, above: Level, target: float, total: int) -> Level:
    """The FEAST repository's search (``baselines/scalefl/split_config.py``): among the pairs whose MACs lie within
    ``REFERENCE_TOLERANCE`` of ``target`` either side, the most balanced, the fewest blocks then the narrowest on
    ties (its search order); when none lies that close, the pair whose MACs are nearest the target. Here the pairs
    are those inside ``above``, so that the levels nest (their tensors are prefix slices of one global model)."""
    rates = cfg.width_multiplier_choices
    inside = _inside(cfg, above)
    close = [lv for lv in inside if abs(lv.macs / target - 1) <= REFERENCE_TOLERANCE]
    if close:
        return min(close, key=lambda lv: (abs(lv.blocks / total - rates[lv.arch.w[0]]), lv.blocks, lv.arch.w[0]))
    return min(inside, key=lambda lv: (abs(lv.macs - target), lv.blocks, lv.arch.w[0]))


@lru_cache(maxsize=16)
def scalefl_levels(cfg: SupernetConfig, rule: str = "tiers") -> tuple[Level, ...]:
    """ScaleFL's levels on the ScaleFL config ``cfg``, cheapest first: the last is the whole model; each other level
    is chosen inside the next larger one, by the paper's rule of the most balanced split (least |depth fraction -
    width rate|). ``rule = "tiers"``: the targets are HeteroFL's tiers' MACs and a level must fit its target
    (``_tiers_level``); ``"reference"``: the FEAST repository's 0.061, 0.13 and 0.25 of the whole model's MACs,
    within 15 % either side (``_reference_level``)."""
    if rule not in LEVEL_RULES:
        raise ValueError(f"scalefl-levels='{rule}': allowed values are {list(LEVEL_RULES)}")
    per_stage = 1 + cfg.max_extra_blocks_per_stage
    total = per_stage * cfg.num_stages
    levels = [level_of(cfg, total, len(cfg.width_multiplier_choices) - 1)]
    if rule == "tiers":
        targets, choose = level_targets(cfg)[:-1], _tiers_level
    else:
        targets, choose = [f * levels[0].macs for f in REFERENCE_FRACTIONS[:-1]], _reference_level
    for target in reversed(targets):
        levels.insert(0, choose(cfg, levels[0], target, total))
    if len({lv.arch for lv in levels}) != len(levels):
        raise ValueError(f"scalefl: two levels of supernet '{cfg.name}' share one encoding: {levels}")
    return tuple(levels)


def level_index(cfg: SupernetConfig, arch: Subnet, rule: str = "tiers") -> int:
    """Which level ``arch`` encodes (``ValueError`` when it is none)."""
    for index, level in enumerate(scalefl_levels(cfg, rule)):
        if level.arch == arch:
            return index
    raise ValueError(f"subnet {arch} is not one of ScaleFL's levels")


class EarlyExitResNet(nn.Module):
    """Level ``index`` of ``cfg``'s ScaleFL levels (under ``rule``) with the exits of every level up to it.
    ``forward`` returns the logits of those exits, shallowest first (the last is this level's own prediction)."""

    memory_format = ElasticResNet.memory_format

    def __init__(self, cfg: SupernetConfig, index: int, rule: str = "tiers"):
        super().__init__()
        levels = scalefl_levels(cfg, rule)
        level = levels[index]
        self.cfg, self.arch = cfg, level.arch
        trunk_cfg, trunk_arch = truncated(cfg, level.arch, level.stages)
        trunk = ElasticResNet(trunk_cfg, trunk_arch)
        self.stem_conv, self.stem_bn, self.stages = trunk.stem_conv, trunk.stem_bn, trunk.stages
        # exit j sits after level j's last block: (stage, blocks run in that stage) -> the exits there (two levels
        # of one depth and different widths have one exit each at the same block)
        self.exit_at: dict[tuple[int, int], list[int]] = {}
        for j in range(index + 1):
            self.exit_at.setdefault((levels[j].stages - 1, levels[j].last_stage_blocks), []).append(j)
        top = len(levels) - 1
        self.exits = nn.ModuleDict(
            {
                str(j): nn.Linear(cfg.stage_channels(level.arch, levels[j].stages - 1), cfg.n_classes)
                for j in range(min(index + 1, top))
            }
        )
        if index == top:  # the deepest exit is the backbone's own classifier
            self.classifier = trunk.classifier
        self.top = top

    def head(self, j: int) -> nn.Linear:
        return self.classifier if j == self.top else self.exits[str(j)]

    def forward(self, x: torch.Tensor, arch: Subnet | None = None) -> list[torch.Tensor]:
        """``arch`` is ignored (the model is one level); it keeps the signature BN recalibration calls."""
        cfg = self.cfg
        x = x.contiguous(memory_format=self.memory_format)
        x = F.relu(self.stem_bn(self.stem_conv(x, cfg.stem_channels(self.arch), cfg.stem_stride)), inplace=True)
        outputs = []
        for s, blocks in enumerate(self.stages):
            out, mid = cfg.stage_channels(self.arch, s), cfg.mid_channels(self.arch, s)
            for b, block in enumerate(blocks):
                x = block(x, mid, out)
                exits = self.exit_at.get((s, b + 1), ())
                if exits:
                    pooled = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
                    outputs.extend(self.head(j)(pooled) for j in exits)
        return outputs


class DeepestExit(nn.Module):
    """An early-exit model seen as a classifier by its deepest exit (what a level's accuracy is measured on)."""

    def __init__(self, model: EarlyExitResNet):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, arch: Subnet | None = None) -> torch.Tensor:
        return self.model(x)[-1]


@lru_cache(maxsize=256)
def level_shapes(cfg: SupernetConfig, arch: Subnet, rule: str = "tiers") -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of level ``arch`` (under ``rule``) with its exits (BatchNorm statistics are
    static in ScaleFL: neither sent nor averaged). Built from the model code on the meta device."""
    with torch.device("meta"):
        model = EarlyExitResNet(cfg, level_index(cfg, arch, rule), rule)
    return {name: tuple(t.shape) for name, t in model.state_dict().items() if not name.endswith(RUNNING_STATS)}
