"""The reference-regime study's skew measure (experiments/studies/label_skew.py) against hand values."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.studies.label_skew import describe, relative_entropy


def test_relative_entropy_by_hand():
    assert relative_entropy(np.arange(10), 10) == (pytest.approx(1.0), 10)  # every class once
    assert relative_entropy(np.full(7, 3), 10) == (0.0, 1)  # one class
    assert relative_entropy(np.array([0, 0, 1, 1]), 4) == (pytest.approx(0.5), 2)  # 1 bit of log2(4) = 2
    # 3/4 of one class, 1/4 of another: H = 0.8113 bits over log2(2) = 1
    assert relative_entropy(np.array([0, 0, 0, 1]), 2)[0] == pytest.approx(0.811278, abs=1e-6)


def test_describe_summarises_over_clients():
    row = describe("x", 0.1, [(1.0, 10, 100), (0.5, 2, 300)])
    assert row["rel_entropy_mean"] == 0.75 and row["rel_entropy_std"] == 0.25
    assert row["rel_entropy_size_weighted"] == pytest.approx((1.0 * 100 + 0.5 * 300) / 400, abs=1e-4)
    assert (row["classes_held_mean"], row["size_min"], row["size_max"]) == (6.0, 100, 300)
