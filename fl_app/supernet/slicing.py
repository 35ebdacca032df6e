"""The one slicing primitive: a subnet's tensor is the leading block ``t[:s0, :s1, ...]`` of the supernet's tensor.

Routing (what a client receives), sparse aggregation (which elements an update covers), subnet extraction and the
width-sliced baselines all go through ``prefix_region`` / ``slice_state``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np
import torch

from fl_app.models.supernet_space import Subnet, SupernetConfig

Shape = tuple[int, ...]


def prefix_region(shape: Shape) -> tuple[slice, ...]:
    """Index selecting the leading ``shape`` block of a larger tensor (a 0-d tensor is its own prefix)."""
    return tuple(slice(0, n) for n in shape)


def is_prefix_shape(shape: Shape, outer: Shape) -> bool:
    return len(shape) == len(outer) and all(0 < a <= b for a, b in zip(shape, outer))


def slice_state(state: Mapping[str, np.ndarray | torch.Tensor], shapes: Mapping[str, Shape]) -> dict:
    """The prefix slices of ``state`` named in ``shapes`` (a sub-supernet, a subnet, or a width tier)."""
    out = {}
    for name, shape in shapes.items():
        tensor = state[name]
        if not is_prefix_shape(tuple(shape), tuple(tensor.shape)):
            raise ValueError(f"{name}: shape {tuple(shape)} is not a prefix of {tuple(tensor.shape)}")
        out[name] = tensor[prefix_region(shape)]
    return out


@lru_cache(maxsize=1024)
def subnet_shapes(cfg: SupernetConfig, arch: Subnet) -> dict[str, Shape]:
    """Name -> shape of every state entry of the model that holds exactly ``arch``.

    Built from the model code itself on the meta device, so the shapes cannot drift from the module definitions.
    """
    from fl_app.models.elastic_resnet import ElasticResNet  # the model imports this module

    with torch.device("meta"):
        model = ElasticResNet(cfg, bounds=arch)
    return {name: tuple(t.shape) for name, t in model.state_dict().items() if not name.endswith("num_batches_tracked")}


def slice_subnet(cfg: SupernetConfig, state: Mapping, arch: Subnet) -> dict:
    """The state of subnet (or sub-supernet) ``arch`` cut out of a supernet state."""
    return slice_state(state, subnet_shapes(cfg, arch))


def state_numel(shapes: Mapping[str, Shape]) -> int:
    return int(sum(np.prod(s, dtype=np.int64) for s in shapes.values()))
