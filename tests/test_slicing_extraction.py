"""One slicing primitive: subnet shapes, extraction equal to the supernet's forward, standalone save/load."""

from __future__ import annotations

import numpy as np
import torch

from fl_app.evaluation import extract_subnet, recalibrate_bn
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.slicing import prefix_region, slice_state, subnet_shapes
from fl_app.supernet import Subnet


def test_prefix_region_selects_leading_block():
    t = np.arange(24).reshape(4, 6)
    assert t[prefix_region((2, 3))].tolist() == [[0, 1, 2], [6, 7, 8]]


def test_subnet_shapes_are_prefixes_of_supernet_shapes(cpu_cfg, cpu_cache):
    full = subnet_shapes(cpu_cfg, cpu_cfg.max_subnet())
    for entry in cpu_cache.entries:
        shapes = subnet_shapes(cpu_cfg, entry.arch)
        assert set(shapes) <= set(full)
        for name, shape in shapes.items():
            assert all(a <= b for a, b in zip(shape, full[name])), name


def _randomize_bn(model):
    gen = torch.Generator().manual_seed(0)
    for name, buf in model.named_buffers():
        if name.endswith("running_mean"):
            buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
        elif name.endswith("running_var"):
            buf.copy_(torch.rand(buf.shape, generator=gen) + 0.5)


def test_extracted_subnet_equals_supernet_forward(cpu_cfg, cpu_cache):
    torch.manual_seed(0)
    supernet = ElasticResNet(cpu_cfg)
    _randomize_bn(supernet)
    state = supernet.state_dict()
    x = torch.randn(4, 3, 32, 32)
    supernet.eval()
    for entry in cpu_cache.entries[::3]:
        sub = extract_subnet(cpu_cfg, state, entry.arch).eval()
        with torch.no_grad():
            assert torch.allclose(sub(x), supernet(x, entry.arch), atol=1e-5)
        # the extracted model holds exactly the subnet's tensors, no more
        assert sum(p.numel() for p in sub.parameters()) == entry.params


def test_dynamic_bn_updates_only_the_active_prefix(cpu_cfg):
    small = Subnet((0, 0, 0, 0), (0.25,) * 4, (0, 0, 0, 0, 0))
    model = ElasticResNet(cpu_cfg)
    model.train()
    model(torch.randn(8, 3, 32, 32), small)
    c = cpu_cfg.stem_channels(small)
    mean = model.stem_bn.running_mean
    assert torch.count_nonzero(mean[:c]) == c
    assert torch.count_nonzero(mean[c:]) == 0


def test_recalibration_makes_bn_stats_exact_averages(cpu_cfg):
    arch = cpu_cfg.min_subnet()
    model = ElasticResNet(cpu_cfg, bounds=arch)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    recalibrate_bn(model, images, batch_size=64)
    from fl_app.augment import normalize

    with torch.no_grad():
        stem = model.stem_conv(normalize(images), cpu_cfg.stem_channels(arch), cpu_cfg.stem_stride)
    assert torch.allclose(model.stem_bn.running_mean, stem.mean(dim=(0, 2, 3)), atol=1e-4)
    assert not model.training


def test_standalone_model_round_trip(tmp_path, cpu_cfg, cpu_cache):
    arch = cpu_cache.entries[5].arch
    model = extract_subnet(cpu_cfg, ElasticResNet(cpu_cfg).state_dict(), arch).eval()
    path = tmp_path / "subnet.pt"
    model.save_standalone(path)
    loaded = ElasticResNet.load_standalone(path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    blob = torch.load(path, weights_only=True)  # plain torch reads it too
    assert set(blob) == {"supernet", "arch", "state_dict"}


def test_slice_state_rejects_non_prefix():
    import pytest

    with pytest.raises(ValueError, match="not a prefix"):
        slice_state({"w": np.zeros((2, 2))}, {"w": (3, 2)})


def test_population_weighted_accuracy_uses_the_largest_affordable_tier_or_the_best_on_validation():
    from fl_app.evaluation import population_weighted_accuracy

    budgets, macs = [1, 5, 10, 0.5], [1, 4, 9]
    test_acc, val_acc = [0.5, 0.3, 0.4], [0.6, 0.7, 0.2]
    # largest affordable: 0.5, 0.3, 0.4 and 0 for the client that affords nothing
    assert population_weighted_accuracy(budgets, macs, test_acc) == np.mean([0.5, 0.3, 0.4, 0.0])
    # best on validation: the 4-MAC tier wins wherever affordable (val 0.7), whatever its test accuracy
    assert population_weighted_accuracy(budgets, macs, test_acc, val_acc) == np.mean([0.5, 0.3, 0.3, 0.0])
    # choosing on test accuracy would have given 0.5 everywhere: not what either option reports
    assert population_weighted_accuracy(budgets, macs, test_acc, test_acc) == np.mean([0.5, 0.5, 0.5, 0.0])


def test_tier_evaluator_chooses_best_tier_on_validation_never_test(monkeypatch, cpu_cfg, cpu_cache):
    import pytest

    import fl_app.evaluation as evaluation
    from fl_app.data import ImageData

    tiers = cpu_cache.tiers(None, count=3)
    scores = {t.arch: acc for t, acc in zip(tiers, [(0.6, 0.5), (0.7, 0.3), (0.2, 0.9)])}  # (validation, test)
    monkeypatch.setattr(evaluation, "evaluate_subnet", lambda cfg, state, arch, calib, *splits: list(scores[arch]))
    data = ImageData(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    budgets = [tiers[-1].macs] * 2
    results = {}
    for choice in ("largest", "best-validation"):
        evaluator = evaluation.TierEvaluator(cpu_cfg, tiers, budgets, data, data, data, 1, 1, lambda a: {},
                                             population_tier=choice)
        evaluator(1, None)
        results[choice] = evaluator.last["population_weighted_accuracy"]
    assert results == {"largest": 0.9, "best-validation": 0.3}  # the test-best tier (0.9) is never chosen by test
    with pytest.raises(ValueError, match="population-tier"):
        evaluation.TierEvaluator(cpu_cfg, tiers, budgets, data, data, data, 1, 1, None, population_tier="best-test")
