"""κ scaled to the support seen (``topo-kappa-quantile``) and the per-round diagnostic of whether the reliability
weighting acts (the share of pairs with W/(W+κ) < 0.9), by hand on a made-up federation."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from fl_app.run.config import validate_run_config
from fl_app.run.outputs import write_round_files
from strategies.fedtopo import FedTopoStrategy, merge_relations, pair_weights, support_kappa, weak_pair_fraction

# four clients over 4 classes, each holding one pair: supports W = sqrt(n_j·n_k) = 6, 2, 12, 4
COUNTS = np.array([[4, 9, 0, 0], [4, 0, 1, 0], [0, 9, 0, 16], [0, 0, 1, 16]], dtype=np.float32)
PAIRS = [(0, 1), (0, 2), (1, 3), (2, 3)]


def _relations() -> np.ndarray:
    relations = np.zeros((4, 4, 4), dtype=np.float32)
    for m, ((j, k), s) in enumerate(zip(PAIRS, (0.8, -0.2, 0.5, 0.1))):
        relations[m, j, k] = relations[m, k, j] = s
    return relations


def _strategy(**kw) -> FedTopoStrategy:
    return FedTopoStrategy({p: 100 + p for p in range(4)}, 4, clients_per_round=4, seed=0, num_rounds=2, tau=0.5, **kw)


def test_support_and_kappa_quantile_by_hand():
    total = pair_weights(COUNTS)[1].sum(axis=0)
    assert [total[j, k] for j, k in PAIRS] == pytest.approx([6, 2, 12, 4])
    assert support_kappa(total, 20.0, 0.0) == 20.0  # off: the fixed κ
    assert support_kappa(total, 20.0, 0.5) == pytest.approx(5.0)  # median of 2, 4, 6, 12
    assert support_kappa(total, 20.0, 1.0) == pytest.approx(12.0)
    assert support_kappa(np.zeros((4, 4)), 20.0, 0.5) == 0.0  # nothing reported


def test_weak_pair_fraction_by_hand():
    total = pair_weights(COUNTS)[1].sum(axis=0)
    # κ = 0.5: W/(W+κ) = 6/6.5 = .92, 2/2.5 = .80, 12/12.5 = .96, 4/4.5 = .89: two of four below 0.9
    assert weak_pair_fraction(total, 0.5) == pytest.approx(0.5)
    assert weak_pair_fraction(total, 5.0) == 1.0  # 6/11, 2/7, 12/17, 4/9
    assert weak_pair_fraction(total, 0.01) == 0.0  # the inactive case: every pair keeps its score
    assert weak_pair_fraction(total, 5.0, "mean") == 0.0  # no shrinkage in the ablation
    assert math.isnan(weak_pair_fraction(np.zeros((4, 4)), 5.0))


def test_the_strategy_merges_with_the_quantile_kappa_and_records_the_diagnostic(tmp_path):
    uploads = [(p, {"relations": r, "counts": c}, float(c.sum())) for p, (r, c) in enumerate(zip(_relations(), COUNTS))]
    scaled = _strategy(kappa=20.0, kappa_quantile=0.5)
    scaled.aggregate_uploads(1, uploads)
    expected, _, _ = merge_relations(_relations(), COUNTS, 0.5, "support", 5.0)
    np.testing.assert_allclose(scaled.global_arrays["topology"], expected.astype(np.float32))
    assert scaled.rounds[1].diagnostics == {"topo_kappa": pytest.approx(5.0), "weak_pair_fraction": 1.0}

    fixed = _strategy(kappa=0.5)  # the default path: the fixed κ, as before
    fixed.aggregate_uploads(1, uploads)
    expected, _, _ = merge_relations(_relations(), COUNTS, 0.5, "support", 0.5)
    np.testing.assert_array_equal(fixed.global_arrays["topology"], expected.astype(np.float32))
    assert fixed.rounds[1].diagnostics == {"topo_kappa": 0.5, "weak_pair_fraction": 0.5}

    write_round_files(tmp_path, [], scaled.rounds)  # the round record carries it into rounds.csv
    with open(tmp_path / "rounds.csv", newline="") as f:
        row = next(csv.DictReader(f))
    assert float(row["topo_kappa"]) == pytest.approx(5.0) and float(row["weak_pair_fraction"]) == 1.0


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_the_quantile_key_is_checked(value):
    with pytest.raises(ValueError, match="topo-kappa-quantile"):
        validate_run_config({"method": "fedtopo", "topo-kappa-quantile": value})
