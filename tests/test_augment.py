"""Augmentation: seeded, shape-preserving, Mixup/CutMix soft targets consistent with what was mixed."""

from __future__ import annotations

import numpy as np
import torch

from fl_app.data.augment import crop_flip, mix_batch, rand_augment


def _images(n=6):
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_crop_flip_is_seeded_and_moves_pixels():
    x = _images()
    a = crop_flip(x, torch.Generator().manual_seed(1))
    b = crop_flip(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)


def test_rand_augment_is_seeded():
    x = _images()
    assert torch.equal(rand_augment(x, 3), rand_augment(x, 3))
    assert rand_augment(x, 3).dtype == torch.uint8


def test_mixup_targets_match_the_mixing_weight():
    x = torch.zeros(4, 3, 8, 8)
    x[0] = 1.0
    labels = torch.tensor([0, 1, 2, 3])
    mixed, targets = mix_batch(x, labels, 4, mixup_alpha=1.0, cutmix_alpha=0.0, rng=np.random.default_rng(0))
    assert torch.allclose(targets.sum(1), torch.ones(4))
    # only sample 0 is non-zero, so every mixed image's pixel value is the weight it took from sample 0,
    # which must equal its soft target for class 0
    for i in range(4):
        assert torch.allclose(mixed[i], torch.full_like(mixed[i], float(targets[i, 0])))


def test_cutmix_targets_equal_the_pasted_area():
    x = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 16, 16).clone()
    labels = torch.tensor([0, 1, 2, 3])
    mixed, targets = mix_batch(x, labels, 4, mixup_alpha=0.0, cutmix_alpha=1.0, rng=np.random.default_rng(5))
    for i in range(4):
        kept = float((mixed[i, 0] == i).float().mean())
        assert abs(float(targets[i, i]) - kept) < 1e-6 or kept == 1.0


def test_no_mixing_gives_one_hot():
    x = _images().float()
    mixed, targets = mix_batch(x, torch.tensor([1, 2, 3, 4, 5, 6]), 10, 0.0, 0.0, np.random.default_rng(0))
    assert torch.equal(mixed, x) and torch.equal(targets.argmax(1), torch.tensor([1, 2, 3, 4, 5, 6]))
