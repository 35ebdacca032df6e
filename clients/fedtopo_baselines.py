"""Client side of the model-heterogeneous baselines: what each uploads and the loss it trains with.

local (nothing shared), LG-FedAvg (the shared-size head), FD (per-class mean logits; distillation to the global soft
label), FedProto and FedTGP (per-class mean features; MSE to the global prototype).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from clients.fedtopo import class_counts, class_prototypes, embed


def plain_ce(logits, feats, labels):
    return F.cross_entropy(logits, labels)


def head_upload(model) -> dict[str, np.ndarray]:
    return {"head.weight": model.head.weight.detach().cpu().numpy().copy(),
            "head.bias": model.head.bias.detach().cpu().numpy().copy()}


def load_head(model, global_arrays: dict) -> None:
    if "head.weight" in global_arrays:
        with torch.no_grad():
            model.head.weight.copy_(torch.from_numpy(np.asarray(global_arrays["head.weight"])))
            model.head.bias.copy_(torch.from_numpy(np.asarray(global_arrays["head.bias"])))


def class_means_upload(model, data, num_classes: int, of: str, max_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Per-class mean logits (``of='logits'``, FD) or mean features (``'features'``, FedProto/FedTGP) on the capped
    sample, with the true per-class counts of the training split."""
    logits, feats, labels = embed(model, data, max_samples, seed)
    means, _ = class_prototypes(logits if of == "logits" else feats, labels, num_classes, normalise=False)
    return {"means": means.numpy(), "counts": class_counts(data, num_classes).numpy()}


def _global(global_arrays: dict, key: str):
    if key not in global_arrays:
        return None, None
    return (torch.from_numpy(np.asarray(global_arrays[key], dtype=np.float32)),
            torch.from_numpy(np.asarray(global_arrays["has"]) > 0))


def fd_loss(global_arrays: dict, lam: float):
    """CE + λ·CE(softmax(z), softmax(global mean logits of y)) on samples whose class has a global soft label."""
    soft, has = _global(global_arrays, "soft-labels")
    if soft is None:
        return plain_ce
    targets_of = torch.softmax(soft, dim=1)

    def loss(logits, feats, labels):
        keep = has.to(logits.device)[labels].float()
        distill = -(targets_of.to(logits.device)[labels] * F.log_softmax(logits, dim=1)).sum(1)
        return F.cross_entropy(logits, labels) + lam * (keep * distill).sum() / keep.sum().clamp(min=1)
    return loss


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
