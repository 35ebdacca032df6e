"""Server side of the model-heterogeneous baselines: local (no communication), LG-FedAvg, FD, FedProto, FedTGP (the
shared base is ``strategies.multiarch_base``)."""

from __future__ import annotations

from logging import WARNING

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from fl_app.models.threads import one_thread_per_op
from fl_app.run.config import check_choice
from strategies.multiarch_base import MultiArchStrategy
from strategies.screening import absent_rows_problem


def weighted_class_means(means: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ_i n_ic·m_ic / Σ_i n_ic over the clients holding class c -> (global means [C, D], held [C] bool)."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    summed = (np.asarray(means, dtype=np.float64) * counts[:, :, None]).sum(axis=0)
    return summed / np.maximum(total, 1)[:, None], total > 0


class LocalStrategy(MultiArchStrategy):
    """No communication: clients train alone (the broadcast is empty and uploads are ignored)."""

    name = "local"


class LgFedAvgStrategy(MultiArchStrategy):
    """Average the shared-size heads (Linear(feature-dim, C)), weighted by num-examples."""

    name = "lg-fedavg"

    def expected_upload(self):
        return {"head.weight": (self.num_classes, self.feature_dim), "head.bias": (self.num_classes,)}

    def magnitude_reference(self, key):
        return self.global_arrays.get(key)

    def aggregate_uploads(self, server_round, uploads):
        total = sum(n for _, _, n in uploads)
        if not uploads or total <= 0:
            return
        self.global_arrays = {
            k: (sum(n * u[k] for _, u, n in uploads) / total).astype(np.float32) for k in ("head.weight", "head.bias")
        }


class _ClassMeanStrategy(MultiArchStrategy):
    """Keeps one global vector per class; classes nobody uploaded this round keep their previous value."""

    key = "means"
    count_weighted = True  # FedProto weighs client i's class-c mean by n_ic; FD takes the plain mean over holders
    seen_only = False  # counts of the whole training split (FD: only of the classes seen in training, others 0)

    def mean_dim(self) -> int:
        return self.feature_dim

    def expected_upload(self):
        return {"means": (self.num_classes, self.mean_dim()), "counts": (self.num_classes,)}

    def magnitude_reference(self, key):
        return self.global_arrays.get(self.key) if key == "means" else None

    def upload_problem(self, partition_id, upload):
        return self.partition_counts_problem(partition_id, upload["counts"], self.seen_only) or absent_rows_problem(
            "means", upload["means"], upload["counts"]
        )

    def merge_class_means(self, uploads) -> None:
        if not uploads:
            return
        counts = np.stack([u["counts"] for _, u, _ in uploads])
        means, held = weighted_class_means(
            np.stack([u["means"] for _, u, _ in uploads]), counts if self.count_weighted else (counts > 0) * 1.0
        )
        old = self.global_arrays.get(self.key)
        old_has = self.global_arrays.get("has", np.zeros(self.num_classes)) > 0
        merged = np.where(held[:, None], means, old if old is not None else 0.0)
        self.global_arrays = {self.key: merged.astype(np.float32), "has": (held | old_has).astype(np.float32)}

    def aggregate_uploads(self, server_round, uploads):
        self.merge_class_means(uploads)


class FdStrategy(_ClassMeanStrategy):
    """FD: per-class mean logits averaged over the clients that saw the class (each client counts once, as in the
    FD paper and HtFLlib ``serverfd.py``); clients distil toward their softmax."""

    name = "fd"
    key = "soft-labels"
    count_weighted = False
    seen_only = True

    def mean_dim(self) -> int:  # mean logits
        return self.num_classes


class FedProtoStrategy(_ClassMeanStrategy):
    """FedProto: per-class prototypes averaged over the clients holding the class."""

    name = "fedproto"
    key = "prototypes"


# -- FedTGP --------------------------------------------------------------------------------------------------------
class PrototypeGenerator(nn.Module):
    """Trainable global prototypes: Embedding(C, d) -> MLP."""

    def __init__(self, num_classes: int, dim: int, hidden: int = 0):
        super().__init__()
        hidden = hidden or dim
        self.embedding = nn.Embedding(num_classes, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self) -> torch.Tensor:
        return self.mlp(self.embedding.weight)


def adaptive_margin(centers: torch.Tensor, held: torch.Tensor, cap: float, rule: str = "class-gap") -> float:
    """FedTGP's margin δ from the class centres Q_c (mean client prototype of each held class), capped at τ.

    ``class-gap`` (the authors' code, HtFLlib ``servertgp.py``): for each class the distance to its nearest other
    class centre, then the largest of those: δ = min(max_c min_{c'≠c} ||Q_c − Q_c'||, τ). ``max-pair`` (the formula
    as printed in the paper): δ = min(max_{c,c'} ||Q_c − Q_c'||, τ), the widest gap between any two centres, which is
    never smaller and grows with the most distant pair of classes."""
    check_choice("tgp-margin", rule)
    q = centers[held]
    if len(q) < 2:
        return 0.0
    dist = torch.cdist(q, q)
    if rule == "max-pair":
        return float(min(dist.max().item(), cap))
    dist.fill_diagonal_(float("inf"))
    return float(min(dist.min(dim=1).values.max().item(), cap))


def margin_contrastive_loss(
    global_protos: torch.Tensor, client_protos: torch.Tensor, labels: torch.Tensor, margin: float
) -> torch.Tensor:
    """−log(e^{−(φ(p, P_y)+δ)} / (e^{−(φ(p, P_y)+δ)} + Σ_{k≠y} e^{−φ(p, P_k)})), φ = Euclidean distance."""
    dist = torch.cdist(client_protos, global_protos)
    logits = -dist - margin * nn.functional.one_hot(labels, global_protos.shape[0]).float()
    return nn.functional.cross_entropy(logits, labels)


def train_generator(
    generator: PrototypeGenerator,
    client_protos: torch.Tensor,
    labels: torch.Tensor,
    margin: float,
    epochs: int,
    lr: float = 0.01,
    batch_size: int = 10,
    seed: int = 0,
) -> float:
    """The authors' server step: SGD (lr = the clients' learning rate there, 0.01) over seeded, shuffled mini-batches
    of the uploaded client prototypes, ``epochs`` passes; the generator runs on every class for each batch.
    Returns the last batch's loss."""
    optimizer = torch.optim.SGD(generator.parameters(), lr=lr)
    order_rng = torch.Generator().manual_seed(seed)
    generator.train()
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=order_rng)
        for start in range(0, len(labels), batch_size):
            batch = order[start : start + batch_size]
            loss = margin_contrastive_loss(generator(), client_protos[batch], labels[batch], margin)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss.detach())


