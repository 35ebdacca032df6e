"""Batch augmentation on uint8 image tensors: random crop + flip, RandAugment, Mixup/CutMix. Evaluation uses none."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fl_app.data.images import take_rows

CIFAR_MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
CIFAR_STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N,3,H,W] -> standardised float."""
    return (images.float() / 255.0 - CIFAR_MEAN) / CIFAR_STD


def crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop with zero padding and random horizontal flip, per sample."""
    n, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator)
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.empty_like(images)
    # the draws as Python numbers once (a tensor element read per sample costs more than the copy it steers)
    for i, ((y, x), flip) in enumerate(zip(offsets.tolist(), flips.tolist())):
        crop = padded[i, :, y : y + h, x : x + w]
        out[i] = crop.flip(-1) if flip else crop
    return out


def rand_augment(images: torch.Tensor, seed: int) -> torch.Tensor:
    from torchvision.transforms import v2

    torch.manual_seed(seed)  # torchvision draws from the global generator
    augment = v2.RandAugment()
    return torch.stack([augment(img) for img in images])


def mix_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    mixup_alpha: float,
    cutmix_alpha: float,
    rng: np.random.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Mixup or CutMix draw (chosen with equal odds when both are on) -> (images, soft targets)."""
    targets = F.one_hot(labels, num_classes).float()
    modes = [m for m, a in (("mixup", mixup_alpha), ("cutmix", cutmix_alpha)) if a > 0]
    if not modes:
        return images, targets
    mode = modes[rng.integers(len(modes))]
    perm = torch.as_tensor(rng.permutation(len(labels)))
    lam = float(rng.beta(mixup_alpha, mixup_alpha) if mode == "mixup" else rng.beta(cutmix_alpha, cutmix_alpha))
    if mode == "mixup":
        mixed = lam * images + (1 - lam) * take_rows(images, perm)
    else:
        h, w = images.shape[-2:]
        cut_h, cut_w = int(h * np.sqrt(1 - lam)), int(w * np.sqrt(1 - lam))
        cy, cx = rng.integers(h), rng.integers(w)
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
        mixed = images.clone()
        mixed[:, :, y0:y1, x0:x1] = take_rows(images, perm)[:, :, y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)  # the area actually pasted
    return mixed, lam * targets + (1 - lam) * take_rows(targets, perm)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -(targets * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
