"""FedTopo client: local training with a topology-guided loss, class prototypes, and the relation topology.

Each piece is its own function so it can be checked in isolation; ``fl_app.multiarch_app`` wires them to messages.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from clients.broadcast import BROADCAST_MAX_ABS, shapes_problem, values_problem
from clients.local_training import GRAD_CLIP_NORM, LocalSettings, local_batches
from fl_app.data.augment import crop_flip, normalize
from fl_app.data.images import ImageData, take_rows
from fl_app.run.config import check_choice


# -- prototypes and topology ---------------------------------------------------------------------------------------
def class_prototypes(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, normalise: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of (L2-normalised) features -> (prototypes [C, d], counts [C]); absent classes are zero."""
    feats = F.normalize(features.float(), dim=1) if normalise else features.float()
    counts = torch.bincount(labels, minlength=num_classes).float()
    sums = torch.zeros(num_classes, feats.shape[1]).index_add_(0, labels, feats)
    return sums / counts.clamp(min=1).unsqueeze(1), counts


def relation_scores(prototypes: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """S[j, k] = cos(p_j, p_k) for held classes j != k, 0 elsewhere (diagonal, absent classes).

    A pair's score depends only on the two prototypes, not on which other classes the client holds, so scores from
    clients with different class subsets measure the same thing and can be averaged (a row-wise softmax here would
    hand all of a class's mass to whatever few classes share its client)."""
    held = counts > 0
    c = len(counts)
    p = F.normalize(prototypes.float(), dim=1)
    allowed = held.unsqueeze(0) & held.unsqueeze(1) & ~torch.eye(c, dtype=torch.bool)
    return torch.where(allowed, (p @ p.T).clamp(-1.0, 1.0), torch.zeros(c, c))


def capped_rows(labels: np.ndarray, max_samples: int, seed: int) -> np.ndarray:
    """Sorted rows of a seeded class-stratified subsample of at most ~``max_samples`` (0 = all rows).

    Each held class keeps at least one row, so a cap limits compute but never hides a class."""
    labels = np.asarray(labels)
    if not max_samples or len(labels) <= max_samples:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    rows = []
    for c in np.unique(labels):
        of_c = np.flatnonzero(labels == c)
        take = min(len(of_c), max(1, int(max_samples * len(of_c) / len(labels))))
        rows.append(rng.choice(of_c, take, replace=False))
    return np.sort(np.concatenate(rows))


def class_counts(data: ImageData, num_classes: int) -> torch.Tensor:
    """True per-class counts of a client's training split (what reliability weights are built from)."""
    return torch.bincount(data.labels, minlength=num_classes).float()


# -- loss ----------------------------------------------------------------------------------------------------------
def negative_weights(topology: torch.Tensor, beta: float) -> torch.Tensor:
    """w[y, k] = 1 + β·(C−1)·R̄[y, k] for k != y and 1 on the diagonal (the true class is not re-weighted)."""
    c = topology.shape[0]
    w = 1.0 + beta * (c - 1) * topology.float()
    return w.fill_diagonal_(1.0)


def topology_loss(logits: torch.Tensor, labels: torch.Tensor, topology: torch.Tensor, beta: float) -> torch.Tensor:
    """−log(e^{z_y} / (e^{z_y} + Σ_{k≠y} w[y,k] e^{z_k})) = CE(z + log w[y], y); β = 0 gives plain CE."""
    log_w = torch.log(negative_weights(topology, beta))[labels]
    return F.cross_entropy(logits + log_w, labels)


# -- training, embedding, evaluation (on the model's device: CUDA when the client has a GPU) ------------------------
def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def local_train(model: torch.nn.Module, data: ImageData, settings: LocalSettings, loss_fn) -> dict:
    """SGD on the client's data; ``loss_fn(logits, features, labels)`` is the method's objective."""
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay
    )
    model.train()
    device = _device_of(model)
    steps, loss_sum = 0, 0.0
    for idx in local_batches(len(data), settings, generator):
        images = take_rows(data.images, idx)
        if settings.crop_flip:
            images = crop_flip(images, generator)
        # augmentation stays on the CPU (seeded there); the batch moves to the model's device
        logits, features = model(normalize(images).to(device), with_features=True)
        loss = loss_fn(logits, features, take_rows(data.labels, idx).to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM)
        optimizer.step()
        steps += 1
        loss_sum += loss.item()
    return {"train-loss": loss_sum / max(steps, 1), "local-steps": steps}


