"""FEAST client: train the local-max, the min and a random in-between subnet in one step (sandwich + in-place KD)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clients.local_training import GRAD_CLIP_NORM, LocalSettings, MomentumSGD, local_batches
from fl_app.data.augment import crop_flip, mix_batch, normalize, rand_augment, soft_cross_entropy
from fl_app.data.images import ImageData
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.device import preferred_device
from fl_app.supernet.space import Subnet
from fl_app.supernet.subnets import SubnetCache


@dataclass
class SubnetPlan:
    """The subnets a client trains: ``largest`` is the teacher; ``smallest`` and ``between`` are its students."""

    largest: Subnet
    smallest: Subnet | None
    between: list[Subnet]  # one is drawn per step


def plan_subnets(cache: SubnetCache, budget: float, bounds: Subnet, wanted: tuple[str, ...]) -> SubnetPlan:
    """Local max = the largest cached subnet under ``budget``; min = the smallest; random = any cached subnet
    strictly between them. All must lie inside the routed ``bounds``. Degenerate cases collapse: with a single
    affordable subnet only the max is trained."""
    fitting = [c for c in cache.under(budget) if c.arch.within(bounds)]
    if not fitting:
        raise ValueError(f"no cached subnet fits budget {budget:.0f} MACs inside the routed bounds")
    largest, smallest = fitting[-1], fitting[0]
    min_arch = smallest.arch if "min" in wanted and smallest.arch != largest.arch else None
    between = [c.arch for c in fitting if smallest.macs < c.macs < largest.macs and c.arch != largest.arch]
    return SubnetPlan(largest.arch, min_arch, between if "random" in wanted else [])


def masked(logits: torch.Tensor, logit_mask: torch.Tensor | None) -> torch.Tensor:
    # a large finite negative (not -inf) keeps 0 * log-prob finite in the soft cross-entropy
    return logits if logit_mask is None else logits.masked_fill(~logit_mask, -1e9)


def train_subnets(
    model: ElasticResNet,
    plan: SubnetPlan,
    data: ImageData,
    settings: LocalSettings,
    logit_mask: torch.Tensor | None = None,
) -> dict:
    """Local training; returns metrics. One Mixup/CutMix draw per step is shared by all subnets of that step.

    ``logit_mask`` (bool per class), when given, keeps only those classes' logits (HeteroFL's label masking)."""
    generator = torch.Generator().manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    device = preferred_device()
    model.to(device)
    if logit_mask is not None:
        logit_mask = logit_mask.to(device)
    optimizer = MomentumSGD(model.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    num_classes = model.cfg.n_classes
    model.train()
    steps, loss_sum = 0, 0.0
    for idx in local_batches(len(data), settings, generator):
        images, labels = data.images[idx], data.labels[idx]
        if settings.crop_flip:
            images = crop_flip(images, generator)
        if settings.randaugment:
            images = rand_augment(images, int(rng.integers(2**31)))
        # augmentation stays on the CPU (seeded there); the mixed batch moves to the device
        images, targets = mix_batch(
            normalize(images), labels, num_classes, settings.mixup_alpha, settings.cutmix_alpha, rng
        )
        images, targets = images.to(device), targets.to(device)

        logits = masked(model(images, plan.largest), logit_mask)
        loss = soft_cross_entropy(logits, targets)
        loss.backward()
        teacher = torch.softmax(logits.detach(), dim=1)
        students = [plan.smallest] if plan.smallest is not None else []
        if plan.between:
            students.append(plan.between[rng.integers(len(plan.between))])
        for arch in students:
            out = masked(model(images, arch), logit_mask)
            student_loss = (1 - settings.kd_ratio) * soft_cross_entropy(
                out, targets
            ) + settings.kd_ratio * soft_cross_entropy(out, teacher)
            student_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        loss_sum += loss.item()
    model.cpu()
    return {"train-loss": loss_sum / max(steps, 1), "local-steps": steps}
