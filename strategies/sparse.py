"""Sparse aggregation: element-wise weighted average of prefix-sliced updates."""

from __future__ import annotations

import math
from logging import WARNING
from typing import Mapping, Sequence

import numpy as np
from flwr.common.logger import log

from fl_app.slicing import is_prefix_shape, prefix_region

State = Mapping[str, np.ndarray]


def update_problem(global_state: State, state: State, weight: float,
                   expected_shapes: Mapping[str, tuple] | None = None) -> str | None:
    """Why ``state`` cannot be aggregated into ``global_state`` (None when it can).

    ``expected_shapes``, when given, are the exact slices the client was sent: an update must return those.
    """
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
        return f"weight {weight!r} is not a finite positive number"
    if expected_shapes is not None and set(state) != set(expected_shapes):
        missing, extra = sorted(set(expected_shapes) - set(state)), sorted(set(state) - set(expected_shapes))
        return f"keys differ from what was routed (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, tensor in state.items():
        if name not in global_state:
            return f"unknown tensor '{name}'"
        shape, outer = tuple(np.shape(tensor)), tuple(np.shape(global_state[name]))
        if not is_prefix_shape(shape, outer):
            return f"'{name}' has shape {shape}, not a prefix slice of {outer}"
        if expected_shapes is not None and shape != tuple(expected_shapes[name]):
            return f"'{name}' has shape {shape}, but {tuple(expected_shapes[name])} was routed"
        if not np.all(np.isfinite(tensor)):
            return f"'{name}' contains NaN or Inf"
    return None


def sparse_average(global_state: State, updates: Sequence[tuple[State, float]],
                   masks: Sequence[Mapping[str, np.ndarray] | None] | None = None) -> dict[str, np.ndarray]:
    """Every element becomes the weighted average of the updates whose slice covers it; uncovered elements keep
    the global value. Updates that fail ``update_problem`` are logged and left out.

    ``masks[i]``, optional, narrows what update i covers inside its slice: name -> boolean array broadcastable to
    the slice (HeteroFL counts a classifier row only for clients holding that label).
    """
    masks = list(masks) if masks is not None else [None] * len(updates)
    valid = []
    for i, ((state, weight), mask) in enumerate(zip(updates, masks)):
        problem = update_problem(global_state, state, weight)
        if problem:
            log(WARNING, "sparse_average: update %d rejected: %s", i, problem)
        else:
            valid.append((state, float(weight), mask or {}))
    result = {}
    for name, current in global_state.items():
        covering = [(state[name], weight * np.broadcast_to(mask.get(name, True), np.shape(state[name])))
                    for state, weight, mask in valid if name in state]
        if not covering:
            result[name] = np.array(current, copy=True)
            continue
        # one tensor at a time keeps the extra memory to two tensors, not two models
        total = np.zeros(current.shape, dtype=np.float64)
        weight_sum = np.zeros(current.shape, dtype=np.float64)
        for tensor, weight in covering:
            region = prefix_region(np.shape(tensor))
            total[region] += weight * np.asarray(tensor, dtype=np.float64)  # weight: scalar or masked array
            weight_sum[region] += weight
        covered = weight_sum > 0
        merged = np.array(current, dtype=np.float32, copy=True)
        merged[covered] = (total[covered] / weight_sum[covered]).astype(np.float32)
        result[name] = merged
    return result
