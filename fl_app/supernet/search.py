"""Post-hoc search for the most accurate subnet of a trained supernet under a MAC budget (no retraining).

The search space is the whole supernet's: depth per stage, width per position (stem and stages), expansion per stage.
An evolutionary search keeps the best candidates of each generation as parents and breeds children by uniform
crossover and per-gene mutation; every child over the budget is shrunk (one dimension one step down at a time) until
it fits. Each candidate is cut out of the supernet with the one slicing primitive (``fl_app.evaluation.
extract_subnet``), its BatchNorm recalibrated on the calibration split, and scored on the validation split. The test
split is not an argument here: it can play no part in the choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from fl_app.data.images import ImageData
from fl_app.models.supernet_space import Subnet, SupernetConfig, count_costs
from fl_app.supernet.evaluation import subnet_correct
from fl_app.supernet.subnets import random_subnet


@dataclass(frozen=True)
class Scored:
    arch: Subnet
    macs: int
    params: int
    val_accuracy: float


class ValidationScorer:
    """Validation accuracy of a subnet after BN recalibration, memoised per architecture, with which validation
    examples it got right (``correct``): two subnets are compared on the same examples, so their difference is
    judged by its paired standard error (``paired_standard_error``)."""

    def __init__(self, cfg: SupernetConfig, supernet_state: Mapping, calibration: ImageData, validation: ImageData):
        if not len(validation):
            raise ValueError("subnet search needs a validation split (the run's val-size was 0)")
        self.cfg, self.state, self.calibration, self.validation = cfg, supernet_state, calibration, validation
        self.correct: dict[Subnet, np.ndarray] = {}

    def __call__(self, arch: Subnet) -> float:
        if arch not in self.correct:
            self.correct[arch] = subnet_correct(self.cfg, self.state, arch, self.calibration, self.validation)
        return int(self.correct[arch].sum()) / len(self.validation)

    def paired_standard_error(self, a: Subnet, b: Subnet) -> float:
        """Standard error of the difference of the two subnets' validation accuracies (paired by example)."""
        difference = self.correct[a].astype(np.float64) - self.correct[b].astype(np.float64)
        return float(difference.std(ddof=1) / np.sqrt(len(difference))) if len(difference) > 1 else 0.0


def prefer_larger(ranked: list[Scored], scorer: ValidationScorer, margin: float) -> Scored:
    """The largest candidate whose validation accuracy is below the best's by at most ``margin`` paired standard
    errors: a smaller subnet wins only when it is better beyond the validation split's sampling error (on 1,000
    images that error is ~1.6 points, larger than most differences between neighbouring subnets). ``margin`` 0 is
    the plain best on validation."""
    best = ranked[0]
    level = [
        s
        for s in ranked
        if best.val_accuracy - s.val_accuracy <= margin * scorer.paired_standard_error(best.arch, s.arch)
    ]
    return max(level, key=lambda s: (s.macs, s.val_accuracy))


def genes(cfg: SupernetConfig) -> list[tuple[str, int, tuple]]:
    """(field, position, ordered choices) of every searchable dimension."""
    return (
        [("d", i, tuple(range(cfg.max_extra_blocks_per_stage + 1))) for i in range(cfg.num_stages)]
        + [("e", i, tuple(sorted(cfg.expansion_ratio_choices))) for i in range(cfg.num_stages)]
        + [("w", i, tuple(range(len(cfg.width_multiplier_choices)))) for i in range(cfg.num_stages + 1)]
    )


def _with(arch: Subnet, field: str, position: int, value) -> Subnet:
    values = list(getattr(arch, field))
    values[position] = value
    return Subnet(**{**{"d": arch.d, "e": arch.e, "w": arch.w}, field: values})


def shrink_to_budget(cfg: SupernetConfig, arch: Subnet, budget: float, rng: np.random.Generator) -> Subnet | None:
    """Step random dimensions down by one until ``arch`` fits ``budget`` (None when even the minimum does not)."""
    if count_costs(cfg, cfg.min_subnet())[0] > budget:
        return None
    space = genes(cfg)
    while count_costs(cfg, arch)[0] > budget:
        movable = [(f, i, c) for f, i, c in space if c.index(getattr(arch, f)[i]) > 0]
        f, i, c = movable[rng.integers(len(movable))]
        arch = _with(arch, f, i, c[c.index(getattr(arch, f)[i]) - 1])
    return arch


def mutate(cfg: SupernetConfig, arch: Subnet, rng: np.random.Generator, probability: float) -> Subnet:
    """Redraw each dimension uniformly from its choices with ``probability`` (at least one dimension changes)."""
    space = genes(cfg)
    chosen = [g for g in space if rng.random() < probability] or [space[rng.integers(len(space))]]
    for f, i, choices in chosen:
        arch = _with(arch, f, i, choices[rng.integers(len(choices))])
    return arch


def crossover(a: Subnet, b: Subnet, rng: np.random.Generator) -> Subnet:
    """Uniform crossover: every dimension from one parent or the other."""

    def pick(x: tuple, y: tuple) -> list:
        return [u if rng.random() < 0.5 else v for u, v in zip(x, y)]

    return Subnet(pick(a.d, b.d), pick(a.e, b.e), pick(a.w, b.w))


def evolutionary_search(
    cfg: SupernetConfig,
    score: Callable[[Subnet], float],
    budget: float,
    seed: int = 0,
    population: int = 16,
    generations: int = 6,
    parents: int = 4,
    mutation_probability: float = 0.2,
    start: list[Subnet] = (),
) -> list[Scored]:
    """Every candidate scored, best first (ties: fewer MACs). ``start`` (e.g. the cached subnets under the budget)
    joins the first generation; the rest of it is random subnets shrunk to the budget."""
    rng = np.random.default_rng([seed, int(budget)])
    if count_costs(cfg, cfg.min_subnet())[0] > budget:
        raise ValueError(
            f"budget {budget:.0f} MACs is below the supernet's smallest subnet "
            f"({count_costs(cfg, cfg.min_subnet())[0]} MACs)"
        )
    seen: dict[Subnet, Scored] = {}

    def evaluate(arch: Subnet) -> None:
        if arch not in seen:
            macs, params = count_costs(cfg, arch)
            assert macs <= budget, (arch, macs, budget)
            seen[arch] = Scored(arch, macs, params, score(arch))

    def ranked() -> list[Scored]:
        return sorted(seen.values(), key=lambda s: (-s.val_accuracy, s.macs))

    first = [a for a in start if count_costs(cfg, a)[0] <= budget][:population]
    while len(first) < population:
        first.append(shrink_to_budget(cfg, random_subnet(cfg, rng), budget, rng))
    for arch in first:
        evaluate(arch)
    for _ in range(generations - 1):
        elite = [s.arch for s in ranked()[:parents]]
        children, tries = [], 0
        while len(children) < population and tries < 50 * population:
            tries += 1
            a, b = elite[rng.integers(len(elite))], elite[rng.integers(len(elite))]
            child = shrink_to_budget(cfg, mutate(cfg, crossover(a, b, rng), rng, mutation_probability), budget, rng)
            if child not in seen and child not in children:
                children.append(child)
        for arch in children:
            evaluate(arch)
    return ranked()
