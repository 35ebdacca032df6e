"""Sparse aggregation: element-wise weighted average of prefix-sliced updates."""

from __future__ import annotations

import math
from logging import WARNING
from typing import Mapping, Sequence

import numpy as np
from flwr.common.logger import log

from fl_app.supernet.slicing import is_prefix_shape, prefix_region
from strategies.screening import MAX_WEIGHT, keys_problem, magnitude_bound, tensor_problem, variance_problem

State = Mapping[str, np.ndarray]


def update_problem(
    global_state: State,
    state: State,
    weight: float,
    expected_shapes: Mapping[str, tuple] | None = None,
    magnitude_bounds: Mapping[str, float] | None = None,
    bound_basis: str = "",
) -> str | None:
    """Why ``state`` cannot be aggregated into ``global_state`` (None when it can).

    ``expected_shapes``, when given, are the exact slices the client was sent: an update must return those. Every
    tensor must be finite and within ``magnitude_bounds[name]`` (default: ``screening.magnitude_bound`` of the
    global tensor), which also keeps the float32 sums below finite; BatchNorm running variances are not negative;
    weights are at most ``screening.MAX_WEIGHT``. ``bound_basis`` says in a refusal where the bounds come from.
    """
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        return f"weight {weight!r} is not a finite number in (0, {MAX_WEIGHT}]"
    if expected_shapes is not None:
        problem = keys_problem(state, expected_shapes)
        if problem:
            return problem
    for name, tensor in state.items():
        if name not in global_state:
            return f"unknown tensor '{name}'"
        shape, outer = tuple(np.shape(tensor)), tuple(np.shape(global_state[name]))
        if not is_prefix_shape(shape, outer):
            return f"'{name}' has shape {shape}, not a prefix slice of {outer}"
        if expected_shapes is not None and shape != tuple(expected_shapes[name]):
            return f"'{name}' has shape {shape}, but {tuple(expected_shapes[name])} was routed"
        bound = magnitude_bounds[name] if magnitude_bounds is not None else magnitude_bound(global_state[name])
        problem = tensor_problem(name, tensor, bound, bound_basis) or variance_problem(name, tensor)
        if problem:
            return problem
    return None


def sparse_average(
    global_state: State,
    updates: Sequence[tuple[State, float]],
    masks: Sequence[Mapping[str, np.ndarray] | None] | None = None,
    tensors_checked: bool = False,
) -> dict[str, np.ndarray]:
    """Every element becomes the weighted average of the updates whose slice covers it; uncovered elements keep
    the global value. Updates that fail ``update_problem`` are logged and left out; with ``tensors_checked`` the
    caller has already run ``update_problem`` on every update's tensors and only the weights are checked here
    (updates decoded lazily are then read once more, not twice).

    ``masks[i]``, optional, narrows what update i covers inside its slice: name -> boolean array broadcastable to
    the slice (HeteroFL counts a classifier row only for clients holding that label).
    """
    masks = list(masks) if masks is not None else [None] * len(updates)
    valid = []
    for i, ((state, weight), mask) in enumerate(zip(updates, masks)):
        problem = update_problem(global_state, {} if tensors_checked else state, weight)
        if problem:
            log(WARNING, "sparse_average: update %d rejected: %s", i, problem)
        else:
            valid.append((state, float(weight), mask or {}))
    result = {}
    for name, current in global_state.items():
        covering = [(state[name], weight, mask.get(name)) for state, weight, mask in valid if name in state]
        if not covering:
            result[name] = np.array(current, dtype=np.float32, copy=True)
            continue
        # one tensor at a time keeps the working memory to three tensors, not extra models; float32 sums of a
        # handful of weighted updates lose nothing that matters and halve the memory traffic of float64
        total = np.zeros(np.shape(current), dtype=np.float32)
        weight_sum = np.zeros(np.shape(current), dtype=np.float32)
        for tensor, weight, mask in covering:
            region = prefix_region(np.shape(tensor))
            if mask is None:
                total[region] += weight * tensor
                weight_sum[region] += weight
            else:  # the masked elements of this slice count with weight 0
                masked_weight = weight * np.broadcast_to(mask, np.shape(tensor)).astype(np.float32)
                total[region] += masked_weight * tensor
                weight_sum[region] += masked_weight
        merged = np.array(current, dtype=np.float32, copy=True)
        np.divide(total, weight_sum, out=merged, where=weight_sum > 0)
        result[name] = merged
    return result
