"""γ-allocation: shares, sizes following budgets, γ = 0 as plain Dirichlet, reproducibility; every committed paper
config partitions at its dataset's real size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fl_app.data.gamma_partitioner import GammaPartitioner
from fl_app.data.partition import gamma_shares, make_partitioner, partition_indices


def test_gamma_shares_formula_with_cap():
    budgets = np.array([1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(gamma_shares(budgets, 1.0), budgets / 15)
    np.testing.assert_allclose(gamma_shares(budgets, 0.0), [0.25] * 4)
    np.testing.assert_allclose(gamma_shares(budgets, 2.0), budgets**2 / 85)
    capped = np.array([1.0, 2.0, 4.0, 4.0])  # max-training-macs = 4
    np.testing.assert_allclose(gamma_shares(budgets, 1.0, max_training_macs=4.0), capped / capped.sum())


def _labels(n=6000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


def test_partition_sizes_follow_budgets():
    budgets = np.array([1, 1, 2, 4, 8, 16], dtype=float)
    labels = _labels()
    parts = partition_indices(labels, GammaPartitioner(budgets, gamma=1.0, alpha=0.5, seed=1))
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 10
    assert np.corrcoef(sizes, budgets)[0, 1] > 0.9
    # every sample lands in exactly one partition
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) == len(np.unique(joined))


def test_gamma_zero_gives_no_size_coupling():
    budgets = np.array([1, 1, 2, 4, 8, 16], dtype=float)
    sizes = []
    for seed in range(8):
        parts = partition_indices(_labels(seed=seed), GammaPartitioner(budgets, gamma=0.0, alpha=1.0, seed=seed))
        sizes.append([len(p) for p in parts])
    mean_sizes = np.mean(sizes, axis=0)
    assert mean_sizes[-1] / mean_sizes[0] < 1.6  # γ = 1 would give 16x


@pytest.mark.parametrize("alpha,clients", [(0.05, 4), (0.3, 13), (1.0, 30), (10.0, 7)])
def test_gamma_zero_is_exactly_the_plain_dirichlet_partitioner(alpha, clients):
    """γ = 0 gives flwr-datasets' self-balancing DirichletPartitioner's partitions, whatever the budgets."""
    budgets = np.random.default_rng(1).uniform(1e6, 1e7, clients)
    for seed in range(3):
        labels = _labels(n=3000, seed=seed + 100)
        plain = partition_indices(labels, make_partitioner("dirichlet", clients, seed, alpha))
        gamma0 = partition_indices(labels, GammaPartitioner(budgets, gamma=0.0, alpha=alpha, seed=seed))
        assert [np.sort(p).tolist() for p in plain] == [p.tolist() for p in gamma0]


def test_label_skew_grows_as_alpha_shrinks():
    budgets = np.ones(8)

    def skew(alpha):
        parts = partition_indices(_labels(), GammaPartitioner(budgets, gamma=1.0, alpha=alpha, seed=0))
        labels = _labels()
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])

    assert skew(0.1) > skew(100.0) + 0.2


def test_same_seed_same_partitions_and_other_seed_differs():
    budgets = np.array([1, 2, 3, 4], dtype=float)
    a = partition_indices(_labels(), GammaPartitioner(budgets, 1.0, 0.5, seed=5))
    b = partition_indices(_labels(), GammaPartitioner(budgets, 1.0, 0.5, seed=5))
    c = partition_indices(_labels(), GammaPartitioner(budgets, 1.0, 0.5, seed=6))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="gamma"):
        GammaPartitioner([1, 2], gamma=-1, alpha=0.5)
    with pytest.raises(ValueError, match="partitioner='x'"):
        make_partitioner("x", 2, 0, 0.5)
    with pytest.raises(ValueError, match=">= 10 samples"):
        partition_indices(_labels(n=50), GammaPartitioner(np.ones(10), 1.0, 0.5, max_attempts=3))


def test_flwr_partitioners_are_available_by_name():
    labels = _labels()
    iid = partition_indices(labels, make_partitioner("iid", 4, 0, 0.5))
    assert [len(p) for p in iid] == [1500] * 4
    dirichlet = partition_indices(labels, make_partitioner("dirichlet", 4, 0, 0.5))
    assert sum(len(p) for p in dirichlet) == len(labels)


def test_declared_budgets_shape_the_gamma_allocation_on_server_and_client(flower_ids):
    """A node's declared budget-macs is the budget the γ-allocation uses: the server sends every partition's budget
    with each round and the client rebuilds its partition from them, so both sides agree on its rows."""
    from flwr.app import ConfigRecord

    from fl_app.models.elastic_resnet import ElasticResNet
    from fl_app.run.config import validate_run_config
    from fl_app.run.payload import state_to_record
    from fl_app.supernet.shared_setup import SupernetSetup, client_data, dataset_for, partition_rows
    from fl_app.supernet_app import make_supernet_strategy

    run = validate_run_config({"gamma": 1.0, "dirichlet-alpha": 1.0, "clients-per-round": 4})
    setup = SupernetSetup.build(run, 4)
    smallest = int(np.argmin(setup.budgets))
    budgets = setup.client_budgets(run, {smallest: float(setup.cache.max_macs)})  # it declares the largest budget
    ordered = [budgets[p] for p in range(4)]
    assert ordered[smallest] == setup.cache.max_macs != setup.budgets[smallest]
    strategy = make_supernet_strategy(run, setup, budgets, {p: 10 + p for p in range(4)})
    state = {
        k: v.numpy() for k, v in ElasticResNet(setup.cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    messages = strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)
    sent = [list(m.content.config_records["config"]["partition-budgets"]) for m in messages]
    assert sent == [ordered] * 4

    drawn_rows, declared_rows = partition_rows(run, 4), partition_rows(run, 4, ordered)
    # the γ = 1 shares follow the declared budget: that client's partition grows, and it equals the split of a
    # federation whose drawn budgets were those
    assert len(declared_rows[smallest]) > len(drawn_rows[smallest])
    train, _ = dataset_for(run, setup.cfg)
    data = client_data(run, smallest, 4, sent[0])
    assert np.array_equal(data.labels.numpy(), train.labels.numpy()[declared_rows[smallest]])


# training-set sizes of the paper datasets (the hub's train splits)
REAL_TRAIN_SIZES = {"cifar10": 50_000, "cifar100": 50_000, "cinic10": 90_000, "tinyimagenet": 100_000}
CONFIGS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "conf").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_committed_config_partitions_at_its_real_dataset_size(path):
    """The split the run would build, with synthetic balanced labels of the real size and the client count its
    documented command uses (``num-supernodes=N``): every client gets >= 10 samples, every sample lands once."""
    import re
    import tomllib

    from fl_app.data.images import DATASETS
    from fl_app.run.config import SUPERNET_METHODS, validate_run_config
    from fl_app.supernet.shared_setup import SupernetSetup, pool_partitions

    text = path.read_text()
    clients = int(re.search(r"num-supernodes=(\d+)", text).group(1))
    run = validate_run_config(tomllib.loads(text))
    size, classes = REAL_TRAIN_SIZES[run["dataset"]], DATASETS[run["dataset"]].num_classes
    labels = np.random.default_rng(0).permutation(np.arange(size) % classes)
    if run["method"] in SUPERNET_METHODS:
        parts = pool_partitions(run, labels, SupernetSetup.build(run, clients).budgets)
        held_out = run["val-size"] + run["calib-size"]
    else:  # the model-heterogeneous methods split the whole training set by plain Dirichlet
        parts = partition_indices(labels, make_partitioner("dirichlet", clients, run["seed"], run["dirichlet-alpha"]))
        held_out = 0
    assert len(parts) == clients and min(len(p) for p in parts) >= 10
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)) == size - held_out


# -- the FEAST repository's concentration: p_k ~ Dir(α · N_k · q_i) ---------------------------------------------------
def _direct_split(labels, budgets, gamma, alpha, seed, concentration_of):
    """The budget-coupled Dirichlet split written out: per class k, p_k ~ Dir(concentration_of(N_k, q)), clients
    above their target q_i · N dealt nothing, cut points from the cumulative proportions; redrawn until every client
    holds >= 10 samples."""
    rng = np.random.default_rng(seed)
    q = budgets**gamma / (budgets**gamma).sum()
    while True:
        parts = [[] for _ in budgets]
        for k in np.unique(labels):
            rows = np.flatnonzero(labels == k)
            p = rng.dirichlet(concentration_of(len(rows), q))
            p = p * np.array([len(part) <= len(labels) * q_i for part, q_i in zip(parts, q)])
            cuts = (np.cumsum(p / p.sum()) * len(rows)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(rows, cuts)):
                part.extend(chunk.tolist())
        if min(map(len, parts)) >= 10:
            return [np.sort(part) for part in parts]


@pytest.mark.parametrize("alpha,gamma,seed", [(0.005, 1.0, 0), (0.1, 1.0, 3), (1.0, 0.5, 7)])
def test_class_size_concentration_is_the_references_formula(alpha, gamma, seed):
    budgets = np.random.default_rng(seed).uniform(25e6, 6e8, 20)
    labels = _labels(n=8000, seed=seed)
    split = partition_indices(labels, make_partitioner("gamma-class-size", 20, seed, alpha, gamma, budgets))
    direct = _direct_split(labels, budgets, gamma, alpha, seed, lambda n_k, q: np.maximum(alpha * n_k * q, 1e-6))
    assert [p.tolist() for p in split] == [p.tolist() for p in direct]


def test_the_default_gamma_split_keeps_its_concentration():
    """partitioner = "gamma" still draws Dir(α · n · q_i) (the committed runs' split), not the class-size one."""
    budgets = np.random.default_rng(2).uniform(25e6, 6e8, 20)
    labels = _labels(n=8000, seed=2)
    split = partition_indices(labels, make_partitioner("gamma", 20, 2, 0.1, 1.0, budgets))
    w = budgets**1.0
    direct = _direct_split(labels, budgets, 1.0, 0.1, 2, lambda n_k, q: 0.1 * (w / w.mean()))
    assert [p.tolist() for p in split] == [p.tolist() for p in direct]
    other = partition_indices(labels, make_partitioner("gamma-class-size", 20, 2, 0.1, 1.0, budgets))
    assert [p.tolist() for p in split] != [p.tolist() for p in other]


def test_class_size_concentration_skews_labels_less_at_the_same_alpha():
    """α · N_k · q_i is N_k / n = 40 times α · n · q_i here: a larger concentration, more even class proportions."""
    budgets = np.random.default_rng(4).uniform(25e6, 6e8, 20)
    labels = _labels(n=8000, seed=4)

    def max_share(name):
        parts = partition_indices(labels, make_partitioner(name, 20, 4, 0.1, 1.0, budgets))
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])

    assert max_share("gamma-class-size") < max_share("gamma") - 0.1


