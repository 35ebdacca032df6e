"""Elastic ResNet supernet: its configuration, the subnet encoding and analytic costs.

A subnet is ``Subnet(d, e, w)``: ``d[s]`` extra blocks in stage ``s`` (the stage has ``1 + d[s]`` blocks), ``e[s]`` the
expansion ratio of every block of stage ``s`` and ``w[i]`` an index into the width multipliers for position ``i``
(position 0 is the stem, positions 1..4 the stages). Every tensor of a subnet is a prefix slice of the supernet's
tensor (see ``fl_app.supernet.slicing``), so the same encoding also describes a *sub-supernet*: the bounds that
routing sends.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fl_app.io.resources import bundled_file

NAMED_SUPERNETS = {"cpu": "supernet_configs/cpu.json", "paper": "supernet_configs/paper.json"}
NAMED_CACHES = {"cpu": "supernet_configs/cpu-cache.csv", "paper": "supernet_configs/paper-cache.csv"}


def make_divisible(value: float, divisor: int) -> int:
    """Round to the nearest multiple of ``divisor`` without going more than 10% below ``value`` (OFA's rule)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


@dataclass(frozen=True)
class Subnet:
    d: tuple[int, ...]
    e: tuple[float, ...]
    w: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "d", tuple(int(x) for x in self.d))
        object.__setattr__(self, "e", tuple(float(x) for x in self.e))
        object.__setattr__(self, "w", tuple(int(x) for x in self.w))

    def within(self, bounds: "Subnet") -> bool:
        """True when every dimension of this subnet fits inside ``bounds``."""
        return (
            all(a <= b for a, b in zip(self.d, bounds.d))
            and all(a <= b + 1e-9 for a, b in zip(self.e, bounds.e))
            and all(a <= b for a, b in zip(self.w, bounds.w))
        )

    @staticmethod
    def envelope(subnets: list["Subnet"]) -> "Subnet":
        """The smallest sub-supernet containing all ``subnets``: per-dimension maximum."""
        if not subnets:
            raise ValueError("envelope of an empty list of subnets")
        return Subnet(
            d=tuple(max(s.d[i] for s in subnets) for i in range(len(subnets[0].d))),
            e=tuple(max(s.e[i] for s in subnets) for i in range(len(subnets[0].e))),
            w=tuple(max(s.w[i] for s in subnets) for i in range(len(subnets[0].w))),
        )

    def to_dict(self) -> dict:
        return {"d": list(self.d), "e": list(self.e), "w_indices": list(self.w)}

    @staticmethod
    def from_dict(data: dict) -> "Subnet":
        return Subnet(d=data["d"], e=data["e"], w=data.get("w_indices", data.get("w")))


@dataclass(frozen=True)
class SupernetConfig:
    """Everything the elastic ResNet needs (same keys as the reference JSON)."""

    num_stages: int
    max_extra_blocks_per_stage: int
    original_stem_out_channels: int
    original_stage_base_channels: tuple[int, ...]
    width_multiplier_choices: tuple[float, ...]
    expansion_ratio_choices: tuple[float, ...]
    stage_downsample_factors: tuple[int, ...]
    n_classes: int = 10
    initial_input_hw: int = 32
    initial_input_channels: int = 3
    stem_stride: int = 1
    channel_divisible_by: int = 8
    name: str = field(default="custom", compare=False)

    def __post_init__(self):
        for key in (
            "original_stage_base_channels",
            "width_multiplier_choices",
            "expansion_ratio_choices",
            "stage_downsample_factors",
        ):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        if len(self.original_stage_base_channels) != self.num_stages:
            raise ValueError("supernet: original_stage_base_channels must have num_stages entries")
        if len(self.stage_downsample_factors) != self.num_stages:
            raise ValueError("supernet: stage_downsample_factors must have num_stages entries")

    # -- the two extreme subnets -------------------------------------------------------------------------------
    def max_subnet(self) -> Subnet:
        return Subnet(
            d=(self.max_extra_blocks_per_stage,) * self.num_stages,
            e=(max(self.expansion_ratio_choices),) * self.num_stages,
            w=(len(self.width_multiplier_choices) - 1,) * (self.num_stages + 1),
        )

    def min_subnet(self) -> Subnet:
        return Subnet(
            d=(0,) * self.num_stages,
            e=(min(self.expansion_ratio_choices),) * self.num_stages,
            w=(0,) * (self.num_stages + 1),
        )

    # -- channel counts of a subnet ---------------------------------------------------------------------------
    def stem_channels(self, arch: Subnet) -> int:
        mult = self.width_multiplier_choices[arch.w[0]]
        return make_divisible(self.original_stem_out_channels * mult, self.channel_divisible_by)

    def stage_channels(self, arch: Subnet, stage: int) -> int:
        mult = self.width_multiplier_choices[arch.w[stage + 1]]
        return make_divisible(self.original_stage_base_channels[stage] * mult, self.channel_divisible_by)

    def mid_channels(self, arch: Subnet, stage: int) -> int:
        return make_divisible(self.stage_channels(arch, stage) * arch.e[stage], self.channel_divisible_by)

    def check_subnet(self, arch: Subnet) -> None:
        """Raise ``ValueError`` naming the offending field when ``arch`` is not a subnet of this supernet."""
        if len(arch.d) != self.num_stages or any(not 0 <= x <= self.max_extra_blocks_per_stage for x in arch.d):
            raise ValueError(
                f"subnet d={list(arch.d)}: need {self.num_stages} values in 0..{self.max_extra_blocks_per_stage}"
            )
        if len(arch.e) != self.num_stages or any(
            min(abs(x - c) for c in self.expansion_ratio_choices) > 1e-9 for x in arch.e
        ):
            raise ValueError(
                f"subnet e={list(arch.e)}: need {self.num_stages} values from {list(self.expansion_ratio_choices)}"
            )
        if len(arch.w) != self.num_stages + 1 or any(not 0 <= x < len(self.width_multiplier_choices) for x in arch.w):
            raise ValueError(
                f"subnet w_indices={list(arch.w)}: need {self.num_stages + 1} values in "
                f"0..{len(self.width_multiplier_choices) - 1}"
            )

    # -- serialisation ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data

    @staticmethod
    def from_dict(data: dict, n_classes: int | None = None, name: str = "custom") -> "SupernetConfig":
        known = set(SupernetConfig.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"supernet config: unknown keys {unknown}; allowed: {sorted(known)}")
        kwargs = dict(data)
        kwargs.setdefault("name", name)
        if n_classes is not None:
            kwargs["n_classes"] = n_classes
        return SupernetConfig(**kwargs)


