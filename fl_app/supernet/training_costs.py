"""What a client's local training cost: analytic FLOPs of the forward and backward passes it ran, the MACs of the
largest subnet it trained, and its process's peak memory (and CUDA peak where a GPU is used).

FLOPs: one multiply-accumulate is 2 FLOPs; a backward pass costs about twice its forward pass (gradients with respect
to activations and to weights), so one trained sample costs 3 forward passes, 6 FLOPs per MAC of the subnet.
"""

from __future__ import annotations

import torch

from fl_app.models.supernet_space import SupernetConfig, count_macs
from fl_app.run.outputs import memory_mb

FLOPS_PER_TRAINED_MAC = 6


def training_flops(step_macs: float, samples: int) -> float:
    """FLOPs of training ``samples`` samples through subnets whose forward MACs per sample sum to ``step_macs``."""
    return float(FLOPS_PER_TRAINED_MAC * step_macs * samples)


def train_costs(cfg: SupernetConfig, largest, smallest, between: list, samples: int) -> dict:
    """Reply metrics of one round of local training: every step trains ``largest``, ``smallest`` (when given) and
    one subnet drawn from ``between`` (its expected MACs: the mean over the list)."""
    step_macs = count_macs(cfg, largest) + (count_macs(cfg, smallest) if smallest is not None else 0)
    if between:
        step_macs += sum(count_macs(cfg, arch) for arch in between) / len(between)
    return model_train_costs(step_macs, count_macs(cfg, largest), samples)


def model_train_costs(
    step_macs: float, trained_macs: float, samples: int, dense_step_macs: float | None = None
) -> dict:
    """Reply metrics of one round of local training of any model: FLOPs of ``samples`` samples through steps of
    ``step_macs`` forward MACs, the MACs of the largest model trained, this process's peak memory. A model whose
    counted MACs are not the ones it executes (an unstructured mask, computed densely) also gives
    ``dense_step_macs``: ``train-flops-dense`` is then the FLOPs it executed."""
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
    dense = {} if dense_step_macs is None else {"train-flops-dense": training_flops(dense_step_macs, samples)}
    return {
        "train-flops": training_flops(step_macs, samples),
        **dense,
        "trained-macs": float(trained_macs),
        "peak-rss-mb": memory_mb()[1],
        "cuda-peak-mb": cuda_peak,
    }