def test_an_unknown_concentration_is_named():
    with pytest.raises(ValueError, match="concentration='x': allowed values are \\['clients', 'class-size'\\]"):
        GammaPartitioner([1, 2], gamma=1.0, alpha=0.5, concentration="x")


def test_test_size_scores_the_tiers_on_a_seeded_class_stratified_sample(tmp_path):
    """``test-size`` N: the server's tiers are scored on N test images whose classes keep the test split's shares
    (within one image per class), the same for a seed and another for another seed; 0 or N >= the split: all of
    it. The run's evaluator is given that sample."""
    from fl_app.run.config import validate_run_config
    from fl_app.supernet.shared_setup import SupernetSetup, dataset_for, server_test_set
    from fl_app.supernet_app import SupernetFamily

    run = validate_run_config({"test-size": 500})
    _, test = dataset_for(run, SupernetSetup.build(run, 4).cfg)
    sample = server_test_set(run, test)
    assert len(sample) == 500
    shares = np.bincount(test.labels.numpy(), minlength=10) / len(test)
    assert np.all(np.abs(np.bincount(sample.labels.numpy(), minlength=10) - 500 * shares) <= 1)
    rows = [np.flatnonzero((test.images == image).flatten(1).all(1))[0] for image in sample.images[:20]]
    assert np.array_equal(test.labels.numpy()[rows], sample.labels.numpy()[:20])
    again, other = server_test_set(run, test), server_test_set(validate_run_config({"test-size": 500, "seed": 1}), test)
    assert np.array_equal(again.images, sample.images) and not np.array_equal(other.images, sample.images)
    for size in (0, len(test), len(test) + 1):
        assert server_test_set(validate_run_config({"test-size": size}), test) is test

    family = SupernetFamily(run, {pid: {"node_id": 100 + pid} for pid in range(4)})
    family.prepare(tmp_path)
    assert np.array_equal(family.evaluate_fn.test.images, sample.images)
