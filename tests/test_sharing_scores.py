"""Scores that see what sharing changes (``strategies.evaluation_scores``): own-distribution mean, pooled, balanced
over each client's held classes, and each model on the global test set, by hand on made-up per-client confusion
counts; the per-class counts of an evaluation reply are screened before they count."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.app import Message as FlowerMessage

from experiments.runner.flower_internals import set_reply_source
from experiments.runner.in_process_grid import InProcessGrid
from fl_app.data.local_splits import (
    client_data,
    client_rows,
    client_validation_rows,
    global_test_class_counts,
    global_test_rows,
)
from fl_app.multiarch_app import evaluate_multiarch
from fl_app.run.config import validate_run_config
from strategies.evaluation_scores import (
    best_round_scores,
    global_accuracy_of,
    held_class_balanced_accuracy,
    own_mean_accuracy,
    pooled_accuracy,
)
from strategies.fedtopo_baselines import LocalStrategy

# three clients, three classes: per class (correct, test images), the classes each holds in training
CORRECT = {0: [8, 1, 0], 1: [0, 3, 4], 2: [2, 0, 0]}
TOTAL = {0: [10, 2, 0], 1: [0, 5, 5], 2: [4, 0, 0]}
TRAIN_COUNTS = {0: [50, 5, 0], 1: [0, 20, 30], 2: [40, 0, 3]}  # client 2 holds class 2 but has no test image of it
GLOBAL_COUNTS = np.array([10, 10, 10])
GLOBAL_CORRECT = {0: [9, 2, 0], 1: [0, 5, 10], 2: [10, 0, 0]}
# by hand: accuracies 9/12, 7/10, 2/4; balanced (8/10 + 1/2)/2, (3/5 + 4/5)/2, 2/4; global (.9+.2+0)/3, (0+.5+1)/3, 1/3
OWN_MEAN = (0.75 + 0.7 + 0.5) / 3
POOLED = 18 / 26
BALANCED = (0.65 + 0.7 + 0.5) / 3
GLOBAL = (1.1 / 3 + 1.5 / 3 + 1 / 3) / 3


def test_each_score_by_hand():
    per_client = {p: (sum(CORRECT[p]), sum(TOTAL[p])) for p in CORRECT}
    assert own_mean_accuracy(per_client) == pytest.approx(OWN_MEAN)
    assert pooled_accuracy(per_client) == pytest.approx(POOLED)
    held = {p: np.array(TRAIN_COUNTS[p]) > 0 for p in CORRECT}
    correct = {p: np.array(v) for p, v in CORRECT.items()}
    total = {p: np.array(v) for p, v in TOTAL.items()}
    assert held_class_balanced_accuracy(correct, total, held) == pytest.approx(BALANCED)
    assert [global_accuracy_of(np.array(GLOBAL_CORRECT[p]), GLOBAL_COUNTS) for p in range(3)] == pytest.approx(
        [1.1 / 3, 0.5, 1 / 3]
    )


def _strategy() -> LocalStrategy:
    return LocalStrategy(
        {p: 100 + p for p in range(3)},
        3,
        clients_per_round=3,
        seed=0,
        num_rounds=1,
        test_size_of_partition={p: sum(TOTAL[p]) for p in TOTAL},
        train_counts_of_partition={p: np.array(v, dtype=np.float32) for p, v in TRAIN_COUNTS.items()},
        test_counts_of_partition={p: np.array(v) for p, v in TOTAL.items()},
        global_test_counts=GLOBAL_COUNTS,
    )


def _metrics(pid: int) -> dict:
    return {
        "correct": sum(CORRECT[pid]),
        "num-test": sum(TOTAL[pid]),
        "class-correct": list(CORRECT[pid]),
        "class-total": list(TOTAL[pid]),
        "global-class-correct": list(GLOBAL_CORRECT[pid]),
    }


def _evaluate(strategy, metrics_of) -> dict:
    sent = list(strategy.configure_evaluate(1, None, ConfigRecord(), None))
    replies = []
    for msg in sent:
        metrics = MetricRecord(metrics_of(msg.metadata.dst_node_id - 100))
        reply = FlowerMessage(RecordDict({"metrics": metrics}), reply_to=msg)
        set_reply_source(reply, msg.metadata.dst_node_id)
        replies.append(reply)
    return strategy.aggregate_evaluate(1, replies)


def test_the_strategy_reports_every_score(flower_ids):
    strategy = _strategy()
    row = _evaluate(strategy, _metrics)
    assert row["mean_client_accuracy"] == pytest.approx(OWN_MEAN)
    assert row["pooled_accuracy"] == pytest.approx(POOLED)
    assert row["balanced_accuracy"] == pytest.approx(BALANCED)
    assert row["global_accuracy"] == pytest.approx(GLOBAL)
    assert strategy.client_global_accuracy == pytest.approx({0: 1.1 / 3, 1: 0.5, 2: 1 / 3})
    assert strategy.history[-1]["balanced_accuracy"] == pytest.approx(BALANCED)  # metrics.csv's row
    assert strategy.history[-1]["validation_accuracy"] is None  # not measured (no validation split), not NaN


HOSTILE = [
    ("sums-not-correct", {"class-correct": [7, 1, 0]}),
    ("sums-not-num-test", {"class-total": [10, 3, 0]}),
    ("total-not-the-split", {"class-correct": [8, 0, 1], "class-total": [10, 1, 1]}),
    ("correct-above-total", {"correct": 3, "class-correct": [0, 3, 0], "class-total": [10, 2, 0]}),
    ("negative", {"class-correct": [10, -1, 0]}),
    ("wrong-length", {"class-correct": [8, 1], "class-total": [10, 2]}),
    ("float-typed", {"class-correct": [8.0, 1.0, 0.0]}),
    ("only-one-list", {"class-total": None}),
    ("global-missing", {"global-class-correct": None}),
    ("global-above-counts", {"global-class-correct": [11, 0, 0]}),
    ("global-wrong-length", {"global-class-correct": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("name, change", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_an_evaluation_reply_with_inconsistent_counts_is_rejected(flower_ids, name, change):
    def metrics_of(pid):
        metrics = _metrics(pid)
        if pid == 0:
            metrics.update(change)
            metrics = {k: v for k, v in metrics.items() if v is not None}
        return metrics

    strategy = _strategy()
    row = _evaluate(strategy, metrics_of)
    assert strategy.eval_rounds[1].rejected == [0] and row["eval_rejected"] == 1
    assert math.isnan(row["balanced_accuracy"])  # below the quorum (1.0): no score from a partial evaluation


def test_the_client_reports_per_class_counts_on_its_split_and_the_global_set(flower_ids, tmp_path):
    run = validate_run_config(
        {
            "method": "local",
            "test-fraction": 0.05,
            "validation-fraction": 0.1,
            "global-test-per-class": 7,
            "output-dir": str(tmp_path / "o"),
        }
    )
    assert global_test_class_counts(run).tolist() == [7] * 10 and len(global_test_rows(run)) == 70
    context = InProcessGrid(run, 4).contexts[1]
    config = ConfigRecord({"server-round": 1, "lr": 0.05, "payload-dtype": "float32"})
    msg = FlowerMessage(RecordDict({"config": config}), dst_node_id=101, message_type=MessageType.EVALUATE)
    metrics = evaluate_multiarch(msg, run, 1, 4, context).content.metric_records["metrics"]
    _, test = client_data(run, 1, 4)
    assert metrics["class-total"] == np.bincount(test.labels.numpy(), minlength=10).tolist()
    assert sum(metrics["class-correct"]) == metrics["correct"] and metrics["num-test"] == len(test)
    assert metrics["num-val"] == len(client_validation_rows(run, 4)[1]) > 0 and 0 <= metrics["val-correct"]
    assert len(metrics["global-class-correct"]) == 10 and all(0 <= c <= 7 for c in metrics["global-class-correct"])


# -- the best round, chosen on validation --------------------------------------------------------------------------
def test_the_best_round_is_chosen_on_validation_not_test():
    nan = math.nan
    history = [
        {"round": 1, "validation_accuracy": 0.5, "mean_client_accuracy": 0.9, "pooled_accuracy": 0.9},
        {"round": 2, "validation_accuracy": 0.7, "mean_client_accuracy": 0.6, "pooled_accuracy": 0.61},
        {"round": 3, "validation_accuracy": 0.7, "mean_client_accuracy": 0.8, "pooled_accuracy": 0.8},
        {"round": 4, "validation_accuracy": nan, "mean_client_accuracy": 0.95, "pooled_accuracy": 0.95},
    ]
    best = best_round_scores(history)  # round 2: the highest validation score, the earliest of the tie; not round 4
    assert best["best_round"] == 2 and best["best_validation_accuracy"] == 0.7
    assert best["best_mean_client_accuracy"] == 0.6 and best["best_pooled_accuracy"] == 0.61
    assert best_round_scores([{"round": 1, "validation_accuracy": nan}])["best_round"] is None  # no validation split


def test_the_validation_split_comes_from_the_training_rows_only(tmp_path):
    base = {"method": "local", "test-fraction": 0.2}
    before = client_rows(validate_run_config(base), 4)
    run = validate_run_config({**base, "validation-fraction": 0.1})
    after, validation = client_rows(run, 4), client_validation_rows(run, 4)
    for (train0, test0), (train, test), val in zip(before, after, validation):
        np.testing.assert_array_equal(test, test0)  # the test split is untouched
        np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), train0)  # carved from training rows
        assert len(val) == round(0.1 * (len(train0) + len(test0))) and not set(val) & set(train)
    with pytest.raises(ValueError, match="test-fraction \\+ validation-fraction < 1"):
        validate_run_config({**base, "test-fraction": 0.6, "validation-fraction": 0.4})


def _validation_strategy() -> LocalStrategy:
    strategy = _strategy()
    strategy.validation_size_of_partition = {0: 6, 1: 4, 2: 5}
    return strategy


def test_validation_scores_are_screened_and_reported(flower_ids):
    correct = {0: 3, 1: 4, 2: 0}
    row = _evaluate(
        _validation_strategy(), lambda p: {**_metrics(p), "val-correct": correct[p], "num-val": [6, 4, 5][p]}
    )
    assert row["validation_accuracy"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    for bad in ({"val-correct": 7, "num-val": 6}, {"val-correct": 1, "num-val": 9}, {"val-correct": 1.0, "num-val": 6}):
        strategy = _validation_strategy()
        row = _evaluate(
            strategy,
            lambda p, bad=bad: {**_metrics(p), "val-correct": 1, "num-val": [6, 4, 5][p], **(bad if p == 0 else {})},
        )
        assert strategy.eval_rounds[1].rejected == [0] and math.isnan(row["validation_accuracy"])
