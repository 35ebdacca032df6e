"""The regime map's knobs of the model-heterogeneous family: the pathological split (``local-partitioner``,
``classes-per-client``), less data per client (``client-data-fraction``) and one backbone for all (``backbones``),
by hand counts on small label arrays and on the bundled CIFAR-10 sample (2,000 training images per class)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from experiments.runner.in_process_grid import run_in_process
from fl_app.data.images import load_dataset
from fl_app.data.local_splits import client_rows, pathological_parts
from fl_app.models.multiarch import CPU_FAMILY, PAPER_FAMILY, architecture_of, client_model, family_names
from fl_app.run.config import KEYS, validate_run_config

SAMPLE_LABELS = load_dataset("cifar10", "sample", "")[0].labels.numpy()
PATHOLOGICAL = {"local-partitioner": "pathological", "classes-per-client": 2}


def _classes(labels: np.ndarray, rows: np.ndarray) -> set[int]:
    return set(np.unique(labels[rows]).tolist())


# -- the pathological split ----------------------------------------------------------------------------------------
def test_pathological_parts_give_each_client_k_classes_in_equal_shares():
    labels = np.repeat(np.arange(4), 12)  # 4 classes of 12
    parts = pathological_parts(labels, num_partitions=4, classes_per_client=2, seed=0)
    assert [len(_classes(labels, p)) for p in parts] == [2, 2, 2, 2]
    # 8 slots over 4 classes: every class is held by 2 clients, who get 6 of its 12 samples each
    assert [len(p) for p in parts] == [12, 12, 12, 12]
    for k in range(4):
        assert sorted(np.bincount(labels[p], minlength=4)[k] for p in parts) == [0, 0, 6, 6]
    together = np.concatenate(parts)
    assert sorted(together.tolist()) == list(range(48))  # every sample once


def test_pathological_parts_with_slots_not_divisible_by_classes():
    """3 clients x 2 classes = 6 slots over 4 classes: the first two classes of the (seeded) order are held twice,
    the other two once; clients 0 and 2 share a class set (6 + 6 samples), client 1 holds the other two (12 + 12)."""
    labels = np.repeat(np.arange(4), 12)
    parts = pathological_parts(labels, num_partitions=3, classes_per_client=2, seed=5)
    assert [len(p) for p in parts] == [12, 24, 12]
    assert _classes(labels, parts[0]) == _classes(labels, parts[2])
    assert _classes(labels, parts[0]) | _classes(labels, parts[1]) == {0, 1, 2, 3}
    assert not _classes(labels, parts[0]) & _classes(labels, parts[1])


def test_pathological_parts_follow_the_seed():
    labels = np.repeat(np.arange(10), 30)
    first = pathological_parts(labels, 20, 2, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(first, pathological_parts(labels, 20, 2, seed=0)))
    other = pathological_parts(labels, 20, 2, seed=1)
    # another seed pairs other classes on the clients (and deals other samples)
    assert [_classes(labels, p) for p in first] != [_classes(labels, p) for p in other]


@pytest.mark.parametrize(
    "clients, k, message",
    [
        (20, 11, r"classes-per-client=11: allowed values are integers in \[1, 10\]"),
        (20, 0, r"classes-per-client=0: allowed values are integers in \[1, 10\]"),
        (
            4,
            2,
            r"classes-per-client=2 with 4 clients holds at most 8 of the 10 classes; allowed: classes-per-client >= 3",
        ),
    ],
)
def test_pathological_parts_refuse_what_cannot_be_split(clients, k, message):
    with pytest.raises(ValueError, match=message):
        pathological_parts(np.repeat(np.arange(10), 30), clients, k, seed=0)


def test_pathological_client_rows_on_the_sample():
    """20 clients x 2 classes over 10 classes: each class is held by 4 clients, 500 of its 2,000 images each, so
    every client holds 1,000 images: 200 local test (test-fraction 0.2) and 800 training images, 400 a class."""
    run = validate_run_config({"method": "fedtopo", **PATHOLOGICAL})
    rows = client_rows(run, 20)
    holders = np.zeros(10, dtype=int)
    for train, test in rows:
        assert (len(train), len(test)) == (800, 200)
        assert _classes(SAMPLE_LABELS, train) == _classes(SAMPLE_LABELS, test)
        assert sorted(np.bincount(SAMPLE_LABELS[train], minlength=10)[sorted(_classes(SAMPLE_LABELS, train))]) == [
            400,
            400,
        ]
        holders[sorted(_classes(SAMPLE_LABELS, train))] += 1
    assert holders.tolist() == [4] * 10  # the union covers every class, each 4 times
    everything = np.concatenate([np.concatenate(pair) for pair in rows])
    assert len(everything) == len(np.unique(everything)) == 20_000
    again = client_rows(validate_run_config({"method": "fedtopo", **PATHOLOGICAL}), 20)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(rows, again))


# -- less data per client ------------------------------------------------------------------------------------------
def test_client_data_fraction_keeps_a_stratified_quarter_and_the_test_rows():
    full = client_rows(validate_run_config({"method": "fedtopo", **PATHOLOGICAL}), 20)
    quarter = client_rows(validate_run_config({"method": "fedtopo", **PATHOLOGICAL, "client-data-fraction": 0.25}), 20)
    for (train, test), (kept, same_test) in zip(full, quarter):
        np.testing.assert_array_equal(test, same_test)
        assert len(kept) == 200 and np.isin(kept, train).all()  # 800 / 4, drawn from the client's own rows
        counts = np.bincount(SAMPLE_LABELS[kept], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [100, 100]  # 400 a class / 4: the label mix is kept


def test_client_data_fraction_rounds_and_keeps_at_least_one_row():
    base = {"method": "fedtopo", "dirichlet-alpha": 0.5}
    full = client_rows(validate_run_config(base), 4)
    for fraction in (0.3, 1e-9):
        part = client_rows(validate_run_config({**base, "client-data-fraction": fraction}), 4)
        for (train, test), (kept, same_test) in zip(full, part):
            np.testing.assert_array_equal(test, same_test)
            assert len(kept) == max(1, int(round(fraction * len(train))))
            assert len(np.unique(kept)) == len(kept)


# -- one backbone for all ------------------------------------------------------------------------------------------
def test_default_cycles_through_the_eight_backbones_and_one_puts_everyone_on_cnn4():
    assert len(CPU_FAMILY) == len(PAPER_FAMILY) == KEYS["backbones"].default == 8
    for family in ("cpu", "paper"):
        names = family_names(family)
        assert [architecture_of(family, i) for i in range(16)] == names + names
        assert {architecture_of(family, i, 1) for i in range(20)} == {names[0]}
        assert [architecture_of(family, i, 3) for i in range(6)] == names[:3] + names[:3]
    assert {client_model("cpu", i, 10, 64, backbones=1).name for i in range(9)} == {"cnn4-mini"}


@pytest.mark.parametrize("value", [0, 9])
def test_backbones_out_of_range_is_refused_by_registry_and_code(value):
    with pytest.raises(ValueError, match=rf"backbones={value}: must be in \[1, 8\]"):
        validate_run_config({"method": "fedtopo", "backbones": value})
    with pytest.raises(ValueError, match=rf"backbones={value}: allowed values are integers in \[1, 8\]"):
        architecture_of("cpu", 0, value)


@pytest.mark.parametrize(
    "override, fragment",
    [
        (
            {"local-partitioner": "pat"},
            "local-partitioner='pat': allowed values are ['dirichlet', 'pathological', 'pathological-random']",
        ),
        (
            {"local-partitioner": "pathological", "classes-per-client": 11},
            "classes-per-client=11: allowed values are integers in [1, 10] (dataset='cifar10' has 10 classes)",
        ),
        ({"client-data-fraction": 0.0}, "client-data-fraction=0.0: must be in (0, 1]"),
        ({"client-data-fraction": 1.5}, "client-data-fraction=1.5: must be in (0, 1]"),
    ],
)
def test_bad_regime_values_are_named(override, fragment):
    with pytest.raises(ValueError) as err:
        validate_run_config({"method": "fedtopo", **override})
    assert fragment in str(err.value)


def test_a_run_with_one_backbone_a_pathological_split_and_less_data(flower_ids, tmp_path):
    """The keys reach the run: every client trains CNN-4 on its 3 classes, with a quarter of its training rows."""
    run = validate_run_config(
        {
            "method": "fedtopo",
            "num-server-rounds": 2,
            "clients-per-round": 4,
            "max-local-steps": 2,
            "batch-size": 16,
            "eval-every": 2,
            "proto-max-samples": 64,
            "backbones": 1,
            "local-partitioner": "pathological",
            "classes-per-client": 3,  # 4 clients x 3 slots cover the 10 classes
            "client-data-fraction": 0.25,
            "output-dir": str(tmp_path / "out"),
        }
    )
    summary = run_in_process(run, 4)
    assert summary["architectures"] == ["cnn4-mini"] * 4
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["run_config"]["backbones"] == 1
    rows = client_rows(run, 4)
    with open(tmp_path / "out" / "clients.csv") as handle:
        for row in csv.DictReader(handle):
            train = rows[int(row["partition_id"])][0]
            assert row["architecture"] == "cnn4-mini" and int(row["num_examples"]) == len(train)
            assert len(_classes(SAMPLE_LABELS, train)) == 3
