"""The learning rate of each round, from the run config (every method uses the same schedule)."""

from __future__ import annotations

import math
from typing import Callable

from fl_app.run.config import RunConfig


def lr_schedule(run: RunConfig) -> Callable[[int], float]:
    """Round (1-based) -> learning rate: ``lr`` throughout (``lr-schedule = "constant"``) or cosine-annealed from
    ``lr`` in round 1 towards 0 after ``num-server-rounds`` (``"cosine"``)."""
    base, rounds = run["lr"], run["num-server-rounds"]
    if run["lr-schedule"] == "constant":
        return lambda r: base
    return lambda r: base * 0.5 * (1 + math.cos(math.pi * (r - 1) / rounds))
