"""The optional experiment tracker (run-config key `tracker`): TensorBoard event files mirror every number of
rounds.csv and metrics.csv at step = round, read back with TensorBoard's own event reader; off by default, nothing
extra is written and the results are the same; a tracker whose package is missing is refused naming the key."""

from __future__ import annotations

import csv
import importlib.util
import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator  # the test extra installs it

from experiments.runner.in_process_grid import run_in_process
from fl_app.run import tracker
from fl_app.run.config import validate_run_config
from fl_app.run.outputs import write_results, write_round_files
from fl_app.run.round_log import RoundLog
from tests.harness.in_process import TINY_RUN

TINY = {"method": "fedtopo", **TINY_RUN, "checkpoint-every": 0}


def _events(folder) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from the TensorBoard event files under ``folder``."""
    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def _expected(out_dir) -> dict[str, list[tuple[int, float]]]:
    """What the tracker must have logged: every number in rounds.csv and metrics.csv, as float32."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for name, prefix in (("rounds.csv", "rounds"), ("metrics.csv", "metrics")):
        with open(out_dir / name) as handle:
            for row in csv.DictReader(handle):
                step = int(row["round"])
                suffix = f"/{float(row['tier_macs']) / 1e6:.2f}M" if row.get("tier_macs") else ""
                for key, text in row.items():
                    if key in ("round", "tier_macs") or text in ("", "True", "False"):
                        continue
                    tag = f"{prefix}/{key}{suffix}"
                    expected.setdefault(tag, []).append((step, float(np.float32(float(text)))))
    return expected


def _same(events: dict, expected: dict) -> None:
    assert sorted(events) == sorted(expected)
    for tag, points in expected.items():
        got = events[tag]
        assert [s for s, _ in got] == [s for s, _ in points], tag  # each round once, in order
        for (_, value), (_, want) in zip(got, points):
            assert value == want or (math.isnan(value) and math.isnan(want)), tag


def _log(seconds: float, loss: float) -> RoundLog:
    log_ = RoundLog()
    log_.sampled, log_.accepted = [0, 1, 2], [0, 2]
    log_.train_loss, log_.bytes_down, log_.bytes_up, log_.seconds = loss, 1000, 900, seconds
    return log_


def test_tensorboard_mirrors_the_round_files_once_per_round(tmp_path):
    run = validate_run_config({"tracker": "tensorboard"})
    rows = [
        {"round": 2, "tier_macs": 4.9e5, "test_accuracy": 0.25, "population_weighted_accuracy": 0.3},
        {"round": 2, "tier_macs": 1.355e7, "test_accuracy": 0.5, "population_weighted_accuracy": 0.3},
    ]
    rounds = {1: _log(1.5, 2.25)}
    with tracker.tracking(run, 4242):
        write_round_files(tmp_path, [], rounds)
        rounds[2] = _log(1.25, math.nan)  # a round without a loss: NaN is mirrored as NaN
        write_round_files(tmp_path, rows, rounds)
        write_results(tmp_path, {"completed": True}, rows, rounds)  # the end writes every round again
    events = _events(tmp_path / "tensorboard")
    _same(events, _expected(tmp_path))
    assert events["metrics/test_accuracy/13.55M"] == [(2, 0.5)]
    assert json.loads((tmp_path / tracker.RUN_RECORD).read_text()) == {"flower_run_id": "4242"}


def test_a_run_with_tensorboard_has_the_same_results_and_mirrors_them(tmp_path):
    plain = validate_run_config({**TINY, "output-dir": str(tmp_path / "plain")})
    tracked = validate_run_config({**TINY, "output-dir": str(tmp_path / "tracked"), "tracker": "tensorboard"})
    run_in_process(plain, 3)
    with tracker.tracking(tracked, 7):
        run_in_process(tracked, 3)
    assert (tmp_path / "plain" / "metrics.csv").read_bytes() == (tmp_path / "tracked" / "metrics.csv").read_bytes()
    _same(_events(tmp_path / "tracked" / "tensorboard"), _expected(tmp_path / "tracked"))
    assert not (tmp_path / "plain" / "tensorboard").exists() and not (tmp_path / "plain" / tracker.RUN_RECORD).exists()


def test_off_by_default_writes_no_tracker_files(tmp_path):
    run = validate_run_config({})
    assert run["tracker"] == ""
    with tracker.tracking(run, 1):
        write_round_files(tmp_path, [], {1: _log(1.0, 1.0)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flower_run.json", "metrics.csv", "rounds.csv"]


def test_a_tracker_whose_package_is_missing_is_refused_before_training(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(tracker.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    run = validate_run_config({"tracker": "wandb"})
    with pytest.raises(ValueError, match=r"tracker='wandb': the wandb package is not installed .* allowed values are"):
        with tracker.tracking(run):
            pytest.fail("the session opened")


def test_an_unknown_tracker_is_refused_by_the_run_config():
    with pytest.raises(ValueError, match=r"tracker='mlflow': allowed values are \['', 'tensorboard', 'wandb'\]"):
        validate_run_config({"tracker": "mlflow"})
