"""experiments.runner verify / compare: retrain runs into a new folder and say, per metric, whether their numbers
equal the committed ones.

Runs are launched through test_runner's stand-in (deterministic files, no Flower); the real retrain of a smoke run
through `flwr run` is in test_runner.py (it reuses that file's trained smoke suite).
"""

from __future__ import annotations

import json

import pytest

from experiments.runner import SuiteMismatch, compare_run, load_suite, main, run_suite, verify
from fl_app.run.outputs import write_csv
from tests.harness.suites import write_suite
from tests.test_runner import SUITE, FakeLauncher


class ShiftedLauncher(FakeLauncher):
    """The stand-in, with one method's accuracy moved by ``shift`` and every run's timings changed."""

    def __init__(self, label: str, shift: float):
        super().__init__()
        self.label, self.shift = label, shift

    def __call__(self, run, timeout):
        status = super().__call__(run, timeout)
        rounds = run.run_config["num-server-rounds"]
        write_csv(  # time is measured, not computed: never compared
            run.folder / "rounds.csv",
            [{"round": r, "client_seconds": 99.0 + r} for r in range(1, rounds + 1)],
            replace=True,
        )
        if run.label == self.label:
            path = run.folder / "summary.json"
            summary = json.loads(path.read_text())
            summary["population_weighted_accuracy"] += self.shift
            path.write_text(json.dumps(summary))
        return status


@pytest.fixture
def committed(tmp_path):
    """A finished suite (3 methods x 3 seeds) standing in for a committed results folder."""
    suite = write_suite(tmp_path, SUITE)
    run_suite(suite, tmp_path / "committed", launch=FakeLauncher(), printer=lambda *a, **k: None, plots=False)
    return suite, tmp_path / "committed"


def verify_subset(suite, committed, out, launcher, **kwargs):
    lines = []
    equal = verify(
        load_suite(suite, seeds=[0], methods=["feast", "fedavg-min"]),
        committed,
        out,
        launch=launcher,
        printer=lambda text, **_: lines.append(text),
        **kwargs,
    )
    return equal, "\n".join(lines)


def test_a_retrained_subset_equal_to_the_committed_runs_is_reported_equal(committed, tmp_path):
    suite, folder = committed
    launcher = ShiftedLauncher("none", 0.0)  # same numbers, other timings
    equal, text = verify_subset(suite, folder, tmp_path / "new", launcher)
    assert equal, text
    assert sorted(launcher.launched) == [("feast", 0, {}), ("fedavg-min", 0, {})]  # only the chosen cells train
    assert text.count("EQUAL ") == 2 and "all equal" in text and "bit-identical" in text
    assert "committed runs made at commit" in text
    assert (tmp_path / "new/runs/feast/seed0/summary.json").exists()


def test_a_differing_number_is_named_with_its_file_metric_and_size(committed, tmp_path):
    suite, folder = committed
    equal, text = verify_subset(suite, folder, tmp_path / "new", ShiftedLauncher("feast", 0.01))
    assert not equal
    assert "DIFFERS feast seed=0" in text and "EQUAL   fedavg-min seed=0" in text
    assert "summary.json population_weighted_accuracy: 1 of 1 differ, largest |diff| 0.01" in text
    assert "some numbers differ" in text


def test_a_tolerance_accepts_small_differences_and_says_so(committed, tmp_path):
    suite, folder = committed
    equal, text = verify_subset(suite, folder, tmp_path / "new", ShiftedLauncher("feast", 1e-9), tolerance=1e-6)
    assert equal and "equal within 1e-06" in text


def test_verify_refuses_a_used_folder_and_cells_the_committed_folder_lacks(committed, tmp_path):
    suite, folder = committed
    with pytest.raises(SuiteMismatch, match="not empty"):
        verify_subset(suite, folder, folder, FakeLauncher())
    launcher = FakeLauncher()
    with pytest.raises(SuiteMismatch, match="no finished run with these settings for: feast seed=7"):
        verify(load_suite(suite, seeds=[7], methods=["feast"]), folder, tmp_path / "new", launch=launcher)
    assert launcher.launched == [] and not (tmp_path / "new").exists()  # refused before anything trains
    args = ["verify", str(suite), "--committed", str(folder), "--out", str(folder), "--seeds", "0"]
    assert main(args) == 2


def test_compare_reports_missing_files_rows_and_measured_columns_apart(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, loss, seconds in ((old, "0.5", "3.0"), (new, "0.5", "4.0")):
        folder.mkdir()
        write_csv(folder / "rounds.csv", [{"round": 1, "train_loss": loss, "seconds": seconds}])
        write_csv(folder / "metrics.csv", [{"round": 1, "test_accuracy": 0.3}])
        (folder / "summary.json").write_text(json.dumps({"wall_seconds": float(seconds), "tiers": [{"acc": 0.3}]}))
    findings, added = compare_run(old, new)
    assert all(f.equal for f in findings) and added == []
    assert {f.metric for f in findings} == {"round", "train_loss", "test_accuracy", "tiers[].acc"}
    write_csv(new / "metrics.csv", [{"round": 1, "test_accuracy": 0.3}, {"round": 2, "test_accuracy": 0.4}], True)
    (new / "clients.csv").write_text("partition_id\n0\n")
    (new / "summary.json").write_text(json.dumps({"tiers": [{"acc": 0.3}], "recorded_since": 1}))
    findings, added = compare_run(old, new)
    found = {(f.file, f.metric): f for f in findings if not f.equal}
    assert found[("metrics.csv", "test_accuracy")].first == "row 2: <absent> -> 0.4"
    assert ("clients.csv", "(file)") in found
    assert added == ["summary.json recorded_since"]  # a key the committed run predates: listed, not a difference
    (new / "summary.json").write_text(json.dumps({"wall_seconds": 1.0}))  # a key the new run lost: a difference
    lost = [f.metric for f in compare_run(old, new)[0] if not f.equal and f.file == "summary.json"]
    assert lost == ["tiers[].acc"]


def test_compare_command_matches_runs_by_their_place(committed, tmp_path, capsys):
    suite, folder = committed
    run_suite(
        load_suite(suite, seeds=[1], methods=["feast-kd0"]),
        tmp_path / "new",
        launch=ShiftedLauncher("feast-kd0", 0.5),
        printer=lambda *a, **k: None,
        plots=False,
    )
    assert main(["compare", str(folder), str(tmp_path / "new")]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS runs/feast-kd0/seed1" in out and "comparing 1 runs" in out


def test_verify_says_when_the_committed_run_was_made_on_another_machine_setup(committed, tmp_path):
    suite, folder = committed
    record_path = folder / "runs/feast/seed0/run.json"
    record = json.loads(record_path.read_text())
    record["machine"]["versions"]["torch"] = "0.0.1"  # as if made with another torch
    record_path.write_text(json.dumps(record))
    equal, text = verify_subset(suite, folder, tmp_path / "new", ShiftedLauncher("none", 0.0))
    assert equal
    assert "feast seed=0: made on another machine setup (versions torch: '0.0.1' -> " in text
    assert "seed-to-seed spread" in text and "fedavg-min seed=0: made on another" not in text
