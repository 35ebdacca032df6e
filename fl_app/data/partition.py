"""Client budgets and partitions: the Zipf draw of inference budgets, FEAST's budget-coupled γ-allocation (plain
NumPy) and flwr-datasets' partitioners.

flwr-datasets (with ``datasets``, seaborn, scipy and matplotlib) takes seconds to import in every process that loads
the ClientApp, so it is imported only where a flwr-datasets partitioner is asked for: ``dirichlet``, ``iid`` and
``fl_app.data.gamma_partitioner``, the γ-allocation as a flwr-datasets ``Partitioner`` for use outside this app. The
γ-allocation (``partitioner = "gamma-class-size"``, the default and the FEAST repository's concentration, or
``"gamma"``, the concentration of the earlier suites) draws the same partitions without it.
"""

from __future__ import annotations

import numpy as np

# the γ-allocation's partitioner values, each with its Dirichlet concentration (see ``CONCENTRATIONS``)
GAMMA_PARTITIONERS = {"gamma": "clients", "gamma-class-size": "class-size"}
PARTITIONERS = (*GAMMA_PARTITIONERS, "dirichlet", "iid")
# the smallest concentration of the class-size draw: a vanishing share stays a valid Dirichlet parameter
MIN_CONCENTRATION = 1e-6


def draw_budgets(
    num_clients: int, min_macs: float, max_macs: float, zipf_a: float, seed: int, levels: int = 0
) -> np.ndarray:
    """Client inference budgets: Zipf(``zipf_a``) over ``levels`` ranks spread evenly from ``min_macs`` to
    ``max_macs`` (rank 1, the most common, is the smallest budget), jittered by up to half a step, clipped.

    ``levels`` defaults to the number of clients. Deterministic in ``seed``.
    """
    levels = levels or num_clients
    rng = np.random.default_rng([seed, 7919])
    if levels == 1 or max_macs <= min_macs:
        return np.full(num_clients, float(max(min_macs, max_macs)))
    ranks = np.arange(1, levels + 1)
    probs = ranks.astype(float) ** -zipf_a
    probs /= probs.sum()
    drawn = rng.choice(ranks, size=num_clients, p=probs)
    step = (max_macs - min_macs) / (levels - 1)
    budgets = min_macs + (drawn - 1) * step + rng.uniform(-step / 2, step / 2, size=num_clients)
    return np.clip(budgets, min_macs, max_macs)


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


def clients_concentration(allocation: GammaAllocation, class_size: int) -> np.ndarray:
    """α·n·q_i, the same for every class; written so that uniform weights give flwr's values bit for bit (α·1)."""
    return allocation.alpha * (allocation.weights / allocation.weights.mean())


def class_size_concentration(allocation: GammaAllocation, class_size: int) -> np.ndarray:
    """α·N_k·q_i with N_k the class's sample count: the FEAST repository's split ("Eq. asym_dirichlet"). It is
    N_k / n times the clients' concentration (50× for CIFAR-10's 5,000 images a class over 100 clients), so at the
    same α the label skew is much weaker; the paper's α = 0.005 assumes this scaling."""
    return np.maximum(allocation.alpha * class_size * allocation.shares, MIN_CONCENTRATION)


# the run-config name of each concentration -> c_i for class k's proportions p_k ~ Dir(c)
CONCENTRATIONS = {"clients": clients_concentration, "class-size": class_size_concentration}


