"""FEAST local step: which subnets train, degenerate cases, determinism."""

from __future__ import annotations

import torch

from clients.feast import plan_subnets, train_subnets
from fl_app.models.elastic_resnet import ElasticResNet
from tests.harness.training import feast_settings, random_images


def test_plan_local_max_min_and_between(cpu_cache):
    budget = 5e6
    bounds = cpu_cache.route_bounds(budget)
    plan = plan_subnets(cpu_cache, budget, bounds, ("max", "min", "random"))
    affordable = cpu_cache.under(budget)
    assert plan.largest == affordable[-1].arch
    assert plan.smallest == affordable[0].arch
    assert [c.arch for c in affordable[1:-1]] == plan.between


def test_plan_degenerate_cases(cpu_cache):
    only = cpu_cache.min_macs
    plan = plan_subnets(cpu_cache, only, cpu_cache.route_bounds(only), ("max", "min", "random"))
    assert plan.smallest is None and plan.between == []  # max = min: trained once
    two = cpu_cache.entries[1].macs
    plan = plan_subnets(cpu_cache, two, cpu_cache.route_bounds(two), ("max", "min", "random"))
    assert plan.smallest == cpu_cache.entries[0].arch and plan.between == []  # nothing in between
    plan = plan_subnets(cpu_cache, 5e6, cpu_cache.route_bounds(5e6), ("max",))
    assert plan.smallest is None and plan.between == []


def _train(cfg, cache, budget, **kw):
    torch.manual_seed(0)
    bounds = cache.route_bounds(budget)
    model = ElasticResNet(cfg, bounds)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = plan_subnets(cache, budget, bounds, ("max", "min", "random"))
    metrics = train_subnets(model, plan, random_images(24), feast_settings(**kw))
    return before, model.state_dict(), metrics


def test_training_is_deterministic_and_moves_weights(cpu_cfg, cpu_cache):
    before, after, metrics = _train(cpu_cfg, cpu_cache, 5e6)
    _, again, _ = _train(cpu_cfg, cpu_cache, 5e6)
    assert metrics["local-steps"] == 3
    assert all(torch.equal(after[k], again[k]) for k in after)
    assert not torch.equal(before["stem_conv.weight"], after["stem_conv.weight"])


def test_kd_ratio_changes_the_update(cpu_cfg, cpu_cache):
    _, with_kd, _ = _train(cpu_cfg, cpu_cache, 5e6, kd_ratio=0.5)
    _, without_kd, _ = _train(cpu_cfg, cpu_cache, 5e6, kd_ratio=0.0)
    assert not torch.equal(with_kd["stem_conv.weight"], without_kd["stem_conv.weight"])


def test_max_local_steps_caps_training(cpu_cfg, cpu_cache):
    _, _, metrics = _train(cpu_cfg, cpu_cache, 1e6, max_steps=0, epochs=2)
    assert metrics["local-steps"] == 2 * 3  # 24 samples / batch 8, two epochs