def load_supernet_config(spec: str, n_classes: int | None = None) -> SupernetConfig:
    """``spec`` is ``cpu``, ``paper`` or the path to a JSON file with the reference keys."""
    name = spec if spec in NAMED_SUPERNETS else Path(spec).stem
    path = bundled_file(NAMED_SUPERNETS[spec]) if spec in NAMED_SUPERNETS else Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"supernet: '{spec}' is neither one of {sorted(NAMED_SUPERNETS)} nor an existing JSON file")
    return SupernetConfig.from_dict(json.loads(path.read_text()), n_classes=n_classes, name=name)


# -- analytic costs -----------------------------------------------------------------------------------------------
def count_costs(cfg: SupernetConfig, arch: Subnet, n_classes: int | None = None) -> tuple[int, int]:
    """Multiply-accumulates of one forward pass at the config's input size, and learnable parameters.

    Convolutions have no bias; every BatchNorm has an affine weight and bias (running statistics are buffers, not
    parameters); the classifier is a linear layer with bias. ``n_classes`` overrides the config's classifier size
    (the reference subnet cache counts a 10-class classifier).
    """
    n_classes = cfg.n_classes if n_classes is None else n_classes
    hw = cfg.initial_input_hw // cfg.stem_stride
    c_in = cfg.stem_channels(arch)
    macs = hw * hw * cfg.initial_input_channels * c_in * 9
    params = cfg.initial_input_channels * c_in * 9 + 2 * c_in
    for stage in range(cfg.num_stages):
        out, mid = cfg.stage_channels(arch, stage), cfg.mid_channels(arch, stage)
        for block in range(1 + arch.d[stage]):
            if block == 0:  # strided conv1 + (avg-pool, 1x1 projection) shortcut
                hw //= cfg.stage_downsample_factors[stage]
                macs += hw * hw * c_in * out
                params += c_in * out + 2 * out
            macs += hw * hw * 9 * (c_in * mid + mid * out)
            params += 9 * (c_in * mid + mid * out) + 2 * (mid + out)
            c_in = out
    macs += c_in * n_classes
    params += c_in * n_classes + n_classes
    return macs, params


def count_macs(cfg: SupernetConfig, arch: Subnet, n_classes: int | None = None) -> int:
    return count_costs(cfg, arch, n_classes)[0]


# -- width-sliced variants (HeteroFL / FedRolex) ---------------------------------------------------------------------
WIDTH_RATES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)


def width_sliced_config(cfg: SupernetConfig, rates: tuple[float, ...] = WIDTH_RATES) -> SupernetConfig:
    """The supernet at full depth and expansion whose only elastic dimension is one global width rate.

    Channels are ``round(C * r)`` (divisor 1), so MACs scale with about r^2 as in HeteroFL; a rate-r model is
    ``width_tier(cfg, i)``, a prefix slice of the full-width model like every other subnet.
    """
    data = cfg.to_dict()
    data.update(
        width_multiplier_choices=list(rates),
        expansion_ratio_choices=[max(cfg.expansion_ratio_choices)],
        channel_divisible_by=1,
        name=f"{cfg.name}-width-sliced",
    )
    return SupernetConfig.from_dict(data)


def width_tier(cfg: SupernetConfig, index: int) -> Subnet:
    """Subnet of a width-sliced config at rate ``width_multiplier_choices[index]`` on every position."""
    return Subnet(
        d=(cfg.max_extra_blocks_per_stage,) * cfg.num_stages,
        e=(max(cfg.expansion_ratio_choices),) * cfg.num_stages,
        w=(index,) * (cfg.num_stages + 1),
    )
