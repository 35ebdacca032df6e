"""Elastic ResNet (Once-for-All style dynamic ops), readable top to bottom.

The module holds the tensors of ``bounds`` (by default the whole supernet). ``forward(x, arch)`` runs any subnet
``arch`` inside those bounds by using prefix slices of every weight: the first ``c_out`` filters, the first ``c_in``
input channels, the first ``1 + d`` blocks of a stage. A standalone extracted subnet is the same class with
``bounds = arch``, so an extracted model and the supernet share one forward implementation.

Block (as in the reference supernet): conv3x3 in->mid (carries the stage's stride), BN, ReLU, conv3x3 mid->out, BN,
plus a shortcut that is (avg-pool, conv1x1 in->out, BN) on a stage's first block and identity otherwise; ReLU after
the sum. mid = make_divisible(out * e, 8).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fl_app.models.supernet_space import Subnet, SupernetConfig


def prefix(tensor: torch.Tensor, *sizes: int) -> torch.Tensor:
    """The leading ``sizes`` of ``tensor``'s first dimensions: the tensor itself when that is all of it, since the
    backward of a slice view copies the gradient into a zero tensor of the full size even when nothing is cut."""
    if tensor.shape[: len(sizes)] == sizes:
        return tensor
    return tensor[tuple(slice(0, size) for size in sizes)]


class DynamicConv2d(nn.Module):
    """Conv without bias whose output channels are chosen per call and input channels follow the input."""

    def __init__(self, max_in: int, max_out: int, kernel_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_out, max_in, kernel_size, kernel_size))
        if not self.weight.is_meta:  # a meta tensor has no values; its normal_ would import torch._dynamo (seconds)
            nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
        self.rate = 1.0  # HeteroFL's scaler: a width-r model divides conv outputs by r while training

    def forward(self, x: torch.Tensor, out_channels: int, stride: int = 1) -> torch.Tensor:
        weight = prefix(self.weight, out_channels, x.shape[1])
        out = F.conv2d(x, weight, stride=stride, padding=weight.shape[-1] // 2)
        return out / self.rate if self.training and self.rate != 1.0 else out


class DynamicBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over the leading ``x.shape[1]`` channels; running statistics of that prefix are updated in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            # momentum=None means a cumulative average, which BN recalibration relies on
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or self.running_mean is None
        return F.batch_norm(
            x,
            prefix(self.running_mean, c) if self.running_mean is not None else None,
            prefix(self.running_var, c) if self.running_var is not None else None,
            prefix(self.weight, c),
            prefix(self.bias, c),
            use_batch_stats,
            factor,
            self.eps,
        )


class Block(nn.Module):
    def __init__(self, max_in: int, max_mid: int, max_out: int, stride: int, projection: bool):
        super().__init__()
        self.stride = stride
        self.conv1, self.bn1 = DynamicConv2d(max_in, max_mid, 3), DynamicBatchNorm2d(max_mid)
        self.conv2, self.bn2 = DynamicConv2d(max_mid, max_out, 3), DynamicBatchNorm2d(max_out)
        nn.init.zeros_(self.bn2.weight)  # each residual branch starts as identity: faster, stabler early training
        if projection:
            self.shortcut_conv, self.shortcut_bn = DynamicConv2d(max_in, max_out, 1), DynamicBatchNorm2d(max_out)
        else:
            self.shortcut_conv = None

    def forward(self, x: torch.Tensor, mid: int, out: int) -> torch.Tensor:
        # in place where autograd allows it (BatchNorm's backward reads its input, not its output): fewer
        # allocations per step, the same values
        h = F.relu(self.bn1(self.conv1(x, mid, self.stride)), inplace=True)
        h = self.bn2(self.conv2(h, out))
        if self.shortcut_conv is None:
            shortcut = x
        else:
            pooled = F.avg_pool2d(x, self.stride) if self.stride > 1 else x
            shortcut = self.shortcut_bn(self.shortcut_conv(pooled, out))
        return F.relu(h.add_(shortcut), inplace=True)


class ElasticResNet(nn.Module):
    """The supernet, or any sub-supernet of it: holds the tensors of ``bounds`` (the whole supernet by default) and runs
    any subnet inside them with ``forward(x, arch)``, every layer cut to a prefix of its weights (see the module
    docstring). Clients build one of the bounds they were routed and train the subnets they planned in it; the
    server builds the whole supernet for its global model; an extracted subnet is one with ``bounds = arch``
    (``save_standalone`` / ``load_standalone``). ``set_width_scaler`` sets HeteroFL's output scaling for a width-rate
    model while it trains."""

    # activations in channels-last layout: oneDNN's convolutions and BatchNorm then skip layout reorders (faster on
    # CPU, see experiments/benchmarks/bench_train.py); weights stay NCHW, so state dicts and payloads are unchanged
    memory_format = torch.channels_last

    def __init__(self, cfg: SupernetConfig, bounds: Subnet | None = None):
        super().__init__()
        self.cfg = cfg
        self.bounds = bounds or cfg.max_subnet()
        cfg.check_subnet(self.bounds)

        stem = cfg.stem_channels(self.bounds)
        self.stem_conv = DynamicConv2d(cfg.initial_input_channels, stem, 3)
        self.stem_bn = DynamicBatchNorm2d(stem)

        self.stages = nn.ModuleList()
        c_in = stem
        for s in range(cfg.num_stages):
            out, mid = cfg.stage_channels(self.bounds, s), cfg.mid_channels(self.bounds, s)
            blocks = nn.ModuleList()
            for b in range(1 + self.bounds.d[s]):
                stride = cfg.stage_downsample_factors[s] if b == 0 else 1
                blocks.append(Block(c_in if b == 0 else out, mid, out, stride, projection=b == 0))
            self.stages.append(blocks)
            c_in = out
        self.classifier = nn.Linear(c_in, cfg.n_classes)

    def forward(self, x: torch.Tensor, arch: Subnet | None = None) -> torch.Tensor:
        arch = arch or self.bounds
        cfg = self.cfg
        x = x.contiguous(memory_format=self.memory_format)
        x = F.relu(self.stem_bn(self.stem_conv(x, cfg.stem_channels(arch), cfg.stem_stride)), inplace=True)
        for s, blocks in enumerate(self.stages):
            out, mid = cfg.stage_channels(arch, s), cfg.mid_channels(arch, s)
            for block in blocks[: 1 + arch.d[s]]:
                x = block(x, mid, out)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        weight = self.classifier.weight
        return F.linear(x, weight if weight.shape[1] == x.shape[1] else weight[:, : x.shape[1]], self.classifier.bias)

    def set_width_scaler(self, rate: float) -> None:
        for module in self.modules():
            if isinstance(module, DynamicConv2d):
                module.rate = rate

    # -- standalone subnets -------------------------------------------------------------------------------------
    def save_standalone(self, path: str | Path) -> None:
        """Save this model so that ``ElasticResNet.load_standalone`` (or plain ``torch.load``) restores it."""
        torch.save(
            {"supernet": self.cfg.to_dict(), "arch": self.bounds.to_dict(), "state_dict": self.state_dict()}, path
        )

    @staticmethod
    def load_standalone(path: str | Path) -> "ElasticResNet":
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model = ElasticResNet(SupernetConfig.from_dict(blob["supernet"]), Subnet.from_dict(blob["arch"]))
        model.load_state_dict(blob["state_dict"])
        return model
