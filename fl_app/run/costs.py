"""What a client's local training cost, for every method family: analytic FLOPs of the forward and backward passes
it ran, the MACs of the largest model it trained, and its process's peak memory (and CUDA peak where a GPU is used);
and the run config's shape of local training (``LocalTraining``) the server costs a round with. How a supernet
plan's MACs are counted is the supernet package's (``fl_app.supernet.training_costs``).

FLOPs: one multiply-accumulate is 2 FLOPs; a backward pass costs about twice its forward pass (gradients with respect
to activations and to weights), so one trained sample costs 3 forward passes, 6 FLOPs per MAC of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fl_app.run.outputs import memory_mb

FLOPS_PER_TRAINED_MAC = 6


def training_flops(step_macs: float, samples: int) -> float:
    """FLOPs of training ``samples`` samples through models whose forward MACs per sample sum to ``step_macs``."""
    return float(FLOPS_PER_TRAINED_MAC * step_macs * samples)


@dataclass(frozen=True)
class LocalTraining:
    """The run config's shape of a client's local training: ``epochs``, at most ``max_steps`` steps (0 = no cap),
    batches of ``batch_size``. A step trains ``batch_size`` samples as costed (``training_flops``)."""

    epochs: int
    max_steps: int
    batch_size: int

    @staticmethod
    def of(run) -> "LocalTraining":
        return LocalTraining(run["local-epochs"], run["max-local-steps"], run["batch-size"])

    def steps(self, num_samples: int) -> int:
        """The steps a client holding ``num_samples`` takes in a round: what ``clients.local_training``'s
        ``local_batches`` yields (an epoch's last batch of one sample skipped), no more than ``max_steps``."""
        if self.batch_size < 2:  # every batch is a single sample: all skipped
            return 0
        full, rest = divmod(num_samples, self.batch_size)
        steps = self.epochs * (full + (rest >= 2))
        return min(steps, self.max_steps) if self.max_steps else steps

    def flops(self, step_macs: float, steps: int) -> float:
        """FLOPs of ``steps`` steps through models of ``step_macs`` forward MACs (as a client costs them)."""
        return training_flops(step_macs, steps * self.batch_size)


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
