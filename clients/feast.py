"""FEAST client: train the local-max, the min and a random in-between subnet in one step (sandwich + in-place KD).

The baselines that assign one subnet run the same step on that subnet alone. What every supernet-family client
accepts from the server is ``clients.supernet_instruction``.
"""

from __future__ import annotations

import numpy as np
import torch

from clients.local_training import GRAD_CLIP_NORM, LocalSettings, MomentumSGD, augmented_batches
from fl_app.data.augment import soft_cross_entropy
from fl_app.data.images import ImageData
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.device import preferred_device
from fl_app.supernet.subnets import SubnetPlan, plan_subnets  # noqa: F401 (the plan clients train)


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
    for images, targets in augmented_batches(data, settings, generator, rng, num_classes, device):
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
