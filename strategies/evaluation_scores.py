"""Scores of the model-heterogeneous family's evaluation rounds, from what each client reports on its own models.

Each client scores its own model on its own local test split (following its own label distribution) and, with
``global-test-per-class`` > 0, on the global test set (the same class-balanced sample of the dataset's test split for
every client). From per-class counts (correct[c], total[c]) of each client:

- ``mean_client_accuracy``: the mean over clients of each one's accuracy on its own test split (the project's score
  so far);
- ``pooled_accuracy``: all correct over all test images (HtFLlib's score);
- ``balanced_accuracy``: per client, the mean over the classes it holds in training (with test images) of its recall
  on its own test split; then the mean over clients. A minority class counts as much as the majority one, which a
  client's own-distribution accuracy hides (predicting the majority class alone scores 65-75 % at Dirichlet 0.1);
- ``global_accuracy``: the mean over clients of each model's class-balanced accuracy on the global test set, classes
  the client never saw included: what sharing could teach a client about the classes it lacks;
- ``validation_accuracy`` (``validation-fraction`` > 0): the own-distribution mean on each client's validation split,
  which picks the best round (``best_round_scores``), so no score is chosen on test.
"""

from __future__ import annotations

import math

import numpy as np


def own_mean_accuracy(per_client: dict[int, tuple[int, int]]) -> float:
    """Mean over clients of correct / test images ((correct, total) per client; a client without test images is
    left out)."""
    scored = [c / n for c, n in per_client.values() if n > 0]
    return float(np.mean(scored)) if scored else math.nan


def pooled_accuracy(per_client: dict[int, tuple[int, int]]) -> float:
    """All correct over all test images."""
    total = sum(n for _, n in per_client.values())
    return sum(c for c, _ in per_client.values()) / total if total else math.nan


def balanced_recall(class_correct: np.ndarray, class_total: np.ndarray, classes: np.ndarray) -> float:
    """Mean recall over ``classes`` (a boolean mask) that have test images; NaN when none has."""
    scored = np.asarray(classes, dtype=bool) & (np.asarray(class_total) > 0)
    if not scored.any():
        return math.nan
    return float(np.mean(np.asarray(class_correct)[scored] / np.asarray(class_total)[scored]))


def held_class_balanced_accuracy(
    class_correct: dict[int, np.ndarray], class_total: dict[int, np.ndarray], held: dict[int, np.ndarray]
) -> float:
    """Mean over clients of ``balanced_recall`` over the classes each client holds (``held[p]``: a boolean mask);
    a client without a held class in its test split is left out."""
    recalls = [balanced_recall(class_correct[p], class_total[p], held[p]) for p in class_correct]
    recalls = [r for r in recalls if not math.isnan(r)]
    return float(np.mean(recalls)) if recalls else math.nan


def global_accuracy_of(class_correct: np.ndarray, class_total: np.ndarray) -> float:
    """One model's class-balanced accuracy on the global test set: its mean recall over every class there."""
    return balanced_recall(class_correct, class_total, np.ones(len(class_total), dtype=bool))


def _measured(value) -> bool:
    return value is not None and not math.isnan(value)


SCORES = ("mean_client_accuracy", "pooled_accuracy", "balanced_accuracy", "global_accuracy")


def best_round_scores(history: list[dict]) -> dict:
    """The round with the highest ``validation_accuracy`` (the earliest of ties) and every score at it, for
    summary.json: ``best_round`` and ``best_<score>``; all None without a validation split."""
    scored = [row for row in history if _measured(row.get("validation_accuracy"))]
    best = max(scored, key=lambda row: row["validation_accuracy"], default={})
    return {
        "best_round": best.get("round"),
        "best_validation_accuracy": best.get("validation_accuracy"),
        **{f"best_{name}": best.get(name) for name in SCORES},
    }