@torch.no_grad()
def embed(
    model: torch.nn.Module, data: ImageData, max_samples: int = 0, seed: int = 0, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, features, labels) in eval mode, without augmentation, on a class-stratified subsample of at most
    ~``max_samples`` (0 = all; see ``capped_rows``)."""
    if max_samples and len(data) > max_samples:
        data = data.subset(capped_rows(data.labels.numpy(), max_samples, seed))
    model.eval()
    device = _device_of(model)
    logits, feats = [], []
    for start in range(0, len(data), batch_size):
        out, f = model(normalize(data.images[start : start + batch_size]).to(device), with_features=True)
        logits.append(out.cpu())
        feats.append(f.cpu())
    return torch.cat(logits), torch.cat(feats), data.labels


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: ImageData, batch_size: int = 256) -> tuple[int, int]:
    """(correct, total) with the plain head."""
    model.eval()
    device = _device_of(model)
    correct = 0
    for start in range(0, len(data), batch_size):
        out = model(normalize(data.images[start : start + batch_size]).to(device))
        correct += int((out.argmax(1).cpu() == data.labels[start : start + batch_size]).sum())
    return correct, len(data)


@torch.no_grad()
def evaluate_per_class(
    model: torch.nn.Module, data: ImageData, num_classes: int, batch_size: int = 256
) -> tuple[np.ndarray, np.ndarray]:
    """(correct per class, test images per class) with the plain head: the predictions ``evaluate`` counts."""
    model.eval()
    device = _device_of(model)
    correct = np.zeros(num_classes, dtype=np.int64)
    for start in range(0, len(data), batch_size):
        out = model(normalize(data.images[start : start + batch_size]).to(device))
        labels = data.labels[start : start + batch_size]
        hits = labels[out.argmax(1).cpu() == labels].numpy()
        correct += np.bincount(hits, minlength=num_classes)[:num_classes]
    return correct, np.bincount(data.labels.numpy(), minlength=num_classes)[:num_classes].astype(np.int64)


def fedtopo_upload(
    model, data: ImageData, num_classes: int, source: str, max_samples: int, seed: int
) -> dict[str, np.ndarray]:
    """What a FedTopo client sends: pairwise relation scores S (C×C) and its true per-class counts. No weights."""
    check_choice("topo-source", source)
    logits, feats, labels = embed(model, data, max_samples, seed)
    protos, _ = class_prototypes(feats if source == "prototypes" else logits, labels, num_classes)
    counts = class_counts(data, num_classes)
    return {"relations": relation_scores(protos, counts).numpy(), "counts": counts.numpy()}


# -- what a client accepts from the server ------------------------------------------------------------------------
def broadcast_problem(global_arrays: dict, expected: dict[str, tuple]) -> str | None:
    """Why a client must refuse what the server sent (None when it may train with it): only ``expected`` keys (all
    or none), their shapes, finite values within ``BROADCAST_MAX_ABS`` (``clients.broadcast``); a topology is
    non-negative with a zero diagonal and rows summing to 1; ``has`` flags are 0 or 1. Checked before the model is
    touched, so a poisoned broadcast can never reach the saved model."""
    if not global_arrays:
        return None
    problem = shapes_problem(global_arrays, expected) or values_problem(global_arrays, BROADCAST_MAX_ABS)
    if problem:
        return problem
    topology = global_arrays.get("topology")
    if topology is not None:
        topology = np.asarray(topology, dtype=np.float64)
        if (topology < 0).any() or np.any(np.diag(topology) != 0) or not np.allclose(topology.sum(1), 1, atol=1e-3):
            return "broadcast 'topology' is not row-stochastic over the other classes"
    has = global_arrays.get("has")
    if has is not None and not np.isin(np.asarray(has), (0.0, 1.0)).all():
        return "broadcast 'has' flags are not 0/1"
    return None


def model_is_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in model.state_dict().values() if v.is_floating_point())


def fedtopo_loss(global_arrays: dict, beta: float):
    """Topology-guided CE against the broadcast R̄ (absent in a message = plain CE)."""
    topology = global_arrays.get("topology")
    if topology is None:
        return lambda logits, feats, labels: F.cross_entropy(logits, labels)
    topology = torch.from_numpy(np.asarray(topology, dtype=np.float32))
    return lambda logits, feats, labels: topology_loss(logits, labels, topology.to(logits.device), beta)
