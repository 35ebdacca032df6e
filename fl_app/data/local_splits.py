"""Each client's own training and test split, for the model-heterogeneous methods (FedTopo and its baselines).

Client i holds a share of the training set drawn by ``local-partitioner``, split ``test-fraction`` (0.2 by default)
into a local test set and the rest into its local training set, both following the share's label distribution:

- ``"dirichlet"`` (default): a Dirichlet(``dirichlet-alpha``) share (the plain Dirichlet partitioner, whatever
  ``partitioner`` says: the γ-allocation is FEAST's).
- ``"pathological"``: ``classes-per-client`` classes per client, as HtFLlib's ``partition = "pat"``
  (``pathological_parts``): classes dealt cyclically, so with k = 2 and 20 clients only 5 disjoint pairs occur.
- ``"pathological-random"``: each client draws its ``classes-per-client`` classes at random (seeded, without
  repeats), so class pairs are shared across many clients; a class nobody draws is left out.

With ``client-data-fraction`` f < 1 each local training set is then subsampled (seeded, label-stratified) to
round(f·n) of its n rows, at least one; the local test sets stay as they are, so accuracies at different fractions
are read on the same images. Server and clients derive the splits from the seed with these same functions (no data
crosses the wire); there is no server hold-out, since these methods evaluate on the clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from fl_app.data.images import DATASETS, ImageData, load_dataset, split_train, stratified_holdout
from fl_app.data.partition import make_partitioner, partition_indices

LOCAL_PARTITIONERS = ("dirichlet", "pathological", "pathological-random")
PATHOLOGICAL_SPLITS = ("pathological", "pathological-random")  # the splits with classes-per-client classes each
# a run config (``fl_app.run.config.RunConfig``) read by its keys; the data layer sits below the run layer
RunSettings = Mapping[str, Any]


def pathological_parts(
    labels: np.ndarray, num_partitions: int, classes_per_client: int, seed: int, random_sets: bool = False
) -> list[np.ndarray]:
    """Sorted indices into ``labels`` of every partition, each holding exactly ``classes_per_client`` (k) classes.

    As HtFLlib's ``separate_data(partition="pat")``, classes are dealt in order, k consecutive ones per client, and
    a class's samples are divided among the clients that hold it. Three differences: the class order is a seeded
    permutation (with a fixed order every seed would pair the same classes, and which classes share clients is what
    a class-relation method is most sensitive to); client c takes the slots c·k .. c·k+k-1 of the cyclic class order,
    so clients holding the same classes are spread over the client ids (HtFLlib gives them to consecutive ids, which
    with backbone i % 8 keeps some class sets away from some backbones) and every class is held whenever n·k >= C;
    and a class's samples are shuffled and split equally (within one sample) among its holders, HtFLlib's
    ``balance=True``: its default draws unequal shares, a quantity skew the Dirichlet splits here do not add.

    With ``random_sets`` each client instead draws its k classes uniformly without repeats (seeded): the cyclic deal
    gives C/gcd pairs that never mix (5 disjoint pairs at k = 2, C = 10), random sets share each pair among several
    clients, which is what a relation merged over clients needs. A class nobody draws is left out."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    num_classes, k = len(classes), classes_per_client
    if not 1 <= k <= num_classes:
        raise ValueError(
            f"classes-per-client={k}: allowed values are integers in [1, {num_classes}] (the classes in the data)"
        )
    if num_partitions * k < num_classes:
        raise ValueError(
            f"classes-per-client={k} with {num_partitions} clients holds at most {num_partitions * k} of the "
            f"{num_classes} classes; allowed: classes-per-client >= {-(-num_classes // num_partitions)}"
        )
    rng = np.random.default_rng([seed, 59])
    if random_sets:
        held = [np.sort(rng.choice(classes, size=k, replace=False)) for _ in range(num_partitions)]
    else:
        order = rng.permutation(classes)
        held = [order[(c * k + np.arange(k)) % num_classes] for c in range(num_partitions)]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for label in classes:
        holders = [c for c in range(num_partitions) if label in held[c]]
        if not holders:  # only a random deal leaves a class out (the cyclic one holds all, checked above)
            continue
        rows = rng.permutation(np.nonzero(labels == label)[0])
        if len(rows) < len(holders):
            raise ValueError(
                f"classes-per-client={k}: class {label} has {len(rows)} samples for {len(holders)} clients; "
                "allowed: fewer clients or classes-per-client, so that every holder gets a sample"
            )
        for c, chunk in zip(holders, np.array_split(rows, len(holders))):
            parts[c].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


