"""Client side of the model-heterogeneous baselines: what each uploads and the loss it trains with.

local (nothing shared), LG-FedAvg (the shared-size head), FD (per-class mean logits seen in training; distillation to
the global soft label), FedProto and FedTGP (per-class mean features; MSE to the global prototype).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from clients.fedtopo import class_counts, class_prototypes, embed


def plain_ce(logits, feats, labels):
    return F.cross_entropy(logits, labels)


def head_upload(model) -> dict[str, np.ndarray]:
    return {
        "head.weight": model.head.weight.detach().cpu().numpy().copy(),
        "head.bias": model.head.bias.detach().cpu().numpy().copy(),
    }


def load_head(model, global_arrays: dict) -> None:
    if "head.weight" in global_arrays:
        with torch.no_grad():
            model.head.weight.copy_(torch.from_numpy(np.asarray(global_arrays["head.weight"])))
            model.head.bias.copy_(torch.from_numpy(np.asarray(global_arrays["head.bias"])))


def class_means_upload(model, data, num_classes: int, max_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Per-class mean features (FedProto/FedTGP prototypes, eval mode) on the capped sample, with the true
    per-class counts of the training split."""
    _, feats, labels = embed(model, data, max_samples, seed)
    means, _ = class_prototypes(feats, labels, num_classes, normalise=False)
    return {"means": means.numpy(), "counts": class_counts(data, num_classes).numpy()}


def _global(global_arrays: dict, key: str):
    if key not in global_arrays:
        return None, None
    return (
        torch.from_numpy(np.asarray(global_arrays[key], dtype=np.float32)),
        torch.from_numpy(np.asarray(global_arrays["has"]) > 0),
    )


class FdLoss:
    """FD's client objective, CE + λ·CE(softmax(z), softmax(global mean logits of y)), that also records the
    per-class mean of the logits it sees during local training (what FD uploads: no extra pass over the data).

    As in the FD paper and HtFLlib ``clientfd.py``: the teacher is the plain softmax of the global per-label mean
    logit, the distillation term is averaged over the whole batch, and samples whose label has no global logit yet
    contribute no distillation term."""

    def __init__(self, global_arrays: dict, lam: float, num_classes: int):
        soft, has = _global(global_arrays, "soft-labels")
        self.targets = None if soft is None else torch.softmax(soft, dim=1)
        self.has, self.lam = has, lam
        self.sums = torch.zeros(num_classes, num_classes)
        self.seen = torch.zeros(num_classes)

    def __call__(self, logits, feats, labels):
        with torch.no_grad():
            self.sums.index_add_(0, labels.cpu(), logits.detach().float().cpu())
            self.seen += torch.bincount(labels.cpu(), minlength=len(self.seen)).float()
        loss = F.cross_entropy(logits, labels)
        if self.targets is None:
            return loss
        keep = self.has.to(logits.device)[labels].float()
        distill = -(self.targets.to(logits.device)[labels] * F.log_softmax(logits, dim=1)).sum(1)
        return loss + self.lam * (keep * distill).mean()

    def upload(self, true_counts: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-class mean training logits and, for the classes seen in training, the true class counts."""
        means = self.sums / self.seen.clamp(min=1).unsqueeze(1)
        return {"means": means.numpy(), "counts": torch.where(self.seen > 0, true_counts, 0.0).numpy()}


def proto_loss(global_arrays: dict, lam: float):
    """CE + λ·MSE(feature, global prototype of y) on samples whose class has a global prototype."""
    protos, has = _global(global_arrays, "prototypes")
    if protos is None:
        return plain_ce

    def loss(logits, feats, labels):
        keep = has.to(feats.device)[labels].float()
        mse = ((feats - protos.to(feats.device)[labels]) ** 2).mean(1)
        return F.cross_entropy(logits, labels) + lam * (keep * mse).sum() / keep.sum().clamp(min=1)

    return loss
