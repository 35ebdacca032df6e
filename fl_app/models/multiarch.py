"""Heterogeneous backbones for model-heterogeneous FL: client i gets ``family[i % backbones]`` (all 8 by default;
``backbones = 1`` puts every client on the family's first one, CNN-4, the homogeneous control).

Every model is ``extractor -> Linear projection to feature-dim -> Linear head``: the extractor differs per
architecture, the projection makes feature spaces the same *size* (not aligned), and the head is the one part
whose shape is shared by all clients (what LG-FedAvg averages).

Two families by name: ``paper`` (CNN-4, GoogLeNet, MobileNetV2, ResNet-18/34/50/101/152 from torchvision, random
init) and ``cpu`` (eight small, genuinely different architectures that train in minutes on one core).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

MODEL_FAMILIES = ("cpu", "paper")
BACKBONES_PER_FAMILY = (
    8  # each family's number of architectures (tested); the most the run-config key ``backbones`` takes
)


class MultiArchNet(nn.Module):
    def __init__(self, name: str, extractor: nn.Module, extractor_dim: int, feature_dim: int, num_classes: int):
        super().__init__()
        self.name = name
        self.extractor = extractor
        self.projection = nn.Linear(extractor_dim, feature_dim)
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(torch.flatten(self.extractor(x), 1))

    def forward(self, x: torch.Tensor, with_features: bool = False):
        f = self.features(x)
        logits = self.head(f)
        return (logits, f) if with_features else logits


def _conv_bn(cin, cout, k=3, stride=1, groups=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


def cnn4(width: int = 32) -> tuple[nn.Module, int]:
    """The 4-layer CNN: four conv-BN-ReLU blocks, the first three followed by 2x2 max-pooling, global pooling."""
    w = [width, 2 * width, 4 * width, 8 * width]
    layers = []
    for i, (cin, cout) in enumerate(zip([3] + w[:-1], w)):
        layers.append(_conv_bn(cin, cout))
        if i < 3:
            layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1)), w[-1]


class _Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            _conv_bn(cin, cout, stride=stride), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class _Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return x + self.fn(x)


def _lenet():
    return nn.Sequential(
        nn.Conv2d(3, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2)
    ), 32 * 5 * 5


def _vgg_mini():
    return nn.Sequential(
        _conv_bn(3, 16),
        _conv_bn(16, 16),
        nn.MaxPool2d(2),
        _conv_bn(16, 32),
        _conv_bn(32, 32),
        nn.MaxPool2d(2),
        _conv_bn(32, 64),
        nn.AdaptiveAvgPool2d(1),
    ), 64


def _resnet_mini():
    return nn.Sequential(
        _conv_bn(3, 16, stride=2), _Basic(16, 16, 1), _Basic(16, 32, 2), _Basic(32, 64, 2), nn.AdaptiveAvgPool2d(1)
    ), 64


def _mobile_mini():
    def dw(cin, cout, stride):  # depthwise-separable block (MobileNet-v1 style)
        return nn.Sequential(_conv_bn(cin, cin, stride=stride, groups=cin), _conv_bn(cin, cout, k=1))

    return nn.Sequential(
        _conv_bn(3, 16, stride=1), dw(16, 32, 2), dw(32, 64, 2), dw(64, 96, 2), nn.AdaptiveAvgPool2d(1)
    ), 96


def _convmixer_mini(dim: int = 48, depth: int = 3):
    """ConvMixer: 4x4 patch embedding, then depthwise (spatial) and pointwise (channel) mixing."""
    blocks = [
        nn.Sequential(
            _Residual(nn.Sequential(nn.Conv2d(dim, dim, 5, padding=2, groups=dim), nn.GELU(), nn.BatchNorm2d(dim))),
            nn.Conv2d(dim, dim, 1),
            nn.GELU(),
            nn.BatchNorm2d(dim),
        )
        for _ in range(depth)
    ]
    return nn.Sequential(
        nn.Conv2d(3, dim, 4, stride=4), nn.GELU(), nn.BatchNorm2d(dim), *blocks, nn.AdaptiveAvgPool2d(1)
    ), dim


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU()), 128


def _wide_shallow():
    """One wide strided 5x5 layer and a 3x3 one: little depth, many channels."""
    return nn.Sequential(_conv_bn(3, 64, k=5, stride=2), nn.MaxPool2d(2), _conv_bn(64, 96), nn.AdaptiveAvgPool2d(1)), 96


CPU_FAMILY = {
    "cnn4-mini": lambda: cnn4(16),
    "lenet": _lenet,
    "vgg-mini": _vgg_mini,
    "resnet-mini": _resnet_mini,
    "mobile-mini": _mobile_mini,
    "convmixer-mini": _convmixer_mini,
    "mlp": _mlp,
    "wide-shallow": _wide_shallow,
}


def _torchvision(name: str, num_classes: int) -> tuple[nn.Module, int]:
    from torchvision import models

    if name == "googlenet":
        net = models.googlenet(weights=None, aux_logits=False, init_weights=True, num_classes=num_classes)
    else:
        net = getattr(models, name)(weights=None, num_classes=num_classes)
    if name == "mobilenet_v2":
        dim = net.classifier[-1].in_features
        net.classifier = nn.Identity()
    else:
        dim = net.fc.in_features
        net.fc = nn.Identity()
    return net, dim


PAPER_FAMILY = {
    "cnn4": lambda c: cnn4(32),
    **{
        name: (lambda c, n=name: _torchvision(n, c))
        for name in ("googlenet", "mobilenet_v2", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
    },
}


def family_names(family: str) -> list[str]:
    if family == "cpu":
        return list(CPU_FAMILY)
    if family == "paper":
        return list(PAPER_FAMILY)
    raise ValueError(f"model-family='{family}': allowed values are {list(MODEL_FAMILIES)}")


def architecture_of(family: str, client: int, backbones: int = BACKBONES_PER_FAMILY) -> str:
    """Client ``client``'s backbone: the family's first ``backbones`` architectures in turn."""
    names = family_names(family)
    if not (isinstance(backbones, int) and 1 <= backbones <= len(names)):
        raise ValueError(f"backbones={backbones!r}: allowed values are integers in [1, {len(names)}]")
    return names[client % backbones]


def build_model(family: str, name: str, num_classes: int, feature_dim: int) -> MultiArchNet:
    if name not in family_names(family):
        raise ValueError(f"model '{name}' is not in model-family='{family}': {family_names(family)}")
    extractor, dim = CPU_FAMILY[name]() if family == "cpu" else PAPER_FAMILY[name](num_classes)
    return MultiArchNet(name, extractor, dim, feature_dim, num_classes)


def client_model(
    family: str, client: int, num_classes: int, feature_dim: int, backbones: int = BACKBONES_PER_FAMILY
) -> MultiArchNet:
    return build_model(family, architecture_of(family, client, backbones), num_classes, feature_dim)


@lru_cache(maxsize=None)
def forward_macs(family: str, name: str, num_classes: int, feature_dim: int, image_shape: tuple[int, ...]) -> float:
    """Multiply-accumulates of one sample's forward pass through model ``name``, counted by PyTorch's FLOP counter
    (convolutions and matrix products; 2 FLOPs per MAC) on a copy built on the meta device: no weights, no time,
    and no draw from the random generators training uses."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(family, name, num_classes, feature_dim)
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros((1, *image_shape), device="meta"))
    return counter.get_total_flops() / 2
