"""Where tensors go: CUDA when the process sees a GPU, else the CPU (decided once per process)."""

from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def preferred_device() -> torch.device:
    # in a Ray simulation, clients that requested no GPU fraction do not see one (Ray hides it)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
