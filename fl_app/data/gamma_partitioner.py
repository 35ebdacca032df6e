"""The γ-allocation as a flwr-datasets ``Partitioner`` (``fl_app.data.partition.GammaAllocation`` on a Dataset), for
use with flwr-datasets outside this app. The app itself draws the same partitions without flwr-datasets."""

from __future__ import annotations

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import Partitioner

from fl_app.data.partition import GammaAllocation


class GammaPartitioner(GammaAllocation, Partitioner):
    __doc__ = GammaAllocation.__doc__

    def __init__(
        self,
        budgets,
        gamma: float,
        alpha: float,
        partition_by: str = "label",
        max_training_macs: float = 0.0,
        min_partition_size: int = 10,
        seed: int = 0,
        max_attempts: int = 100,
        concentration: str = "clients",
    ):
        Partitioner.__init__(self)
        GammaAllocation.__init__(
            self, budgets, gamma, alpha, max_training_macs, min_partition_size, seed, max_attempts, concentration
        )
        self.partition_by = partition_by
        self._indices: list[np.ndarray] | None = None

    def partition_indices(self) -> list[np.ndarray]:
        """Sorted row indices of every partition of ``self.dataset``."""
        if self._indices is None:
            self._indices = self.draw(np.asarray(self.dataset[self.partition_by]))
        return self._indices

    def load_partition(self, partition_id: int) -> Dataset:
        return self.dataset.select(self.partition_indices()[partition_id])
