"""Client partitions through flwr-datasets partitioners, including FEAST's budget-coupled γ-allocation."""

from __future__ import annotations

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, Partitioner

PARTITIONERS = ("gamma", "dirichlet", "iid")


def gamma_shares(budgets: np.ndarray, gamma: float, max_training_macs: float = 0.0) -> np.ndarray:
    """Target data shares q_i = b̃_i^γ / Σ_j b̃_j^γ with capped budgets b̃_i = min(b_i, max-training-macs)."""
    capped = np.asarray(budgets, dtype=float)
    if max_training_macs > 0:
        capped = np.minimum(capped, max_training_macs)
    weights = capped ** gamma
    return weights / weights.sum()


class GammaPartitioner(Partitioner):
    """Dirichlet label skew whose partition *sizes* follow the clients' budgets.

    For each class k, proportions over clients are drawn from Dir(α·n·q) (n clients; so γ = 0, where q is uniform,
    is exactly the ordinary Dir(α) split) and class k's samples are dealt out by them, except that clients already
    holding their target q_i·N samples stop receiving any. The whole draw is repeated until every client holds at
    least ``min_partition_size`` samples.
    """

    def __init__(self, budgets, gamma: float, alpha: float, partition_by: str = "label",
                 max_training_macs: float = 0.0, min_partition_size: int = 10, seed: int = 0,
                 max_attempts: int = 100):
        super().__init__()
        if gamma < 0:
            raise ValueError(f"gamma={gamma}: must be >= 0")
        if alpha <= 0:
            raise ValueError(f"dirichlet-alpha={alpha}: must be > 0")
        self.shares = gamma_shares(np.asarray(budgets), gamma, max_training_macs)
        self.alpha, self.partition_by = alpha, partition_by
        self.min_partition_size, self.seed, self.max_attempts = min_partition_size, seed, max_attempts
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return len(self.shares)

    def partition_indices(self) -> list[np.ndarray]:
        if self._indices is None:
            self._indices = self._draw(np.asarray(self.dataset[self.partition_by]))
        return self._indices

    def load_partition(self, partition_id: int) -> Dataset:
        return self.dataset.select(self.partition_indices()[partition_id])

    def _draw(self, labels: np.ndarray) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        n, total = self.num_partitions, len(labels)
        targets = self.shares * total
        for _ in range(self.max_attempts):
            parts: list[list[int]] = [[] for _ in range(n)]
            sizes = np.zeros(n)
            for k in rng.permutation(np.unique(labels)):
                rows = rng.permutation(np.flatnonzero(labels == k))
                props = rng.dirichlet(self.alpha * n * self.shares)
                props = props * (sizes < targets)  # full clients stop filling
                if props.sum() == 0:
                    props = self.shares.copy()
                props /= props.sum()
                cuts = (np.cumsum(props) * len(rows)).astype(int)[:-1]
                for i, chunk in enumerate(np.split(rows, cuts)):
                    parts[i].extend(chunk.tolist())
                    sizes[i] += len(chunk)
            if sizes.min() >= self.min_partition_size:
                return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
        raise ValueError(f"γ-allocation: no draw in {self.max_attempts} gave every client >= "
                         f"{self.min_partition_size} samples; raise dirichlet-alpha or lower the number of clients")


def make_partitioner(name: str, num_partitions: int, seed: int, alpha: float, gamma: float = 0.0,
                     budgets=None, max_training_macs: float = 0.0) -> Partitioner:
    if name == "gamma":
        return GammaPartitioner(budgets, gamma, alpha, max_training_macs=max_training_macs, seed=seed)
    if name == "dirichlet":
        return DirichletPartitioner(num_partitions, "label", alpha, min_partition_size=10, self_balancing=True,
                                    seed=seed)
    if name == "iid":
        return IidPartitioner(num_partitions)
    raise ValueError(f"partitioner='{name}': allowed values are {list(PARTITIONERS)}")


def partition_indices(labels: np.ndarray, partitioner: Partitioner) -> list[np.ndarray]:
    """Indices into ``labels`` of every partition (partitioners work on a Dataset; an index column carries them)."""
    partitioner.dataset = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))})
    if isinstance(partitioner, GammaPartitioner):  # its indices directly: no Dataset.select per partition
        return list(partitioner.partition_indices())
    return [np.asarray(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]
