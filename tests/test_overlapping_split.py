"""The overlapping pathological split (``local-partitioner = "pathological-random"``): each client draws its
``classes-per-client`` classes at random, so class pairs are shared across clients, unlike the cyclic deal."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from fl_app.data.images import load_dataset
from fl_app.data.local_splits import client_rows, pathological_parts
from fl_app.run.config import validate_run_config

LABELS = np.repeat(np.arange(10), 60)


def _pairs(held: list[set]) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for classes in held:
        for pair in combinations(sorted(classes), 2):
            counts[pair] = counts.get(pair, 0) + 1
    return counts


@pytest.mark.parametrize("k", [3, 4, 5])
def test_random_sets_give_each_client_its_k_classes_and_share_pairs(k):
    parts = pathological_parts(LABELS, 20, k, seed=3, random_sets=True)
    held = [set(np.unique(LABELS[p]).tolist()) for p in parts]
    assert all(len(classes) == k for classes in held)  # exactly k classes, and rows only of them
    everything = np.concatenate(parts)
    assert len(everything) == len(np.unique(everything))  # no row given twice
    for label in set().union(*held):  # each class's rows divided (equally, within one) among its holders
        sizes = [int(np.sum(LABELS[p] == label)) for p, c in zip(parts, held) if label in c]
        assert sum(sizes) == 60 and max(sizes) - min(sizes) <= 1
    pairs = _pairs(held)
    shared = [pair for pair, n in pairs.items() if n >= 2]
    assert len(pairs) > 5 and max(pairs.values()) >= 3  # many distinct pairs, some held by several clients
    assert len(shared) >= len(pairs) // 3


def test_the_cyclic_deal_is_what_it_was_and_the_random_one_differs():
    cyclic = pathological_parts(LABELS, 20, 2, seed=0)
    assert len(_pairs([set(np.unique(LABELS[p]).tolist()) for p in cyclic])) == 5  # 5 disjoint pairs
    random_parts = pathological_parts(LABELS, 20, 2, seed=0, random_sets=True)
    assert len(_pairs([set(np.unique(LABELS[p]).tolist()) for p in random_parts])) > 5
    again = pathological_parts(LABELS, 20, 2, seed=0, random_sets=True)
    assert all(np.array_equal(a, b) for a, b in zip(random_parts, again))  # seeded


def test_pathological_random_client_rows_on_the_sample():
    split = {"local-partitioner": "pathological-random", "classes-per-client": 3}
    run = validate_run_config({"method": "fedtopo", **split})
    labels = load_dataset(run["dataset"], run["data-source"], run["data-path"])[0].labels.numpy()
    held = []
    for train, test in client_rows(run, 20):
        classes = set(np.unique(labels[train]).tolist())
        assert len(classes) == 3 and set(np.unique(labels[test]).tolist()) <= classes
        held.append(classes)
    assert max(_pairs(held).values()) >= 2
