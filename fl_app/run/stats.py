"""Statistics over seeds: mean with a t-distribution confidence interval, and the paired difference of a method
against a reference over the seeds both ran (same partitions, budgets and sampling per seed).

Pure Python (no SciPy): the two-sided t quantile comes from the closed-form CDF of Student's t for integer degrees
of freedom (Abramowitz & Stegun 26.7.3-4), inverted by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def t_two_sided_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer >= 1) degrees of freedom."""
    if df < 1:
        raise ValueError(f"df={df}: must be >= 1")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):  # cos θ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + ...)
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + math.sin(theta) * total)
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...)
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * total


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| <= t) = level (e.g. 0.95 -> 12.706 at df=1, 2.776 at df=4)."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must be in (0, 1)")
    low, high = 0.0, 1.0
    while t_two_sided_probability(high, df) < level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided_probability(mid, df) < level:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class Estimate:
    """Mean over n values with the half-width of its confidence interval (nan when n < 2)."""

    mean: float
    half_width: float
    n: int
    sd: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def mean_ci(values, level: float = 0.95) -> Estimate:
    """Mean and t-interval of ``values`` (sample sd with n - 1)."""
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, math.nan)
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, math.nan, 1, math.nan)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Estimate(mean, t_quantile(level, n - 1) * sd / math.sqrt(n), n, sd)


@dataclass(frozen=True)
class PairedDifference:
    """method - reference over the seeds both have: the interval of the mean difference and the seeds won."""

    difference: Estimate
    wins: int  # seeds where the method is strictly better
    ties: int
    seeds: tuple

    @property
    def verdict(self) -> str:
        if self.difference.n < 2:
            return f"not distinguishable at {self.difference.n} seed"
        if not self.difference.excludes_zero():
            return f"not distinguishable at {self.difference.n} seeds"
        return "better" if self.difference.mean > 0 else "worse"


def paired_difference(method: dict, reference: dict, level: float = 0.95) -> PairedDifference:
    """``method`` and ``reference`` map seed -> value; only seeds present (and finite) in both are paired."""
    seeds = tuple(sorted(s for s in method if s in reference and _finite(method[s]) and _finite(reference[s])))
    diffs = [float(method[s]) - float(reference[s]) for s in seeds]
    return PairedDifference(mean_ci(diffs, level), sum(d > 0 for d in diffs), sum(d == 0 for d in diffs), seeds)


def _finite(value) -> bool:
    return value is not None and math.isfinite(float(value))


def value_at_budget(points: list[tuple[float, float]], budget: float) -> float:
    """The last measured value whose cost is <= ``budget`` (points: (cumulative cost, value)); nan if none.

    A step function, not an interpolation: it never credits a run with accuracy it had not yet measured."""
    reached = [value for cost, value in sorted(points) if cost <= budget]
    return reached[-1] if reached else math.nan


def format_estimate(estimate: Estimate, scale: float = 100.0, digits: int = 1) -> str:
    """'36.5 ± 1.2' (scaled, e.g. accuracy to %); the ± part is left out when there is no interval."""
    if estimate.n == 0:
        return "–"
    if math.isnan(estimate.half_width):
        return f"{scale * estimate.mean:.{digits}f}"
    return f"{scale * estimate.mean:.{digits}f} ± {scale * estimate.half_width:.{digits}f}"


def client_tier_scores(
    budgets, tier_macs: list[float], tier_accuracy: list[float], choose_by: list[float] | None = None
) -> list[float]:
    """The accuracy of the tier each client runs (0 when it can afford none): its *largest* affordable tier or, with
    ``choose_by`` (one score per tier, e.g. validation accuracy, never the accuracy being reported), the affordable
    tier with the best score (the larger on ties)."""

    def preference(i: int):
        return tier_macs[i] if choose_by is None else (choose_by[i], tier_macs[i])

    scores = []
    for budget in budgets:
        affordable = [i for i, macs in enumerate(tier_macs) if macs <= budget]
        scores.append(tier_accuracy[max(affordable, key=preference)] if affordable else 0.0)
    return scores
