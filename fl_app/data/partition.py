"""Client partitions: FEAST's budget-coupled γ-allocation (plain NumPy) and flwr-datasets' partitioners.

flwr-datasets (with ``datasets``, seaborn, scipy and matplotlib) takes seconds to import in every process that loads
the ClientApp, so it is imported only where a flwr-datasets partitioner is asked for: ``dirichlet``, ``iid`` and
``GammaPartitioner``, the γ-allocation as a flwr-datasets ``Partitioner`` for use outside this app. The γ-allocation
(``partitioner = "gamma"``, the default run's) draws the same partitions without it.
"""

from __future__ import annotations

import numpy as np

PARTITIONERS = ("gamma", "dirichlet", "iid")


def gamma_weights(budgets: np.ndarray, gamma: float, max_training_macs: float = 0.0) -> np.ndarray:
    """Unnormalised shares b̃_i^γ with capped budgets b̃_i = min(b_i, max-training-macs) (all exactly 1 at γ = 0)."""
    capped = np.asarray(budgets, dtype=float)
    if max_training_macs > 0:
        capped = np.minimum(capped, max_training_macs)
    return capped**gamma


def gamma_shares(budgets: np.ndarray, gamma: float, max_training_macs: float = 0.0) -> np.ndarray:
    """Target data shares q_i = b̃_i^γ / Σ_j b̃_j^γ with capped budgets b̃_i = min(b_i, max-training-macs)."""
    weights = gamma_weights(budgets, gamma, max_training_macs)
    return weights / weights.sum()


class GammaAllocation:
    """Dirichlet label skew whose partition *sizes* follow the clients' budgets.

    The self-balancing Dirichlet split of flwr-datasets' ``DirichletPartitioner`` with target shares q_i instead of
    equal ones. For each class k in sorted order, proportions over the n clients are drawn from Dir(α·n·q) and
    class k's samples are dealt out by them, except that clients already holding more than their target q_i·N
    samples receive none (the proportions of the others are renormalised). The whole draw is repeated, continuing
    the same random stream, until every client holds at least ``min_partition_size`` samples.

    γ = 0 (q uniform: Dir(α), target N/n) is exactly ``DirichletPartitioner(n, label, α, min_partition_size,
    self_balancing=True, seed)``, i.e. ``partitioner = "dirichlet"``: same seed, same partitions (tested). Note that
    this "plain" split is not the textbook Dir(α) split either: the self-balancing cap shapes the classes drawn
    last. At γ > 0 the same draw favours budget-rich clients twice: larger Dirichlet concentration and a higher cap.
    """

    def __init__(
        self,
        budgets,
        gamma: float,
        alpha: float,
        max_training_macs: float = 0.0,
        min_partition_size: int = 10,
        seed: int = 0,
        max_attempts: int = 100,
    ):
        if gamma < 0:
            raise ValueError(f"gamma={gamma}: must be >= 0")
        if alpha <= 0:
            raise ValueError(f"dirichlet-alpha={alpha}: must be > 0")
        self.weights = gamma_weights(np.asarray(budgets), gamma, max_training_macs)
        self.shares = self.weights / self.weights.sum()
        self.alpha = alpha
        self.min_partition_size, self.seed, self.max_attempts = min_partition_size, seed, max_attempts

    @property
    def num_partitions(self) -> int:
        return len(self.shares)

    def draw(self, labels: np.ndarray) -> list[np.ndarray]:
        """Sorted indices into ``labels`` of every partition."""
        rng = np.random.default_rng(self.seed)
        total = len(labels)
        # written so that uniform weights give flwr's values bit for bit: concentration α·1, target N/n
        concentration = self.alpha * (self.weights / self.weights.mean())
        targets = total * self.weights / self.weights.sum()
        for _ in range(self.max_attempts):
            parts: list[list[int]] = [[] for _ in range(self.num_partitions)]
            sizes = np.zeros(self.num_partitions)
            for k in np.unique(labels):
                rows = np.nonzero(labels == k)[0]
                props = rng.dirichlet(concentration)
                props = np.where(sizes > targets, 0.0, props)  # clients above their target stop filling
                mass = sum(props.tolist())  # summed in flwr's order
                if mass == 0:  # every drawn share underflowed or sits on full clients: deal by the targets
                    props = np.where(sizes > targets, 0.0, self.shares)
                    mass = sum(props.tolist())
                props = props / mass
                cuts = (np.cumsum(props) * len(rows)).astype(int)[:-1]
                for i, chunk in enumerate(np.split(rows, cuts)):
                    parts[i].extend(chunk.tolist())
                    sizes[i] += len(chunk)
            if sizes.min() >= self.min_partition_size:
                return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
        raise ValueError(
            f"γ-allocation: no draw in {self.max_attempts} gave every client >= "
            f"{self.min_partition_size} samples; raise dirichlet-alpha or lower the number of clients"
        )


def __getattr__(name: str):
    if name == "GammaPartitioner":  # flwr-datasets is imported only by those who ask for it
        from fl_app.data.gamma_partitioner import GammaPartitioner

        return GammaPartitioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_partitioner(
    name: str,
    num_partitions: int,
    seed: int,
    alpha: float,
    gamma: float = 0.0,
    budgets=None,
    max_training_macs: float = 0.0,
):
    """The run's partitioner: a ``GammaAllocation`` for ``gamma``, a flwr-datasets ``Partitioner`` otherwise."""
    if name == "gamma":
        return GammaAllocation(budgets, gamma, alpha, max_training_macs=max_training_macs, seed=seed)
    if name == "dirichlet":
        from flwr_datasets.partitioner import DirichletPartitioner

        return DirichletPartitioner(
            num_partitions, "label", alpha, min_partition_size=10, self_balancing=True, seed=seed
        )
    if name == "iid":
        from flwr_datasets.partitioner import IidPartitioner

        return IidPartitioner(num_partitions)
    raise ValueError(f"partitioner='{name}': allowed values are {list(PARTITIONERS)}")


def partition_indices(labels: np.ndarray, partitioner) -> list[np.ndarray]:
    """Indices into ``labels`` of every partition (flwr-datasets partitioners work on a Dataset; an index column
    carries them)."""
    if isinstance(partitioner, GammaAllocation):  # its indices directly: no Dataset, no select per partition
        return list(partitioner.draw(np.asarray(labels)))
    from datasets import Dataset

    partitioner.dataset = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))})
    return [np.asarray(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]
