"""ScaleFL client: train the routed level with every exit it holds, the shallower exits distilled from the deepest.

The loss (Ilhan et al., CVPR 2023, Eq. 5) over the ``l`` exits of a level, shallowest first:
``1 / (l (l + 1)) * sum_i i * (CE(exit_i, y) + beta * tau^2 * KL(softmax(exit_l / tau) || softmax(exit_i / tau)))``
with the deepest exit as the (detached) teacher and no KL term for itself; ``beta = 0.1`` and ``tau = 3`` (the
paper's image-classification setting).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Message, MetricRecord, RecordDict

from clients.local_training import GRAD_CLIP_NORM, LocalSettings, MomentumSGD, augmented_batches
from fl_app.data.augment import soft_cross_entropy
from fl_app.data.images import ImageData
from fl_app.models.early_exit import EarlyExitResNet, level_index, scalefl_levels
from fl_app.run.costs import model_train_costs
from fl_app.run.device import preferred_device
from fl_app.run.payload import state_to_record
from fl_app.run.records import ARRAYS_RECORD, METRICS_RECORD
from fl_app.run.seeds import derived_seed
from fl_app.supernet.shared_setup import client_data
from fl_app.supernet.slicing import slice_state

KD_WEIGHT = 0.1  # beta: weight of the distillation term
TEMPERATURE = 3.0  # tau


def self_distillation_loss(outputs: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """ScaleFL's loss over the exits' logits ``outputs`` (shallowest first) against (soft) ``targets``."""
    count = len(outputs)
    teacher = F.softmax(outputs[-1].detach() / TEMPERATURE, dim=1)
    total = outputs[-1].new_zeros(())
    for i, logits in enumerate(outputs, start=1):
        term = soft_cross_entropy(logits, targets)
        if i < count:
            log_student = F.log_softmax(logits / TEMPERATURE, dim=1)
            kl = F.kl_div(log_student, teacher, reduction="batchmean")
            term = term + KD_WEIGHT * TEMPERATURE**2 * kl
        total = total + i * term
    return total / (count * (count + 1))


def train_exits(model: EarlyExitResNet, data: ImageData, settings: LocalSettings) -> dict:
    """Local training of one level with its exits; the same batches, augmentation and optimiser as every other
    supernet-family client. Returns metrics (train-loss is the deepest exit's cross-entropy, as other methods
    report their largest subnet's)."""
    generator = torch.Generator().manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    device = preferred_device()
    model.to(device)
    optimizer = MomentumSGD(model.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    model.train()
    steps, loss_sum = 0, 0.0
    for images, targets in augmented_batches(data, settings, generator, rng, model.cfg.n_classes, device):
        outputs = model(images)
        self_distillation_loss(outputs, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP_NORM, foreach=True)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        loss_sum += soft_cross_entropy(outputs[-1].detach(), targets).item()
    model.cpu()
    return {"train-loss": loss_sum / max(steps, 1), "local-steps": steps}


def train_scalefl(msg: Message, instruction, run, pid: int, num: int, started: float) -> Message:
    """One round of a ScaleFL client on what ``clients.supernet_instruction.read_instruction`` accepted: the routed
    level (its subnet is the assigned one) with its exits, trained and sent back whole."""
    cfg, received, rule = instruction.cfg, instruction.received, run["scalefl-levels"]
    index = level_index(cfg, instruction.arch, rule)
    model = EarlyExitResNet(cfg, index, rule)
    # static BatchNorm: the running statistics are not routed; training normalises with the batch's statistics
    model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()}, strict=False)
    data = client_data(run, pid, num, instruction.partition_budgets)
    labels = sorted(int(c) for c in torch.unique(data.labels))
    settings = LocalSettings.from_run(run, instruction.lr, derived_seed(run["seed"], instruction.server_round, pid))
    metrics = train_exits(model, data, settings)
    trained = slice_state(model.state_dict(), {k: v.shape for k, v in received.items()})
    level = scalefl_levels(cfg, rule)[index]
    reply = RecordDict(
        {
            ARRAYS_RECORD: state_to_record(trained, instruction.dtype),
            METRICS_RECORD: MetricRecord(
                {
                    "num-examples": len(data),
                    "partition-id": pid,
                    "labels": labels,
                    **metrics,
                    **model_train_costs(level.macs, level.macs, metrics["local-steps"] * settings.batch_size),
                    "client-seconds": time.perf_counter() - started,
                }
            ),
        }
    )
    return Message(reply, reply_to=msg)