class GammaAllocation:
    """Dirichlet label skew whose partition *sizes* follow the clients' budgets.

    The self-balancing Dirichlet split of flwr-datasets' ``DirichletPartitioner`` with target shares q_i instead of
    equal ones. For each class k in sorted order, proportions over the n clients are drawn from Dir(α·n·q) and
    class k's samples are dealt out by them, except that clients already holding more than their target q_i·N
    samples receive none (the proportions of the others are renormalised). The whole draw is repeated, continuing
    the same random stream, until every client holds at least ``min_partition_size`` samples.

    ``concentration`` names the Dirichlet parameter (``CONCENTRATIONS``): ``"clients"`` is Dir(α·n·q) above
    (``partitioner = "gamma"``); ``"class-size"`` is Dir(α·N_k·q), N_k the size of class k, as the FEAST
    repository draws it (``partitioner = "gamma-class-size"``).

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
        concentration: str = "clients",
    ):
        if concentration not in CONCENTRATIONS:
            raise ValueError(f"concentration='{concentration}': allowed values are {list(CONCENTRATIONS)}")
        if gamma < 0:
            raise ValueError(f"gamma={gamma}: must be >= 0")
        if alpha <= 0:
            raise ValueError(f"dirichlet-alpha={alpha}: must be > 0")
        self.weights = gamma_weights(np.asarray(budgets), gamma, max_training_macs)
        self.shares = self.weights / self.weights.sum()
        self.alpha = alpha
        self.min_partition_size, self.seed, self.max_attempts = min_partition_size, seed, max_attempts
        self.concentration = concentration

    @property
    def num_partitions(self) -> int:
        return len(self.shares)

    def draw(self, labels: np.ndarray) -> list[np.ndarray]:
        """Sorted indices into ``labels`` of every partition."""
        rng = np.random.default_rng(self.seed)
        total = len(labels)
        # written so that uniform weights give flwr's values bit for bit: target N/n
        concentration = CONCENTRATIONS[self.concentration]
        targets = total * self.weights / self.weights.sum()
        for _ in range(self.max_attempts):
            parts: list[list[int]] = [[] for _ in range(self.num_partitions)]
            sizes = np.zeros(self.num_partitions)
            for k in np.unique(labels):
                rows = np.nonzero(labels == k)[0]
                props = rng.dirichlet(concentration(self, len(rows)))
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
    if name in GAMMA_PARTITIONERS:
        return GammaAllocation(
            budgets,
            gamma,
            alpha,
            max_training_macs=max_training_macs,
            seed=seed,
            concentration=GAMMA_PARTITIONERS[name],
        )
    if name == "dirichlet":
        from flwr_datasets.partitioner import DirichletPartitioner

        return DirichletPartitioner(
            num_partitions, "label", alpha, min_partition_size=10, self_balancing=True, seed=seed
        )
    if name == "iid":
        from flwr_datasets.partitioner import IidPartitioner

        return IidPartitioner(num_partitions)
    raise ValueError(f"partitioner='{name}': allowed values are {list(PARTITIONERS)}")


def label_skew(labels: np.ndarray, parts: list[np.ndarray]) -> dict:
    """How skewed the clients' labels are, averaged over the clients that hold data: the entropy of a client's label
    distribution (bits; log2 of the number of classes when even) and the share of its largest class; and how many
    clients hold fewer than 10 samples."""
    classes = int(labels.max()) + 1
    counts = np.array([np.bincount(labels[p], minlength=classes) for p in parts], dtype=float)
    counts = counts[counts.sum(axis=1) > 0]
    shares = counts / counts.sum(axis=1, keepdims=True)
    logs = np.log2(np.where(shares > 0, shares, 1.0))
    return {
        "entropy_bits": float(np.mean(-(shares * logs).sum(axis=1))),
        "max_share": float(shares.max(axis=1).mean()),
        "clients_under_10": sum(len(p) < 10 for p in parts),
    }


def partition_indices(labels: np.ndarray, partitioner) -> list[np.ndarray]:
    """Indices into ``labels`` of every partition (flwr-datasets partitioners work on a Dataset; an index column
    carries them)."""
    if isinstance(partitioner, GammaAllocation):  # its indices directly: no Dataset, no select per partition
        return list(partitioner.draw(np.asarray(labels)))
    from datasets import Dataset

    partitioner.dataset = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))})
    return [np.asarray(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]


def skew_table(argv: list[str] | None = None) -> list[dict]:
    """The label skew of both γ-allocation concentrations on a dataset's training labels, at paper-scale budgets
    (Zipf over [--min-macs, --max-macs], γ shares capped at --max-training-macs)."""
    import pyarrow.parquet as pq

    from fl_app.io.cli import print_json, tool_parser

    parser = tool_parser("fl_app.data.partition", skew_table.__doc__)
    parser.add_argument("labels", help="a train.parquet with a 'label' column")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--alphas", default="0.005,0.1,1.0", help="comma-separated dirichlet-alpha values")
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--num-seeds", type=int, default=5, help="budget and partition draws, seeds 0 .. N-1")
    parser.add_argument("--min-macs", type=float, default=24_957_968, help="smallest budget (the paper cache's)")
    parser.add_argument("--max-macs", type=float, default=1.5e9, help="largest budget")
    parser.add_argument("--max-training-macs", type=float, default=6e8, help="budget cap of the γ shares")
    parser.add_argument("--zipf-a", type=float, default=1.2)
    parser.add_argument(
        "--min-partition-size", type=int, default=10, help="redraw until every client holds this many (0: one draw)"
    )
    args = parser.parse_args(argv)
    labels = pq.read_table(args.labels, columns=["label"]).column("label").to_numpy()
    table = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        for name, concentration in GAMMA_PARTITIONERS.items():
            measured, failed = [], 0
            for seed in range(args.num_seeds):
                budgets = draw_budgets(args.clients, args.min_macs, args.max_macs, args.zipf_a, seed)
                allocation = GammaAllocation(
                    budgets,
                    args.gamma,
                    alpha,
                    args.max_training_macs,
                    args.min_partition_size,
                    seed=seed,
                    concentration=concentration,
                )
                try:
                    measured.append(label_skew(labels, allocation.draw(labels)))
                except ValueError:  # no draw gave every client >= 10 samples
                    failed += 1
            row = {"alpha": alpha, "partitioner": name, "seeds_split": len(measured), "seeds_failed": failed}
            for key in ("entropy_bits", "max_share", "clients_under_10"):
                values = [m[key] for m in measured]
                row[key] = float(np.mean(values)) if values else float("nan")
                row[f"{key}_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
            table.append(row)
    print_json({"clients": args.clients, "gamma": args.gamma, "rows": table}, table)
    return table


if __name__ == "__main__":
    skew_table()
