"""fl_app.run.stats against hand-computed values (t tables, a 3-seed interval, a paired difference)."""

from __future__ import annotations

import math

import pytest

from fl_app.run.stats import format_estimate, mean_ci, paired_difference, t_quantile, value_at_budget


@pytest.mark.parametrize(
    "df, expected", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423)]
)
def test_t_quantile_matches_the_printed_table(df, expected):
    assert t_quantile(0.95, df) == pytest.approx(expected, abs=1e-4)


def test_t_quantile_at_other_levels():
    assert t_quantile(0.90, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.99, 2) == pytest.approx(9.9248, abs=1e-4)


def test_mean_ci_three_seeds_by_hand():
    # mean 0.32, sd sqrt(((-.02)² + .02² + 0²) / 2) = 0.02, half-width 4.3027 * 0.02 / sqrt(3) = 0.04968
    estimate = mean_ci([0.30, 0.34, 0.32])
    assert estimate.n == 3
    assert estimate.mean == pytest.approx(0.32)
    assert estimate.sd == pytest.approx(0.02)
    assert estimate.half_width == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-6)
    assert format_estimate(estimate) == "32.0 ± 5.0"


def test_mean_ci_one_value_has_no_interval_and_nan_is_dropped():
    estimate = mean_ci([0.5, float("nan"), None])
    assert estimate.n == 1 and estimate.mean == 0.5 and math.isnan(estimate.half_width)
    assert format_estimate(estimate) == "50.0"
    assert mean_ci([]).n == 0 and format_estimate(mean_ci([])) == "–"


def test_paired_difference_uses_only_common_seeds_and_counts_wins():
    method = {0: 0.40, 1: 0.42, 2: 0.39, 3: 0.50}  # seed 3 has no reference: not paired
    reference = {0: 0.37, 1: 0.38, 2: 0.40, 4: 0.10}
    paired = paired_difference(method, reference)
    # differences 0.03, 0.04, -0.01: mean 0.02, sd sqrt((.01² + .02² + .03²) / 2) = sqrt(0.0007)
    assert paired.seeds == (0, 1, 2)
    assert paired.wins == 2 and paired.ties == 0
    assert paired.difference.mean == pytest.approx(0.02)
    assert paired.difference.sd == pytest.approx(math.sqrt(0.0007))
    assert paired.difference.half_width == pytest.approx(4.302653 * math.sqrt(0.0007) / math.sqrt(3), rel=1e-6)
    assert not paired.difference.excludes_zero()  # [-0.046, 0.086]
    assert paired.verdict == "not distinguishable at 3 seeds"


def test_paired_difference_is_better_when_the_interval_excludes_zero():
    # unpaired the two overlap heavily (seed effects dominate); paired, every seed gains 0.01 ± 0.001
    method = {0: 0.301, 1: 0.511, 2: 0.410}
    reference = {0: 0.290, 1: 0.500, 2: 0.401}
    paired = paired_difference(method, reference)
    assert paired.wins == 3
    assert paired.difference.excludes_zero() and paired.verdict == "better"
    assert paired_difference(reference, method).verdict == "worse"


def test_value_at_budget_is_a_step_function():
    points = [(10.0, 0.2), (20.0, 0.3), (30.0, 0.35)]
    assert value_at_budget(points, 25.0) == 0.3
    assert value_at_budget(points, 30.0) == 0.35
    assert math.isnan(value_at_budget(points, 5.0))
