"""clients.csv and per-round client FLOPs (fl_app.run.outputs.ClientRecords) and the analytic training cost
(fl_app.run.costs, fl_app.supernet.training_costs) against hand computations; hostile reply values are not recorded."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest

from fl_app.models.supernet_space import count_macs, load_supernet_config
from fl_app.run.costs import training_flops
from fl_app.run.outputs import ClientRecords, metrics_with_round_costs, write_round_files
from fl_app.supernet.training_costs import train_costs


def test_client_records_sum_last_and_max_over_rounds():
    records = ClientRecords([0, 1, 2], budget_macs={0: 5e5, 1: 2e6, 2: 1e7}, num_examples={0: 100, 1: 200, 2: 300})
    first = {"train-loss": 2.0, "client-seconds": 1.5, "train-flops": 1e9, "peak-rss-mb": 300.0}
    records.credit(1, [0, 1], [(0, first)])  # partition 1 sampled, nothing credited (failed or rejected)
    again = {"train-loss": 1.0, "client-seconds": 0.5, "train-flops": 2e9, "peak-rss-mb": 250.0, "cuda-peak-mb": -1.0}
    odd = {"train-loss": float("nan"), "train-flops": "many", "client-seconds": 1e3, "peak-rss-mb": True}
    records.credit(2, [0, 2], [(0, again), (2, odd), (0, {"train-flops": 5e9})])  # a partition counts once a round
    rows = {r["partition_id"]: r for r in records.rows()}
    assert rows[0]["rounds_sampled"] == 2 and rows[0]["rounds_answered"] == 2
    assert rows[0]["last_train_loss"] == 1.0 and rows[0]["client_seconds"] == 2.0
    assert rows[0]["train_flops"] == 3e9 and rows[0]["peak_rss_mb"] == 300.0
    assert math.isnan(rows[0]["cuda_peak_mb"])  # a negative value is not recorded
    assert rows[1]["rounds_sampled"] == 1 and rows[1]["rounds_answered"] == 0 and rows[1]["train_flops"] == 0
    assert math.isnan(rows[2]["last_train_loss"]) and rows[2]["train_flops"] == 0 and rows[2]["client_seconds"] == 1e3
    assert math.isnan(rows[2]["peak_rss_mb"])  # a bool is no number
    assert records.round_columns(1) == {"client_train_flops": 1e9}
    assert records.round_columns(2) == {"client_train_flops": 2e9}


def test_round_files_carry_the_flops_column_and_clients_csv(tmp_path):
    records = ClientRecords([0], budget_macs={0: 5e5}, num_examples={0: 100})
    records.credit(1, [0], [(0, {"train-flops": 7.0})])
    log = SimpleNamespace(train_loss=1.0, bytes_down=5, bytes_up=6, row=lambda r: {"round": r, "bytes_down": 5})
    metrics = metrics_with_round_costs([{"round": 1, "tier_macs": 1, "test_accuracy": 0.5}], {1: log})
    write_round_files(tmp_path, metrics, {1: log}, records)
    with open(tmp_path / "rounds.csv") as handle:
        assert list(csv.DictReader(handle)) == [{"round": "1", "bytes_down": "5", "client_train_flops": "7.0"}]
    with open(tmp_path / "metrics.csv") as handle:
        assert next(csv.DictReader(handle))["train_loss"] == "1.0"
    with open(tmp_path / "clients.csv") as handle:
        assert next(csv.DictReader(handle))["train_flops"] == "7.0"


def test_training_flops_are_six_per_mac_per_sample():
    cfg = load_supernet_config("cpu", n_classes=10)
    largest, smallest = cfg.max_subnet(), cfg.min_subnet()
    costs = train_costs(cfg, largest, smallest, [largest, smallest], samples=32 * 3)
    step = (
        count_macs(cfg, largest)
        + count_macs(cfg, smallest)
        + (count_macs(cfg, largest) + count_macs(cfg, smallest)) / 2
    )
    assert costs["train-flops"] == pytest.approx(6 * 96 * step)
    assert costs["trained-macs"] == count_macs(cfg, largest)
    assert costs["peak-rss-mb"] > 10 and costs["cuda-peak-mb"] >= 0
    assert training_flops(1e6, 10) == 6e7


def test_statistics_restored_from_a_checkpoint_state_continue_as_if_never_stopped():
    def make():
        return ClientRecords([0, 1], num_examples={0: 100, 1: 200})

    answers = {
        1: [(0, {"train-loss": 2.0, "train-flops": 1e9}), (1, {"train-flops": 3e9})],
        2: [(0, {"train-loss": 1.5, "train-flops": 2e9, "peak-rss-mb": 300.0})],
    }

    def play(records, rounds):
        for r in rounds:
            records.credit(r, [0, 1], answers[r])

    straight = make()
    play(straight, [1, 2])
    first = make()
    play(first, [1])
    resumed = make()
    resumed.restore_state(first.checkpoint_state())
    play(resumed, [2])
    assert str(resumed.rows()) == str(straight.rows())  # str: NaN == NaN
    assert resumed.flops_of_round == straight.flops_of_round == {1: 4e9, 2: 2e9}
    assert resumed.rows()[0]["rounds_answered"] == 2 and resumed.rows()[1]["rounds_sampled"] == 2

    with pytest.raises(ValueError, match=r"client statistics are of partitions \[0, 1\], this run has \[0, 1, 2\]"):
        ClientRecords([0, 1, 2]).restore_state(first.checkpoint_state())
