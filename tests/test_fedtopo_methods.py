"""The model-heterogeneous methods through their strategies and client functions, without Ray: hand-made replies
for the strategies, direct calls of the client function, and a two-round in-process simulation of every method."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from experiments.runner.flower_internals import set_reply_source
from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from fl_app.data.local_splits import client_data, client_rows
from fl_app.models.multiarch import architecture_of, forward_macs
from fl_app.multiarch_app import (
    MODEL_STATE,
    MULTIARCH_METHODS,
    build_strategy,
    evaluate_multiarch,
    load_client_model,
    train_multiarch,
)
from fl_app.run.config import validate_run_config
from fl_app.run.payload import record_bytes, record_to_state, state_to_record
from strategies.fedtopo import merge_relations, uniform_topology

TINY = {
    "method": "fedtopo",
    "num-server-rounds": 2,
    "clients-per-round": 3,
    "max-local-steps": 2,
    "batch-size": 16,
    "eval-every": 1,
    "proto-max-samples": 64,
    "tgp-server-epochs": 5,
    "test-fraction": 0.05,
}
NUM_CLIENTS = 4


def _run(tmp_path, **overrides):
    return validate_run_config({**TINY, "output-dir": str(tmp_path / "out"), **overrides})


def _reply(msg: Message, upload: dict, num_examples: int) -> Message:
    reply = Message(
        RecordDict(
            {
                "upload": state_to_record(upload),
                "metrics": MetricRecord({"num-examples": num_examples, "train-loss": 1.0}),
            }
        ),
        reply_to=msg,
    )
    set_reply_source(reply, msg.metadata.dst_node_id)
    return reply


def _eval_reply(msg: Message, correct: int, total: int) -> Message:
    reply = Message(RecordDict({"metrics": MetricRecord({"correct": correct, "num-test": total})}), reply_to=msg)
    set_reply_source(reply, msg.metadata.dst_node_id)
    return reply


def test_fedtopo_strategy_broadcasts_merges_and_scores(flower_ids, tmp_path):
    run = _run(tmp_path, **{"clients-per-round": 2, "topo-kappa": 5.0, "eval-every": 2})
    nodes = {pid: 100 + pid for pid in range(3)}
    strategy = build_strategy(run, nodes)
    messages = list(strategy.configure_train(1, state_to_record({}), ConfigRecord(), grid=None))
    assert len(messages) == 2 and all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    sent = record_to_state(messages[0].content.array_records["arrays"])
    np.testing.assert_allclose(sent["topology"], uniform_topology(10), rtol=1e-6)  # before any merge

    rng = np.random.default_rng(0)
    uploads, sizes = [], []
    for i, msg in enumerate(messages):
        size = strategy.train_size_of_partition[msg.metadata.dst_node_id - 100]
        counts = rng.multinomial(size, np.full(10, 0.1)).astype(np.float32)
        counts[i + 1] += counts[i]  # each client misses a class
        counts[i] = 0
        held = counts > 0
        scores = rng.uniform(-1, 1, (10, 10))
        scores = np.where(held[:, None] & held[None, :] & ~np.eye(10, dtype=bool), (scores + scores.T) / 2, 0)
        uploads.append({"relations": scores.astype(np.float32), "counts": counts})
        sizes.append(size)
    # the server checks uploaded counts against each split's true counts: here, the made-up ones
    strategy.train_counts_of_partition = {m.metadata.dst_node_id - 100: u["counts"] for m, u in zip(messages, uploads)}
    replies = [_reply(m, u, n) for m, u, n in zip(messages, uploads, sizes)]
    unsampled = ({0, 1, 2} - {m.metadata.dst_node_id - 100 for m in messages}).pop()
    stray = _reply(messages[0], uploads[0], sizes[0])
    set_reply_source(stray, 100 + unsampled)
    _, metrics = strategy.aggregate_train(1, replies + [stray])
    log_ = strategy.rounds[1]  # a reply from a node that was sent no message is ignored: credited to nobody
    assert log_.rejected == [] and unsampled not in log_.accepted + log_.failed
    expected, _, _ = merge_relations(
        np.stack([u["relations"] for u in uploads]),
        np.stack([u["counts"] for u in uploads]),
        run["topo-tau"],
        "support",
        5.0,
    )
    np.testing.assert_allclose(strategy.global_arrays["topology"], expected, rtol=1e-5)
    assert metrics["bytes-up"] == sum(record_bytes(state_to_record(u)) for u in uploads) + record_bytes(
        state_to_record(uploads[0])
    )  # the stray reply's bytes arrived too
    assert metrics["bytes-down"] == 2 * record_bytes(state_to_record({"topology": uniform_topology(10)}))

    assert list(strategy.configure_evaluate(1, None, ConfigRecord(), None)) == []  # eval-every = 2
    evals = list(strategy.configure_evaluate(2, None, ConfigRecord(), None))
    assert sorted(m.metadata.dst_node_id for m in evals) == [100, 101, 102]
    assert all(m.metadata.message_type == MessageType.EVALUATE for m in evals)
    tests = [strategy.test_size_of_partition[p] for p in range(3)]
    correct = [tests[0] // 2, 1, tests[2]]
    row = strategy.aggregate_evaluate(2, [_eval_reply(m, c, n) for m, c, n in zip(evals, correct, tests)])
    assert row["mean_client_accuracy"] == pytest.approx(np.mean([c / n for c, n in zip(correct, tests)]))
    assert row["pooled_accuracy"] == pytest.approx(sum(correct) / sum(tests))
    # a missing evaluation reply does not end the run; below min-reply-fraction (1.0 here) the round has no accuracy
    evals = list(strategy.configure_evaluate(2, None, ConfigRecord(), None))
    row = strategy.aggregate_evaluate(2, [_eval_reply(evals[0], 1, tests[0]), _eval_reply(evals[1], 1, tests[1])])
    assert math.isnan(row["mean_client_accuracy"]) and row["evaluated"] == 2 and row["eval_failed"] == 1
    assert strategy.eval_rounds[2].failed == [2]


def test_lg_fedavg_and_fd_strategies(flower_ids, tmp_path):
    nodes = {0: 100, 1: 101}
    lg = build_strategy(_run(tmp_path, method="lg-fedavg", **{"clients-per-round": 2}), nodes)
    lg.train_size_of_partition = {0: 10, 1: 30}  # what the clients' num-examples must equal
    msgs = list(lg.configure_train(1, state_to_record({}), ConfigRecord(), grid=None))
    assert record_to_state(msgs[0].content.array_records["arrays"]) == {}  # nothing to share yet
    heads = [
        {"head.weight": np.full((10, 64), v, np.float32), "head.bias": np.full(10, v, np.float32)} for v in (1.0, 4.0)
    ]
    lg.aggregate_train(1, [_reply(msgs[0], heads[0], 10), _reply(msgs[1], heads[1], 30)])
    np.testing.assert_allclose(lg.global_arrays["head.weight"], 3.25)  # (10·1 + 30·4) / 40

    fd = build_strategy(_run(tmp_path, method="fd", **{"clients-per-round": 2}), nodes)
    fd.train_size_of_partition = {0: 5, 1: 5}
    msgs = list(fd.configure_train(1, state_to_record({}), ConfigRecord(), grid=None))
    means = np.zeros((10, 10), np.float32)
    means[3] = 2.0
    counts = np.zeros(10, np.float32)
    counts[3] = 5
    fd.train_counts_of_partition = {0: counts, 1: counts}  # what their counts must be (FD: or 0, classes not seen)
    fd.aggregate_train(
        1,
        [
            _reply(msgs[0], {"means": means, "counts": counts}, 5),
            _reply(msgs[1], {"means": means * 0, "counts": counts * 0}, 5),
        ],
    )
    assert fd.global_arrays["has"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    msgs = list(fd.configure_train(2, state_to_record({}), ConfigRecord(), grid=None))
    fd.aggregate_train(2, [_reply(m, {"means": means * 0, "counts": counts * 0}, 5) for m in msgs])
    np.testing.assert_allclose(fd.global_arrays["soft-labels"][3], 2.0)  # a class nobody uploaded keeps its value


def test_client_partitions_are_seeded_disjoint_and_locally_distributed(tmp_path):
    run = _run(tmp_path, **{"dirichlet-alpha": 0.3, "test-fraction": 0.2})
    rows = client_rows(run, NUM_CLIENTS)
    again = client_rows(validate_run_config({**run.to_dict()}), NUM_CLIENTS)
    train, test = client_data(run, 0, NUM_CLIENTS)
    all_rows = np.concatenate([np.concatenate(r) for r in rows])
    assert len(all_rows) == len(np.unique(all_rows))  # no image in two places
    for (tr, te), (tr2, te2) in zip(rows, again):
        np.testing.assert_array_equal(tr, tr2)
        np.testing.assert_array_equal(te, te2)
        assert abs(len(te) / (len(tr) + len(te)) - 0.2) < 0.01
    share_train = np.bincount(train.labels.numpy(), minlength=10) / len(train)
    share_test = np.bincount(test.labels.numpy(), minlength=10) / len(test)
    assert np.abs(share_train - share_test).max() < 0.05  # the test split follows the client's own labels


def _message(pid: int, arrays: dict, server_round: int = 1, message_type: str = MessageType.TRAIN):
    config = ConfigRecord({"server-round": server_round, "lr": 0.05, "payload-dtype": "float32"})
    return Message(
        RecordDict({"arrays": state_to_record(arrays), "config": config}),
        message_type=message_type,
        dst_node_id=100 + pid,
    )


def test_fedtopo_client_uploads_only_relations_and_true_counts_and_keeps_its_model(flower_ids, tmp_path):
    run = _run(tmp_path, **{"proto-max-samples": 16})  # the cap limits compute, not the reported counts
    context = InProcessGrid(run, NUM_CLIENTS).contexts[1]
    before = {k: v.clone() for k, v in load_client_model(run, 1, context.state).state_dict().items()}
    reply = train_multiarch(_message(1, {"topology": uniform_topology(10)}), run, 1, NUM_CLIENTS, context)
    upload = record_to_state(reply.content.array_records["upload"])
    assert set(upload) == {"relations", "counts"}  # no weights leave the client
    train, test = client_data(run, 1, NUM_CLIENTS)
    counts = np.bincount(train.labels.numpy(), minlength=10)
    held = counts > 0
    assert len(train) > 16 and upload["counts"].tolist() == counts.tolist()
    pairs = held[:, None] & held[None, :] & ~np.eye(10, dtype=bool)
    assert np.all(upload["relations"][~pairs] == 0) and np.all(np.abs(upload["relations"][pairs]) <= 1)
    np.testing.assert_allclose(upload["relations"], upload["relations"].T, atol=1e-6)
    after = load_client_model(run, 1, context.state).state_dict()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)  # kept in the node state
    reply = evaluate_multiarch(_message(1, {}, message_type=MessageType.EVALUATE), run, 1, NUM_CLIENTS, context)
    metrics = reply.content.metric_records["metrics"]
    assert metrics["num-test"] == len(test) and 0 <= metrics["correct"] <= len(test)


@pytest.mark.parametrize("method", MULTIARCH_METHODS)
def test_every_method_runs_a_two_round_simulation(flower_ids, tmp_path, method):
    run = _run(tmp_path, method=method)
    grid = InProcessGrid(run, NUM_CLIENTS)
    summary = run_in_process(run, NUM_CLIENTS, grid)
    out = tmp_path / "out"
    saved = json.loads((out / "summary.json").read_text())
    for key in (
        "method",
        "dataset",
        "rounds",
        "seed",
        "mean_client_accuracy",
        "pooled_accuracy",
        "bytes_up",
        "bytes_down",
        "history",
    ):
        assert key in saved
    assert saved["method"] == method and saved["rounds"] == 2
    assert [h["round"] for h in saved["history"]] == [1, 2]
    assert 0 <= saved["mean_client_accuracy"] <= 1 and 0 <= saved["pooled_accuracy"] <= 1
    assert len((out / "metrics.csv").read_text().strip().splitlines()) == 3
    assert (out / "accuracy_per_round.png").read_bytes()[:4] == b"\x89PNG"
    # every client that trained keeps its model in its node state; the others never built one
    assert sorted(p for p, c in grid.contexts.items() if MODEL_STATE in c.state.array_records) == sorted(
        {p for r in (1, 2) for p in _sampled(run, r)}
    )
    if method == "local":
        assert summary["bytes_up"] == summary["bytes_down"] == 0
    else:
        assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0
    if method == "fedtopo":  # exactly S (C×C) and the counts per sampled client and round
        one = record_bytes(state_to_record({"relations": np.zeros((10, 10)), "counts": np.zeros(10)}))
        assert summary["bytes_up"] == 2 * 3 * one
    # clients.csv: one row per partition, what the server knows of it and what its replies reported
    with open(out / "clients.csv") as handle:
        rows = {int(r["partition_id"]): r for r in csv.DictReader(handle)}
    rows_of = client_rows(run, NUM_CLIENTS)
    family = run["model-family"]
    for pid, row in rows.items():
        sampled = sum(pid in _sampled(run, r) for r in (1, 2))
        assert row["architecture"] == architecture_of(family, pid) and int(row["num_examples"]) == len(rows_of[pid][0])
        assert int(row["rounds_sampled"]) == int(row["rounds_answered"]) == sampled
        if sampled:  # every step trains a full batch here: 6 FLOPs per forward MAC per trained sample
            macs = forward_macs(family, row["architecture"], 10, run["feature-dim"], (3, 32, 32))
            steps = sampled * run["max-local-steps"]
            assert float(row["train_flops"]) == pytest.approx(6 * macs * steps * run["batch-size"])
            assert float(row["trained_macs"]) == macs > 0 and float(row["client_seconds"]) > 0
            assert math.isfinite(float(row["last_train_loss"]))
        else:
            assert float(row["train_flops"]) == 0 and math.isnan(float(row["last_train_loss"]))
    assert sorted(rows) == list(range(NUM_CLIENTS))
    with open(out / "rounds.csv") as handle:  # the same replies, summed per round
        per_round = list(csv.DictReader(handle))
    for round_column, client_column in (("client_seconds", "client_seconds"), ("client_train_flops", "train_flops")):
        total = sum(float(r[client_column]) for r in rows.values())
        assert sum(float(r[round_column]) for r in per_round) == pytest.approx(total) and total > 0


def _sampled(run, server_round):
    from strategies.rounds import sample_partitions

    return sample_partitions(range(NUM_CLIENTS), run["clients-per-round"], run["seed"], server_round)


def test_same_seed_same_results(flower_ids, tmp_path):
    first = run_in_process(_run(tmp_path / "a"), NUM_CLIENTS)
    second = run_in_process(_run(tmp_path / "b"), NUM_CLIENTS)
    assert first["history"] == second["history"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"topo-weighting": "median"}, "topo-weighting='median': allowed values are ['support', 'mean']"),
        ({"topo-source": "weights"}, "topo-source='weights': allowed values are ['prototypes', 'logits']"),
        ({"model-family": "gpu"}, "model-family='gpu': allowed values are ['cpu', 'paper']"),
        ({"topo-tau": 0.0}, "topo-tau=0.0: must be"),
        ({"test-fraction": 1.0}, "test-fraction=1.0: must be in (0, 1)"),
        ({"method": "fedx"}, "'fedtopo', 'local', 'lg-fedavg', 'fd', 'fedproto', 'fedtgp'"),
    ],
)
def test_bad_fedtopo_values_are_named(override, fragment):
    with pytest.raises(ValueError) as err:
        validate_run_config(override)
    assert fragment in str(err.value)


def test_clients_per_round_above_the_federation_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"clients-per-round=3: must be <= the number of clients \(2"):
        build_strategy(_run(tmp_path), {0: 100, 1: 101})
