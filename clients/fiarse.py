"""FIARSE client step: train the full model under the unstructured magnitude mask ``|w| >= threshold``.

The update is FIARSE's threshold-controlled one, as its reference code computes it: the forward pass uses
``w * 1{|w| >= threshold}`` with the mask recomputed from the current weights at every step (the threshold is the
server's, fixed for the round), and the gradient of a weight is the gradient of its masked value times the mask
(``masked_weight_grad``). The reference's mask function also defines a surrogate derivative, ``2t / (|w| + t)^2``,
but its forward returns a boolean tensor, which autograd never differentiates: that derivative is never applied, and
the rule above is what the reference trains with (checked by ``tests/test_fiarse.py``). A kept weight that falls
below the threshold during the round drops out of the forward pass and gets no gradient from then on; an element
outside the round's mask (sent as zero) stays out.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from torch.nn.utils import parametrize

from clients.feast import SubnetPlan, train_subnets
from clients.local_training import LocalSettings
from fl_app.data.images import ImageData
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import count_macs
from fl_app.run.costs import model_train_costs
from fl_app.supernet.magnitude_masks import element_macs, kept_macs, magnitude_mask


class MagnitudeMask(nn.Module):
    """``w * 1{|w| >= threshold}``: its gradient with respect to ``w`` is the incoming gradient times the mask."""

    def __init__(self, threshold: float):
        super().__init__()
        self.threshold = threshold

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * (weight.abs() >= self.threshold)


def masked_weight_grad(weight: torch.Tensor, grad_of_masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """The rule on its own: the gradient a weight gets from the gradient of its masked value."""
    return grad_of_masked * (weight.abs() >= threshold)


def train_masked(model: ElasticResNet, threshold: float, data: ImageData, settings: LocalSettings) -> dict:
    """Local training of ``model`` (the full model) under the magnitude mask; the model's tensors keep their trained
    values, masked or not (the server reads only what the round's mask kept). Returns ``train_subnets``' metrics."""
    names = sorted(element_macs(model.cfg))
    for name in names:
        module_name, tensor = name.rsplit(".", 1)
        parametrize.register_parametrization(model.get_submodule(module_name), tensor, MagnitudeMask(threshold))
    try:
        return train_subnets(model, SubnetPlan(model.bounds, None, []), data, settings)
    finally:
        for name in names:
            module_name, tensor = name.rsplit(".", 1)
            # the trained tensor itself, not its masked value
            parametrize.remove_parametrizations(model.get_submodule(module_name), tensor, leave_parametrized=False)


def fiarse_settings(run, settings: LocalSettings) -> LocalSettings:
    """The local optimiser's settings: the run's (shared by every method), or under ``fiarse-mapping = "reference"``
    the FEAST repository's FIARSE trainer's plain SGD (no momentum, no weight decay: the paper's Table 3)."""
    if run["fiarse-mapping"] == "reference":
        return replace(settings, momentum=0.0, weight_decay=0.0)
    return settings


def masked_train_costs(cfg, received: dict, threshold: float, samples: int) -> dict:
    """Reply cost metrics of a masked round in both conventions: ``train-flops``, ``samples`` samples through the
    MACs the round's mask keeps (unstructured sparsity counted as the compute it saves, as the method assumes), and
    ``train-flops-dense``, through the full model's MACs (what the dense tensors execute: the FEAST repository's
    convention for matching FIARSE's compute)."""
    costs = element_macs(cfg)
    macs = kept_macs(magnitude_mask(received, costs, threshold), costs)
    return model_train_costs(macs, macs, samples, dense_step_macs=count_macs(cfg, cfg.max_subnet()))
