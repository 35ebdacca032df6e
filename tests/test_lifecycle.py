"""A server run's lifecycle (fl_app.run.lifecycle.FederatedRun), the same for every method family, on a stand-in
family whose strategy counts rounds: the round files and each round's time and memory, the checkpoint cadence,
summary.json written also when a round fails or the run is interrupted, and a resume from the checkpoint. And the
method tables of both families: one row per method, every client argument resolvable."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from fl_app.multiarch_app import MULTIARCH_METHOD_TABLE, STEP_VALUES
from fl_app.run.checkpoint import model_fingerprint
from fl_app.run.config import METHODS, SUPERNET_METHODS, validate_run_config
from fl_app.run.lifecycle import FederatedRun, MethodFamily
from fl_app.run.round_log import RoundLog
from fl_app.supernet_app import SUPERNET_METHOD_TABLE, supernet_method

NODES = {0: {"node_id": 100}, 1: {"node_id": 101}}


class CountingStrategy:
    """Round r: both partitions answer, r * 10 bytes up, 5 down; raises ``failure`` in round ``fail_in``."""

    def __init__(self, fail_in: int | None = None, failure: BaseException | None = None):
        self.fail_in, self.failure = fail_in, failure or RuntimeError("round failed")
        self.rounds: dict[int, RoundLog] = {}

    def start(self, grid, initial_arrays, num_rounds, timeout, evaluate_fn, first_round, round_done):
        for r in range(first_round, num_rounds + 1):
            if r == self.fail_in:
                raise self.failure
            self.rounds[r] = RoundLog(sampled=[0, 1], accepted=[0, 1], bytes_up=10 * r, bytes_down=5)
            round_done(r)
        return "result"

    def checkpoint_state(self) -> dict:
        return {r: log_.to_dict() for r, log_ in self.rounds.items()}


class CountingFamily(MethodFamily):
    def __init__(self, run, strategy: CountingStrategy, checkpoint_last_round: bool = False):
        self.run, self.strategy, self.checkpoint_last_round = run, strategy, checkpoint_last_round
        self.fingerprint = model_fingerprint(run, {"counting": 1})
        self.client_columns = {"num_examples": {0: 5, 1: 7}}
        self.finished, self.restored_round = [], None

    def restore(self, blob, path):
        self.strategy.rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in blob["strategy"].items()}
        self.restored_round = blob["round"]

    def initial_arrays(self):
        return None

    def metrics_rows(self):
        return [{"round": r, "accuracy": r / 10} for r in sorted(self.strategy.rounds)]

    def checkpoint_state(self):
        return {"strategy": self.strategy.checkpoint_state()}

    def summary_fields(self):
        return {"family_key": "counting"}

    def save_final(self, out_dir, result):
        self.finished.append(result)


def _run(tmp_path, name: str, **overrides):
    return validate_run_config(
        {"num-server-rounds": 4, "checkpoint-every": 2, "output-dir": str(tmp_path / name), **overrides}
    )


def _rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.parametrize("checkpoint_last_round, checkpoint_round", [(False, 2), (True, 4)])
def test_a_finished_run_writes_round_files_checkpoints_and_its_summary(
    tmp_path, checkpoint_last_round, checkpoint_round
):
    run = _run(tmp_path, "done")
    family = CountingFamily(run, CountingStrategy(), checkpoint_last_round)
    summary = FederatedRun(run, NODES, family).execute(grid=None)

    folder = tmp_path / "done"
    assert _summary(folder) == summary and family.finished == ["result"]
    assert summary["completed"] is True and summary["error"] is None
    assert summary["rounds_done"] == 4 and summary["resumed_after_round"] == 0
    assert summary["family_key"] == "counting" and summary["num_clients"] == 2
    assert summary["bytes_up"] == 10 + 20 + 30 + 40 and summary["bytes_down"] == 4 * 5
    assert summary["accepted_replies"] == 8 and summary["failed_replies"] == 0
    rounds = _rows(folder / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [1, 2, 3, 4]
    assert all(float(r["seconds"]) >= 0 and float(r["server_rss_mb"]) > 0 for r in rounds)  # measured each round
    assert [float(r["accuracy"]) for r in _rows(folder / "metrics.csv")] == [0.1, 0.2, 0.3, 0.4]
    assert [r["num_examples"] for r in _rows(folder / "clients.csv")] == ["5", "7"]
    # every 2 rounds; after the last one only for a family without a final model file
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["round"] == checkpoint_round


@pytest.mark.parametrize(
    "failure, error", [(RuntimeError("round failed"), "RuntimeError: round failed"), (KeyboardInterrupt(), "Keyboard")]
)
def test_a_failed_or_interrupted_run_says_how_far_it_got_and_raises(tmp_path, failure, error):
    run = _run(tmp_path, "failed", **{"checkpoint-every": 1})
    family = CountingFamily(run, CountingStrategy(fail_in=3, failure=failure))
    with pytest.raises(type(failure)):
        FederatedRun(run, NODES, family).execute(grid=None)

    summary = _summary(tmp_path / "failed")
    assert summary["completed"] is False and summary["error"].startswith(error)
    assert summary["rounds_done"] == 2 and summary["bytes_up"] == 10 + 20
    assert family.finished == []  # no final files for a run that did not finish
    assert [int(r["round"]) for r in _rows(tmp_path / "failed" / "metrics.csv")] == [1, 2]


def test_a_resumed_run_continues_after_the_checkpoints_round(tmp_path):
    crashed = _run(tmp_path, "crashed", **{"checkpoint-every": 1})
    with pytest.raises(RuntimeError):
        FederatedRun(crashed, NODES, CountingFamily(crashed, CountingStrategy(fail_in=3))).execute(grid=None)

    run = _run(tmp_path, "resumed", **{"checkpoint-every": 1, "resume-from": str(tmp_path / "crashed")})
    family = CountingFamily(run, CountingStrategy())
    summary = FederatedRun(run, NODES, family).execute(grid=None)
    assert family.restored_round == 2
    assert summary["completed"] is True and summary["resumed_after_round"] == 2 and summary["rounds_done"] == 4
    assert summary["bytes_up"] == 10 + 20 + 30 + 40  # the rounds before the resume count too
    assert [float(r["accuracy"]) for r in _rows(tmp_path / "resumed" / "metrics.csv")] == [0.1, 0.2, 0.3, 0.4]
    seconds = [float(r["seconds"]) for r in _rows(tmp_path / "resumed" / "rounds.csv")]
    assert len(seconds) == 4 and not any(math.isnan(s) for s in seconds)


def test_a_checkpoint_of_another_family_is_refused_before_the_output_folder_is_claimed(tmp_path):
    crashed = _run(tmp_path, "crashed", **{"checkpoint-every": 1})
    with pytest.raises(RuntimeError):
        FederatedRun(crashed, NODES, CountingFamily(crashed, CountingStrategy(fail_in=3))).execute(grid=None)
    run = _run(tmp_path, "other", **{"resume-from": str(tmp_path / "crashed")})
    family = CountingFamily(run, CountingStrategy())
    family.fingerprint = model_fingerprint(run, {"counting": 2})
    with pytest.raises(ValueError, match="a checkpoint of another model"):
        FederatedRun(run, NODES, family)
    assert not (tmp_path / "other").exists()


def test_every_method_has_one_row_in_its_familys_table():
    assert sorted(SUPERNET_METHOD_TABLE) == sorted(SUPERNET_METHODS)
    assert sorted([*SUPERNET_METHOD_TABLE, *MULTIARCH_METHOD_TABLE]) == sorted(METHODS)
    with pytest.raises(ValueError, match="method='fedtopo': allowed supernet-family methods are"):
        supernet_method(validate_run_config({"method": "fedtopo"}))


def test_every_client_argument_is_a_step_value_or_a_run_config_key():
    run = validate_run_config({"method": "fedtopo"})
    for name, method in MULTIARCH_METHOD_TABLE.items():
        calls = [c for c in (method.before_training, method.loss, method.upload) if c is not None]
        for call in calls:
            for argument in call.arguments:
                assert argument in STEP_VALUES or argument in run.values, (name, argument)
        for key in method.strategy_options.values():
            assert key in run.values, (name, key)
