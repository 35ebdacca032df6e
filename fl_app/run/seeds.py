"""Seeds derived from the run's seed: one independent stream per purpose (a client's round, its initial model)."""

from __future__ import annotations

import numpy as np


def derived_seed(*parts: int) -> int:
    """A 32-bit seed from integers (e.g. run seed, round, partition id): different parts give unrelated seeds."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
