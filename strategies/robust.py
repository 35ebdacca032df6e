"""Robust variants of the supernet family's sparse aggregation (run-config ``robust-aggregation``; off by default).

Screening bounds each reply by the global slice it updates (``screening.SLICE_RELATIVE_BOUND``), but within that
bound one client of eight can still drag every element it covers far from where the honest clients put it. These
merges limit what one reply can do, over the same coverage as ``sparse.sparse_average`` (a reply covers the prefix
slice it returned, narrowed by its mask; uncovered elements keep the global value):

- ``clip``: each reply's update (reply minus the global slice it was sent) is scaled down to the round's median
  update size, then the updates are averaged as ``sparse_average`` does (same weights). The size is the update's
  root-mean-square over the elements it covers, so a small slice and a large one compare fairly.
- ``trimmed-mean``: each element is the plain mean of the replies covering it after dropping the
  ``floor(TRIM_FRACTION * m)`` smallest and largest of its ``m`` values.
- ``median``: each element is the median of the values of the replies covering it.

The coordinate-wise merges weigh every covering reply alike: a num-examples weight is what a poisoning client would
inflate first. They can exclude one outlier only where at least 3 (median) or 5 (trimmed mean) replies cover an
element; fewer are merged like the mean (HeteroFL's classifier rows held by two clients). Clipping has no such floor.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from fl_app.supernet.slicing import prefix_region
from strategies.sparse import sparse_average

State = Mapping[str, np.ndarray]
Mask = Mapping[str, np.ndarray] | None
TRIM_FRACTION = 0.2  # trimmed-mean: share of the covering values dropped at each end (1 of 5 to 9, 2 of 10 to 14)


def clipped_average(global_state: State, updates: Sequence[tuple[State, float]], masks: Sequence[Mask]) -> dict:
    """``sparse_average`` of the replies with each update scaled to at most the median update RMS."""
    sizes = [_update_rms(global_state, state, mask or {}) for (state, _), mask in zip(updates, masks)]
    if not sizes:
        return sparse_average(global_state, updates, masks, tensors_checked=True)
    limit = float(np.median(sizes))
    clipped = []
    for (state, weight), size in zip(updates, sizes):
        scale = 1.0 if size <= limit else limit / size
        clipped.append(({name: _clip(global_state[name], tensor, scale) for name, tensor in state.items()}, weight))
    return sparse_average(global_state, clipped, masks, tensors_checked=True)


def _clip(current: np.ndarray, tensor: np.ndarray, scale: float) -> np.ndarray:
    if scale == 1.0:
        return tensor
    base = np.asarray(current, dtype=np.float32)[prefix_region(np.shape(tensor))]
    return (base + np.float32(scale) * (tensor - base)).astype(np.float32)


def _update_rms(global_state: State, state: State, mask: Mapping[str, np.ndarray]) -> float:
    """Root-mean-square of (reply - global slice) over the elements the reply covers (0 when it covers none)."""
    squares, count = 0.0, 0
    for name, tensor in state.items():
        delta = np.asarray(tensor, np.float64) - np.asarray(global_state[name], np.float64)[prefix_region(tensor.shape)]
        covered = np.broadcast_to(mask[name], delta.shape) if name in mask else np.ones(delta.shape, bool)
        squares += float(np.sum(np.square(delta[covered])))
        count += int(np.count_nonzero(covered))
    return math.sqrt(squares / count) if count else 0.0


def coordinate_merge(reduce: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """A merge that sets each covered element to ``reduce(sorted, count)`` of its covering values: ``sorted`` holds
    them ascending along axis 0 (NaN after them where fewer replies cover the element), ``count`` how many there are."""

    def merge(global_state: State, updates: Sequence[tuple[State, float]], masks: Sequence[Mask]) -> dict:
        result = {}
        for name, current in global_state.items():
            merged = np.array(current, dtype=np.float32, copy=True)
            covering = [(state.get(name), (mask or {}).get(name)) for (state, _), mask in zip(updates, masks)]
            covering = [(tensor, mask) for tensor, mask in covering if tensor is not None]
            if covering:
                stacked = np.full((len(covering),) + np.shape(current), np.nan, dtype=np.float64)
                for row, (tensor, mask) in zip(stacked, covering):
                    region = row[prefix_region(np.shape(tensor))]
                    values = np.asarray(tensor, np.float64)
                    if mask is not None:  # the masked elements of this slice are not covered by it
                        values = np.where(np.broadcast_to(mask, values.shape), values, np.nan)
                    region[...] = values
                count = np.sum(~np.isnan(stacked), axis=0)
                value = reduce(np.sort(stacked, axis=0), count)  # NaN sorts last
                np.copyto(merged, value.astype(np.float32), where=count > 0)
            result[name] = merged
        return result

    return merge


def _trimmed_mean(ordered: np.ndarray, count: np.ndarray) -> np.ndarray:
    trim = np.floor(TRIM_FRACTION * count)
    rank = np.arange(ordered.shape[0]).reshape((-1,) + (1,) * (ordered.ndim - 1))
    kept = (rank >= trim) & (rank < count - trim)
    kept_count = np.maximum(np.sum(kept, axis=0), 1)
    return np.sum(np.where(kept, ordered, 0.0), axis=0) / kept_count


def _median(ordered: np.ndarray, count: np.ndarray) -> np.ndarray:
    low = np.maximum((count - 1) // 2, 0)[None]
    high = np.maximum(count // 2, 0)[None]
    return 0.5 * (np.take_along_axis(ordered, low, 0)[0] + np.take_along_axis(ordered, high, 0)[0])


def _sparse(global_state: State, updates: Sequence[tuple[State, float]], masks: Sequence[Mask]) -> dict:
    return sparse_average(global_state, updates, masks, tensors_checked=True)


# robust-aggregation -> merge(global wire view, [(reply state, weight)], [mask or None]) -> new global state
AGGREGATIONS: dict[str, Callable] = {
    "none": _sparse,
    "clip": clipped_average,
    "trimmed-mean": coordinate_merge(_trimmed_mean),
    "median": coordinate_merge(_median),
}
