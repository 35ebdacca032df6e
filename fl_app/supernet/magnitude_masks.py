"""Unstructured magnitude masks over the full supernet (FIARSE's submodels): which tensors are masked, what each of
their elements costs in MACs, and one global threshold per budget level.

A level of ``B`` MACs keeps the largest-magnitude elements of every masked tensor (convolution weights, classifier
weight and bias; BatchNorm is never masked) such that the MACs of the kept elements fit ``B``: one threshold ``t``
over all masked tensors at once, an element kept when ``|w| >= t``. Under unstructured sparsity a kept convolution
weight costs one multiply-accumulate per output position, a classifier weight one, a bias none; the costs of every
element sum to ``count_macs`` of the full model (tested).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np
import torch

from fl_app.models.supernet_space import SupernetConfig


@lru_cache(maxsize=8)
def element_macs(cfg: SupernetConfig) -> dict[str, int]:
    """Masked tensor name -> MACs of one of its elements in a forward pass of the full model (measured on the meta
    device from the model code itself, so it cannot drift from the module definitions)."""
    from fl_app.models.elastic_resnet import DynamicConv2d, ElasticResNet  # the model imports the supernet package

    positions: dict[str, int] = {}
    with torch.device("meta"):
        model = ElasticResNet(cfg)
        hooks = [
            module.register_forward_hook(lambda _m, _i, out, name=name: positions.__setitem__(name, out[0, 0].numel()))
            for name, module in model.named_modules()
            if isinstance(module, DynamicConv2d)
        ]
        model(torch.empty(1, cfg.initial_input_channels, cfg.initial_input_hw, cfg.initial_input_hw))
    for hook in hooks:
        hook.remove()
    costs = {f"{name}.weight": hw for name, hw in positions.items()}
    costs.update({"classifier.weight": 1, "classifier.bias": 0})
    return costs


def level_thresholds(
    state: Mapping[str, np.ndarray], costs: Mapping[str, int], budgets: Sequence[float]
) -> list[float]:
    """For each budget, the smallest threshold whose kept set (``|w| >= t`` over every tensor in ``costs``) fits it:
    elements sorted by magnitude, largest first, are taken while their cumulative MACs fit; the threshold lies just
    above the first element that does not fit (so ties with it are dropped too). 0.0 when everything fits."""
    names = sorted(costs)
    magnitudes = np.concatenate([np.abs(np.asarray(state[n], dtype=np.float32)).ravel() for n in names])
    cost = np.concatenate([np.full(np.size(state[n]), costs[n], dtype=np.int64) for n in names])
    order = np.argsort(-magnitudes, kind="stable")
    cumulative = np.cumsum(cost[order])
    thresholds = []
    for budget in budgets:
        fitting = int(np.searchsorted(cumulative, budget, side="right"))  # how many of the largest fit
        if fitting == len(order):
            thresholds.append(0.0)
        else:
            first_out = magnitudes[order[fitting]]
            thresholds.append(float(np.nextafter(first_out, np.float32(np.inf), dtype=np.float32)))
    return thresholds


# the smallest size a client gets when mapped by the FEAST repository's rule (its ``budget_to_model_size``)
MIN_MODEL_SIZE = 1 / 256


def model_size(budget: float, full_macs: float) -> float:
    """The FEAST repository's FIARSE size of a client: the fraction of the parameters it keeps, its budget over the
    full model's MACs, within [1/256, 1]."""
    return max(MIN_MODEL_SIZE, min(1.0, budget / full_macs))


def size_threshold(state: Mapping[str, np.ndarray], names, size: float) -> float:
    """The threshold keeping the ``size`` fraction of the elements of the tensors ``names`` by count (the reference's
    top-k: ``k = max(1, floor(numel * size))``, the k-th largest magnitude; ties with it are kept too). 0.0 (keep
    everything) at size 1."""
    if size >= 1.0:
        return 0.0
    magnitudes = np.concatenate([np.abs(np.asarray(state[n], dtype=np.float32)).ravel() for n in sorted(names)])
    k = max(1, int(magnitudes.size * size))
    return float(np.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])


def magnitude_mask(state: Mapping[str, np.ndarray], names, threshold: float) -> dict[str, np.ndarray]:
    """Name -> boolean mask ``|w| >= threshold`` of each tensor in ``names``."""
    t = np.float32(threshold)
    return {n: np.abs(np.asarray(state[n], dtype=np.float32)) >= t for n in names}


def kept_macs(mask: Mapping[str, np.ndarray], costs: Mapping[str, int]) -> int:
    """MACs of a forward pass through the kept elements only (the masked tensors' share of the model's cost)."""
    return int(sum(int(np.count_nonzero(m)) * costs[n] for n, m in mask.items()))