class FedTgpStrategy(_ClassMeanStrategy):
    """FedTGP: the server trains the prototype generator on the uploaded client prototypes each round and
    broadcasts its output for every class."""

    name = "fedtgp"

    key = "prototypes"

    def __init__(
        self,
        *args,
        server_epochs: int = 100,
        margin_cap: float = 100.0,
        margin_rule: str = "class-gap",
        server_lr: float = 0.01,
        server_batch_size: int = 10,
        **kw,
    ):
        super().__init__(*args, **kw)
        self.margin_rule, self.server_lr, self.server_batch_size = margin_rule, server_lr, server_batch_size
        with torch.random.fork_rng():  # seeded init without touching the caller's global generator
            torch.manual_seed(self.seed)
            self.generator = PrototypeGenerator(self.num_classes, self.feature_dim)
        self.server_epochs, self.margin_cap = server_epochs, margin_cap
        self.margins: dict[int, float] = {}

    def checkpoint_state(self) -> dict:
        return {
            **super().checkpoint_state(),
            "generator": {k: v.clone() for k, v in self.generator.state_dict().items()},
            "margins": dict(self.margins),
        }

    def restore_state(self, saved: dict) -> None:
        super().restore_state(saved)
        self.generator.load_state_dict(saved["generator"])
        self.margins = {int(r): v for r, v in saved["margins"].items()}

    def aggregate_uploads(self, server_round, uploads):
        protos, labels = [], []
        for _, u, _ in uploads:
            for c in np.flatnonzero(u["counts"] > 0):
                protos.append(u["means"][c])
                labels.append(c)
        if not protos:
            return
        client_protos = torch.tensor(np.stack(protos), dtype=torch.float32)
        labels_t = torch.tensor(labels)
        centers, held = weighted_class_means(
            np.stack([u["means"] for _, u, _ in uploads]),
            (np.stack([u["counts"] for _, u, _ in uploads]) > 0).astype(float),
        )
        margin = adaptive_margin(
            torch.tensor(centers, dtype=torch.float32), torch.tensor(held), self.margin_cap, self.margin_rule
        )
        self.margins[server_round] = margin
        order_seed = int(np.random.SeedSequence([self.seed, server_round]).generate_state(1)[0])
        previous = {k: v.clone() for k, v in self.generator.state_dict().items()}
        # one thread: hundreds of tiny steps a round, which two threads made ten times slower on two busy cores
        # (54 against 4.8 ms a step) and whose result depended on the server's core count
        with one_thread_per_op():
            train_generator(
                self.generator,
                client_protos,
                labels_t,
                margin,
                self.server_epochs,
                self.server_lr,
                self.server_batch_size,
                seed=order_seed,
            )
            self.generator.eval()
            with torch.no_grad():
                global_protos = self.generator().numpy()
        if not np.all(np.isfinite(global_protos)):  # a diverged step must not stay in the generator for good
            log(WARNING, "round %d: the prototype generator diverged: its previous state is kept", server_round)
            self.generator.load_state_dict(previous)
            return
        self.global_arrays = {
            "prototypes": global_protos.astype(np.float32),
            "has": np.ones(self.num_classes, dtype=np.float32),
        }
