"""What a client accepts from the server before it trains, shared by every client family: the arrays' keys and shapes
(what the routed config implies), finite values within a bound, and the config values it uses.

Each check returns why the broadcast must be refused (None when it may be used); the caller raises, so the reply is
an error reply the server counts as failed, and nothing that was sent reaches the client's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from fl_app.run.config import TYPE_NAMES, Range, is_kind

# The server accepts no reply value beyond 1e6 (strategies.screening.MAX_ABS), so no global tensor, prototype, soft
# label or head it averages from honest replies exceeds it either; a broadcast beyond it is not something it computes.
BROADCAST_MAX_ABS = 1e6
NON_NEGATIVE_SUFFIXES = ("running_var",)  # a BatchNorm running variance is never negative (its sqrt is taken)


def shapes_problem(arrays: Mapping, expected: Mapping[str, tuple]) -> str | None:
    """Exactly the ``expected`` keys, each with its shape. Reads only ``.shape``: works on an ArrayRecord's metadata
    before anything is decoded, as on decoded arrays."""
    if set(arrays) != set(expected):
        return f"broadcast keys {sorted(arrays)}, expected {sorted(expected)}"
    for key, shape in expected.items():
        got = tuple(np.shape(arrays[key]))
        if got != tuple(shape):
            return f"broadcast '{key}' has shape {got}, expected {tuple(shape)}"
    return None


def values_problem(arrays: Mapping, max_abs: float = BROADCAST_MAX_ABS) -> str | None:
    """Finite values within ``max_abs``; tensors named like a running variance are non-negative. One pass each."""
    for key, value in arrays.items():
        value = np.asarray(value)
        if not value.size:
            continue
        largest = float(np.max(np.abs(value)))  # NaN propagates, Inf stays Inf
        if not math.isfinite(largest) or largest > max_abs:
            return f"broadcast '{key}' is not finite or beyond {max_abs:g}"
        if key.endswith(NON_NEGATIVE_SUFFIXES) and float(np.min(value)) < 0:
            return f"broadcast '{key}' has negative values (a variance)"
    return None


@dataclass(frozen=True)
class Expect:
    """What one config value must be: its ``kind`` (int, float, bool or str, or a list of them with ``length``
    items), the values it (each item) may take (a ``Range``, or a tuple of allowed values), and whether it must be
    there."""

    kind: type
    allowed: Range | tuple | None = None
    length: int | None = None  # a list of this many items; None: a single value
    required: bool = True

    def problem(self, value) -> str | None:
        what = TYPE_NAMES[self.kind]
        if self.length is not None:
            if not isinstance(value, list) or len(value) != self.length:
                return f"expected a list of {self.length} values, each {what}"
            items = value
        else:
            items = [value]
        for item in items:
            if not is_kind(item, self.kind):
                return f"expected {what}" if self.length is None else f"expected a list of values, each {what}"
            if isinstance(self.allowed, Range) and not self.allowed(item):
                return f"must be {self.allowed.rule}"
            if isinstance(self.allowed, tuple) and item not in self.allowed:
                return f"allowed: {list(self.allowed)}"
        return None


def config_problem(config: Mapping, expected: Mapping[str, Expect]) -> str | None:
    """The first config value that is missing or not what ``expected`` says, named with its value."""
    for key, expect in expected.items():
        if key not in config:
            if expect.required:
                return f"config '{key}' is missing"
            continue
        problem = expect.problem(config[key])
        if problem:
            return f"config '{key}'={config[key]!r}: {problem}"
    return None
