"""What every client's local training shares: its settings from the run config and the order of its batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import torch

from fl_app.data.augment import crop_flip, mix_batch, normalize, rand_augment
from fl_app.data.images import ImageData, take_rows

GRAD_CLIP_NORM = 10.0


@dataclass(kw_only=True)
class LocalSettings:
    """A client's local training for one round: its shape (epochs, step cap, batch size), optimiser, in-place KD
    ratio, augmentation, and the seed of its batches and draws. Built by keyword only: a dozen fields of like types."""

    epochs: int
    max_steps: int  # 0 = no cap
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    kd_ratio: float
    crop_flip: bool
    randaugment: bool
    mixup_alpha: float
    cutmix_alpha: float
    seed: int

    @staticmethod
    def from_run(run, lr: float, seed: int) -> "LocalSettings":
        return LocalSettings(
            epochs=run["local-epochs"],
            max_steps=run["max-local-steps"],
            batch_size=run["batch-size"],
            lr=lr,
            momentum=run["momentum"],
            weight_decay=run["weight-decay"],
            kd_ratio=run["kd-ratio"],
            crop_flip=run["crop-flip"],
            randaugment=run["randaugment"],
            mixup_alpha=run["mixup-alpha"],
            cutmix_alpha=run["cutmix-alpha"],
            seed=seed,
        )


def local_batches(num_samples: int, settings: LocalSettings, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices of each training step: every epoch a fresh permutation drawn from ``generator``, cut into batches of
    ``batch_size``; a final batch of one sample is skipped (BatchNorm needs more than one), and no batch comes after
    ``max_steps`` (0 = no cap). Every epoch's permutation is drawn even once the cap is reached, and only when the
    caller asks for the next batch: callers that draw augmentation from the same generator see the same sequence
    as a plain nested loop over epochs and batches."""
    steps = 0
    for _ in range(settings.epochs):
        order = torch.randperm(num_samples, generator=generator)
        for start in range(0, num_samples, settings.batch_size):
            if settings.max_steps and steps >= settings.max_steps:
                break
            idx = order[start : start + settings.batch_size]
            if len(idx) < 2:  # BatchNorm needs more than one sample (batch_size >= 2: only an epoch's last batch)
                continue
            yield idx
            steps += 1


def augmented_batches(
    data: ImageData,
    settings: LocalSettings,
    generator: torch.Generator,
    rng: np.random.Generator,
    num_classes: int,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, soft targets) of each training step on ``device``: the batch of ``local_batches``, cropped and
    flipped (``generator``), RandAugmented and mixed (``rng``). Augmentation stays on the CPU, where it is seeded;
    batches are made only when asked for, so draws a caller makes from ``rng`` between steps keep their order."""
    for idx in local_batches(len(data), settings, generator):
        images, labels = take_rows(data.images, idx), take_rows(data.labels, idx)
        if settings.crop_flip:
            images = crop_flip(images, generator)
        if settings.randaugment:
            images = rand_augment(images, int(rng.integers(2**31)))
        images, targets = mix_batch(
            normalize(images), labels, num_classes, settings.mixup_alpha, settings.cutmix_alpha, rng
        )
        yield images.to(device), targets.to(device)


class MomentumSGD:
    """SGD with momentum and weight decay, the arithmetic of ``torch.optim.SGD(..., foreach=True)`` (dampening 0, no
    Nesterov) op for op, so training is bit-identical (tested). Creating a ``torch.optim`` optimizer imports
    ``torch._dynamo`` (seconds, in every fresh client process); this does not.

    Parameters without a gradient in a step are left alone and keep their momentum; a momentum buffer starts as the
    first gradient it sees, as in ``torch.optim.SGD``."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, momentum: float, weight_decay: float):
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: dict[torch.nn.Parameter, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> None:
        params = [p for p in self.params if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        if self.momentum != 0:
            bufs = [self.buffers.get(p) for p in params]
            # buffers already running take the foreach ops together (also when others start this step)
            running = [i for i, buf in enumerate(bufs) if buf is not None]
            if running:
                torch._foreach_mul_([bufs[i] for i in running], self.momentum)
                torch._foreach_add_([bufs[i] for i in running], [grads[i] for i in running], alpha=1.0)
            for i, p in enumerate(params):
                if bufs[i] is None:
                    bufs[i] = self.buffers[p] = grads[i].detach().clone()
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
