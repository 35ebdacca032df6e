"""The three population-weighted accuracies every supernet run reports, on a hand-made cache whose validation and
test accuracies disagree: the largest affordable anchor, the affordable anchor best on validation, and the
FEAST repository's rule (the highest test accuracy among the affordable anchors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app.models.supernet_space import Subnet


def test_three_rules_by_hand_on_anchors_whose_validation_and_test_disagree():
    from fl_app.supernet.evaluation import population_accuracies

    anchors = [  # MACs, validation, test: validation ranks them b > c > a, test ranks them c > a > b
        {"macs": 1, "val_accuracy": 0.2, "accuracy": 0.5},
        {"macs": 4, "val_accuracy": 0.8, "accuracy": 0.3},
        {"macs": 9, "val_accuracy": 0.6, "accuracy": 0.7},
    ]
    budgets = [1, 5, 10, 0.5]  # the last client affords nothing: the cheapest anchor, as the reference does
    got = population_accuracies(budgets, anchors)
    assert got["largest"] == pytest.approx(np.mean([0.5, 0.3, 0.7, 0.5]))
    assert got["best-validation"] == pytest.approx(np.mean([0.5, 0.3, 0.3, 0.5]))
    assert got["best-test"] == pytest.approx(np.mean([0.5, 0.5, 0.7, 0.5]))
    # without a validation split the validation rule cannot be applied (reported as None, never a test choice)
    no_val = [{**a, "val_accuracy": float("nan")} for a in anchors]
    assert population_accuracies(budgets, no_val)["best-validation"] is None


def test_tier_evaluator_reports_all_three_over_tiers_and_client_subnets(monkeypatch, cpu_cfg):
    """A cache of four subnets, two of them tiers; clients between the tiers deploy their own cached subnets, which
    are anchors too. Each rule scores every client from the same evaluation; the headline accuracies stay as they
    were (population-tier = largest over the tiers, client_subnet_accuracy over the clients' own subnets)."""
    import fl_app.supernet.evaluation as evaluation
    from fl_app.data.images import ImageData
    from fl_app.supernet.subnets import SubnetCache

    full = cpu_cfg.max_subnet()
    archs = [cpu_cfg.min_subnet(), *[Subnet(full.d, full.e, tuple(w // k for w in full.w)) for k in (4, 2)], full]
    cache = SubnetCache(cpu_cfg, archs)
    entries = cache.entries
    tiers = [entries[0], entries[3]]
    # (validation, test) per cached subnet, cheapest first: validation prefers entry 1, test prefers entry 2
    scores = {e.arch: s for e, s in zip(entries, [(0.1, 0.2), (0.9, 0.3), (0.5, 0.8), (0.4, 0.6)])}
    monkeypatch.setattr(
        evaluation, "evaluate_subnet", lambda cfg, state, arch, calibration, *splits: list(scores[arch])
    )
    data = ImageData(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    budgets = [entries[0].macs, entries[1].macs + 1, entries[2].macs + 1, entries[3].macs]
    clients = [cache.local_max(b) for b in budgets]
    evaluator = evaluation.TierEvaluator(
        cpu_cfg, tiers, budgets, data, data, data, 1, 1, lambda a: {}, client_subnets=clients
    )
    metrics = evaluator(1, None)
    got = evaluator.last["population_accuracies"]
    # largest affordable: entries 0, 1, 2, 3 -> test 0.2, 0.3, 0.8, 0.6 (= the clients' own subnets)
    assert got["largest"] == pytest.approx(np.mean([0.2, 0.3, 0.8, 0.6]))
    assert got["largest"] == pytest.approx(evaluator.last["client_subnet_accuracy"])
    # best on validation: entry 1 wherever affordable -> 0.2, 0.3, 0.3, 0.3
    assert got["best-validation"] == pytest.approx(np.mean([0.2, 0.3, 0.3, 0.3]))
    # the reference's: best test among affordable -> 0.2, 0.3, 0.8, 0.8
    assert got["best-test"] == pytest.approx(np.mean([0.2, 0.3, 0.8, 0.8]))
    # the tier headline is unchanged: the largest affordable tier (entry 0 for the first three, entry 3 for the last)
    assert evaluator.last["population_weighted_accuracy"] == pytest.approx(np.mean([0.2, 0.2, 0.2, 0.6]))
    assert metrics["population-accuracy-best-test"] == pytest.approx(got["best-test"])
    row = evaluator.rows[-1]
    assert row["population_accuracy_best_validation"] == pytest.approx(got["best-validation"])