@lru_cache(maxsize=2)
def _splits(
    dataset: str,
    source: str,
    path: str,
    seed: int,
    alpha: float,
    test_fraction: float,
    num_partitions: int,
    partitioner: str = "dirichlet",
    classes_per_client: int = 2,
    data_fraction: float = 1.0,
    validation_fraction: float = 0.0,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    train, _ = load_dataset(dataset, source, path)
    labels = train.labels.numpy()
    pool = split_train(labels, 0, 0, seed).client_pool  # no server hold-out: evaluation is on clients
    if partitioner == "dirichlet":
        parts = partition_indices(labels[pool], make_partitioner("dirichlet", num_partitions, seed, alpha))
    elif partitioner in PATHOLOGICAL_SPLITS:
        random_sets = partitioner == "pathological-random"
        parts = pathological_parts(labels[pool], num_partitions, classes_per_client, seed, random_sets)
    else:
        raise ValueError(f"local-partitioner='{partitioner}': allowed values are {list(LOCAL_PARTITIONERS)}")
    out = []
    for pid, idx in enumerate(parts):
        rows = pool[idx]
        held = stratified_holdout(
            labels[rows], int(round(test_fraction * len(rows))), np.random.default_rng([seed, 47, pid])
        )
        test = rows[held]
        rows_train = np.setdiff1d(rows, test)
        validation = np.zeros(0, dtype=rows.dtype)
        if validation_fraction > 0:  # a stream of its own: without validation the splits are what they were
            picks = stratified_holdout(
                labels[rows_train],
                int(round(validation_fraction * len(rows))),
                np.random.default_rng([seed, 71, pid]),
            )
            validation = rows_train[picks]
            rows_train = np.setdiff1d(rows_train, validation)
        if data_fraction < 1.0:  # fewer training images, same label mix; a stream of its own keeps the test rows
            kept = max(1, int(round(data_fraction * len(rows_train))))
            rows_train = rows_train[
                stratified_holdout(labels[rows_train], kept, np.random.default_rng([seed, 53, pid]))
            ]
        out.append((rows_train, test, validation))
    return tuple(out)


def client_rows(run: RunSettings, num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(train rows, test rows) into the training set for every partition id (cached per process)."""
    return tuple((train, test) for train, test, _ in _all_splits(run, num_partitions))


def client_validation_rows(run: RunSettings, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Each partition's validation rows (``validation-fraction`` of its share, taken from its training rows; none
    when 0): what a best round is chosen on, never the test split."""
    return tuple(validation for _, _, validation in _all_splits(run, num_partitions))


def _all_splits(run: RunSettings, num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    return _splits(
        run["dataset"],
        run["data-source"],
        run["data-path"],
        run["seed"],
        run["dirichlet-alpha"],
        run["test-fraction"],
        num_partitions,
        run["local-partitioner"],
        run["classes-per-client"],
        run["client-data-fraction"],
        run["validation-fraction"],
    )


def split_description(run: RunSettings) -> str:
    """The clients' split in a few words, for the run's log."""
    if run["local-partitioner"] in PATHOLOGICAL_SPLITS:
        sets = " (random class sets)" if run["local-partitioner"] == "pathological-random" else ""
        text = f"pathological{sets}, {run['classes-per-client']} classes per client"
    else:
        text = f"Dirichlet α={run['dirichlet-alpha']}"
    fraction = run["client-data-fraction"]
    return text if fraction == 1.0 else f"{text}, {fraction:g} of each client's training rows"


def client_data(run: RunSettings, pid: int, num_partitions: int) -> tuple[ImageData, ImageData]:
    """Partition ``pid``'s (local training set, local test set)."""
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    rows_train, rows_test = client_rows(run, num_partitions)[pid]
    return train.subset(rows_train), train.subset(rows_test)


def client_validation_data(run: RunSettings, pid: int, num_partitions: int) -> ImageData:
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    return train.subset(client_validation_rows(run, num_partitions)[pid])


def train_class_counts(run: RunSettings, rows: np.ndarray) -> np.ndarray:
    """Per-class counts of these training-set rows (what a client of that split reports as its counts)."""
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    return np.bincount(train.labels.numpy()[rows], minlength=DATASETS[run["dataset"]].num_classes).astype(np.float32)


def global_test_rows(run: RunSettings) -> np.ndarray:
    """Rows of the dataset's test split every client model is also scored on (``global-test-per-class`` > 0):
    ``global-test-per-class`` images of each class (all of a class that has fewer), a seeded sample, so the set is
    class-balanced and the same for every client and for the server."""
    per_class = run["global-test-per-class"]
    if per_class <= 0:
        return np.zeros(0, dtype=np.int64)
    _, test = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    labels = test.labels.numpy()
    rng = np.random.default_rng([run["seed"], 67])
    picks = [
        rng.permutation(np.nonzero(labels == c)[0])[:per_class] for c in range(DATASETS[run["dataset"]].num_classes)
    ]
    return np.sort(np.concatenate(picks)).astype(np.int64)


def global_test_data(run: RunSettings) -> ImageData:
    _, test = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    return test.subset(global_test_rows(run))


def global_test_class_counts(run: RunSettings) -> np.ndarray:
    """Per-class image counts of the global test set (what a client's global per-class totals must equal)."""
    _, test = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    labels = test.labels.numpy()[global_test_rows(run)]
    return np.bincount(labels, minlength=DATASETS[run["dataset"]].num_classes).astype(np.int64)
