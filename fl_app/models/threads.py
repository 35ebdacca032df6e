"""torch's intra-op thread count for a block of small ops."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_thread_per_op():
    """torch's intra-op threads set to one for the block (worker threads read the setting when they first run an
    op), the previous number restored after.

    For many small ops (a BatchNorm pass per batch, a tiny MLP trained step by step) splitting each op over the
    cores buys nothing and costs a barrier per op, which stalls whenever another process holds one of the cores; and
    a reduction split over threads may add in another order, so a result can depend on the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
