"""Runs matched to another label's client training compute (the suite key ``match-compute``): suite checks, the
rounds read from the finished runs of the seed, the runner's order, reuse, refusals and resumption through a
stand-in launcher (no Flower), and the report's matched-compute table, all against hand computations."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from experiments.runner import (
    COMPLETED,
    RUN_RECORD,
    SuiteMismatch,
    expand,
    load_suite,
    matched_rounds,
    plan,
    settle_match,
)
from fl_app.report import find_runs, report, report_text, write_tables
from fl_app.run.outputs import write_csv, write_json
from tests.harness.suites import run_collecting, write_suite, write_summary

SUITE = """
[suite]
seeds = [0, 1]
reference = "feast"
[base]
num-server-rounds = 4
eval-every = 2
checkpoint-every = 1
[federation]
num-supernodes = 4
client-resources-num-cpus = 1
[methods]
feast = {}
fedavg-min-matched = { method = "fedavg-min", match-compute = "feast" }
fedavg-min = {}
"""
# client training FLOPs of each round, by label and seed (a longer run repeats its seed's four values)
FLOPS = {
    "feast": {0: [3.0e9, 3.2e9, 2.8e9, 3.0e9], 1: [3.5e9, 3.5e9, 3.6e9, 3.4e9]},  # totals 12e9 and 14e9
    "fedavg-min": {0: [1.0e9, 1.1e9, 0.9e9, 1.2e9], 1: [1.0e9] * 4},  # 1.05e9 and 1e9 per round
}
# by hand: ceil(12e9 / 1.05e9) = ceil(11.43) = 12 rounds and 14e9 / 1e9 = 14 rounds; the source made
# ceil(4 / 2) = 2 evaluations, so eval-every = ceil(12 / 2) = 6 and ceil(14 / 2) = 7
MATCHED = {0: (12, 6), 1: (14, 7)}


class Launcher:
    """Writes what a finished run writes; FLOPs of the method's seed (times ``scale``), accuracy 0.3 + rounds/100."""

    def __init__(self, fail: set = frozenset(), scale: float = 1.0, interrupt: tuple | None = None):
        self.launched, self.fail, self.scale, self.interrupt = [], fail, scale, interrupt

    def __call__(self, run, timeout):
        rounds, config = run.run_config["num-server-rounds"], run.run_config
        self.launched.append((run.label, run.seed, rounds, config["eval-every"], run.resume_from))
        if (run.label, run.seed) in self.fail:
            return "finished:failed"
        method = "feast" if run.label == "feast" else "fedavg-min"
        flops = [self.scale * FLOPS[method][run.seed][(r - 1) % 4] for r in range(1, rounds + 1)]
        if (run.label, run.seed) == self.interrupt:  # killed after its round-2 checkpoint
            from fl_app.run.checkpoint import save_verified

            write_round_files(run.folder, flops[:2], 0.3)
            save_verified(run.folder / "checkpoint.pt", {"round": 2, "run_config": {}}, {"sha256": "model"})
            raise KeyboardInterrupt
        accuracy = 0.3 + rounds / 100
        write_round_files(run.folder, flops, accuracy)
        write_summary(run.folder, config["method"], rounds, run.seed, accuracy, run.launch_config())
        return COMPLETED


def write_round_files(folder: Path, flops: list[float], accuracy: float) -> None:
    write_csv(folder / "rounds.csv", [{"round": r, "client_train_flops": f} for r, f in enumerate(flops, 1)])
    write_csv(folder / "metrics.csv", [{"round": len(flops), "population_weighted_accuracy": accuracy}])


def run(tmp_path, launcher, text: str = SUITE, **kwargs):
    result, lines = run_collecting(write_suite(tmp_path, text), tmp_path / "out", launcher, **kwargs)
    return result, "\n".join(lines)


# -- the suite file ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "entry, expected",
    [
        ('x = { method = "fedavg-min", match-compute = "fedprox" }', "match-compute='fedprox': not a [methods] label"),
        ('x = { method = "fedavg-min", match-compute = "fedavg-min-matched" }', "allowed: one of ['feast', 'fedavg"),
        ('x = { method = "fedavg-min", lr = 0.1, match-compute = "feast" }', "no [methods] label has its overrides"),
        ('x = { method = "fedavg-min", match-compute = "x" }', "x: match-compute='x': a run cannot match its own"),
        ('x = { method = "fedavg-min", num-server-rounds = 9, match-compute = "feast" }', "sets num-server-rounds"),
        ('x = { method = "feast", match-compute = "feast" }', "its equal-rounds run is feast itself"),
    ],
)
def test_a_bad_match_compute_entry_is_refused_naming_the_section_key_and_labels(tmp_path, entry, expected):
    with pytest.raises(ValueError) as error:
        load_suite(write_suite(tmp_path, SUITE + entry + "\n"))
    assert f"[methods] {entry.split()[0]}: match-compute=" in str(error.value) and expected in str(error.value)


def test_a_methods_subset_must_name_the_runs_a_matched_run_reads_its_rounds_from(tmp_path):
    with pytest.raises(ValueError, match=r"read their rounds from \['feast', 'fedavg-min'\]; name those too"):
        load_suite(write_suite(tmp_path, SUITE), methods=["fedavg-min-matched"])
    assert load_suite(write_suite(tmp_path, SUITE), methods=["fedavg-min", "feast", "fedavg-min-matched"]).matched


def test_matched_entries_run_last_in_each_seed_without_the_runner_key(tmp_path):
    suite = load_suite(write_suite(tmp_path, SUITE))
    assert suite.matched == {"fedavg-min-matched": ("feast", "fedavg-min")}
    runs = expand(suite)
    assert [(r.label, r.seed) for r in runs] == [
        ("feast", 0),
        ("fedavg-min", 0),
        ("fedavg-min-matched", 0),
        ("feast", 1),
        ("fedavg-min", 1),
        ("fedavg-min-matched", 1),
    ]
    matched = runs[2]
    assert matched.match == ("feast", "fedavg-min") and "match-compute" not in matched.run_config
    assert matched.run_config["method"] == "fedavg-min"


# -- the rounds, from the finished runs of the seed ----------------------------------------------------------------
def finished_folder(folder: Path, flops: list[float], columns: str = "client_train_flops") -> Path:
    """A run folder as a finished run leaves it, as far as the rounds are read: run.json, summary.json, rounds.csv."""
    folder.mkdir(parents=True)
    write_json(folder / RUN_RECORD, {"status": COMPLETED})
    write_json(folder / "summary.json", {"completed": True, "rounds": len(flops)})
    write_csv(folder / "rounds.csv", [{"round": r, columns: f} for r, f in enumerate(flops, 1)])
    return folder


def test_rounds_are_the_reference_total_over_the_source_flops_per_round_rounded_up(tmp_path):
    runs = expand(load_suite(write_suite(tmp_path, SUITE)))
    reference, source, matched = runs[:3]
    reference.folder = finished_folder(tmp_path / "feast", FLOPS["feast"][0])
    source.folder = finished_folder(tmp_path / "fedavg-min", FLOPS["fedavg-min"][0])
    settle_match(matched, runs, tmp_path / "out", rerun_changed=False)
    assert (matched.action, matched.folder) == ("train", tmp_path / "out/runs/fedavg-min-matched/seed0")
    assert (matched.run_config["num-server-rounds"], matched.run_config["eval-every"]) == MATCHED[0]
    assert matched.match_compute == {
        "reference": "feast",
        "reference_total_flops": pytest.approx(12e9),
        "source": "fedavg-min",
        "source_flops_per_round": pytest.approx(1.05e9),
        "rounds": 12,
        "eval_every": 6,
    }


def test_a_quotient_within_float_rounding_of_a_whole_number_is_not_rounded_up():
    assert math.ceil(0.1 * 3 / 0.1) == 4  # 3.0000000000000004
    assert matched_rounds(0.1 * 3, 0.1) == 3
    assert matched_rounds(3.3, 1.0) == 4 and matched_rounds(0.5, 1.0) == 1


def test_a_source_that_failed_or_recorded_no_flops_leaves_the_run_not_run_with_the_reason(tmp_path):
    runs = expand(load_suite(write_suite(tmp_path, SUITE)))
    reference, source, matched = runs[:3]
    reference.folder = finished_folder(tmp_path / "feast", FLOPS["feast"][0])
    source.folder = finished_folder(tmp_path / "fedavg-min", [1.0, 2.0], columns="client_seconds")
    settle_match(matched, runs, tmp_path / "out", rerun_changed=False, failed=[source])
    assert matched.action == "skip" and matched.reason == "no finished run of fedavg-min seed=0"
    settle_match(matched, runs, tmp_path / "out", rerun_changed=False)
    assert matched.action == "skip" and "fedavg-min/rounds.csv: no column client_train_flops" in matched.reason


# -- the runner ----------------------------------------------------------------------------------------------------
def test_a_matched_run_trains_after_its_sources_with_the_resolved_rounds_and_is_reused_next_time(tmp_path):
    launcher = Launcher()
    result, text = run(tmp_path, launcher)
    assert not result["failed"]
    assert [entry[:4] for entry in launcher.launched] == [
        ("feast", 0, 4, 2),
        ("fedavg-min", 0, 4, 2),
        ("fedavg-min-matched", 0, *MATCHED[0]),
        ("feast", 1, 4, 2),
        ("fedavg-min", 1, 4, 2),
        ("fedavg-min-matched", 1, *MATCHED[1]),
    ]
    assert "12 rounds, the client training FLOPs of feast" in text
    record = json.loads((tmp_path / "out/runs/fedavg-min-matched/seed1" / RUN_RECORD).read_text())
    assert record["run_config"]["num-server-rounds"] == 14 and record["match_compute"]["rounds"] == 14
    assert record["match_compute"]["reference_total_flops"] == pytest.approx(14e9)
    # the suite's tables have the matched row: 12 rounds of the source's 4.2e9 per 4 rounds = 12.6e9 of 12e9
    with open(tmp_path / "out/matched.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["compute_ratio"]) == pytest.approx((12.6 / 12 + 14 / 14) / 2)
    assert "| fedavg-min-matched | feast | 12,14 |" in (tmp_path / "out/table.md").read_text()

    again = Launcher()
    result, text = run(tmp_path, again)
    assert again.launched == [] and text.count(" reuse ") == 6 and not result["failed"]
    # settings resolved the same way are reused; a finished run of other rounds is refused before anything trains
    folder = tmp_path / "out/runs/fedavg-min-matched/seed0"
    record = json.loads((folder / RUN_RECORD).read_text())
    record["run_config"]["num-server-rounds"] = 13
    write_json(folder / RUN_RECORD, record, replace=True)
    with pytest.raises(SuiteMismatch, match="num-server-rounds: 13 -> 12"):
        plan(load_suite(write_suite(tmp_path, SUITE)), tmp_path / "out")


def test_a_failed_source_leaves_its_matched_run_not_run_and_the_suite_goes_on(tmp_path):
    launcher = Launcher(fail={("fedavg-min", 0)})
    result, text = run(tmp_path, launcher)
    assert [(label, seed) for label, seed, *_ in launcher.launched] == [
        ("feast", 0),
        ("fedavg-min", 0),
        ("feast", 1),
        ("fedavg-min", 1),
        ("fedavg-min-matched", 1),
    ]
    assert [(r.label, r.seed) for r in result["failed"]] == [("fedavg-min", 0), ("fedavg-min-matched", 0)]
    assert "NOT RUN: no finished run of fedavg-min seed=0" in text
    assert "fedavg-min-matched seed=0: no finished run of fedavg-min seed=0" in text  # in the closing summary
    again = Launcher()
    run(tmp_path, again)
    assert [entry[:4] for entry in again.launched] == [("fedavg-min", 0, 4, 2), ("fedavg-min-matched", 0, 12, 6)]


def test_a_source_retrained_to_other_flops_refuses_the_old_matched_run_unless_rerun_changed(tmp_path):
    run(tmp_path, Launcher())
    shutil.rmtree(tmp_path / "out/runs/fedavg-min/seed0")
    # twice the FLOPs per round: ceil(12e9 / 2.1e9) = 6 rounds, eval-every ceil(6 / 2) = 3
    launcher = Launcher(scale=2.0)
    result, text = run(tmp_path, launcher)
    assert [entry[:2] for entry in launcher.launched] == [("fedavg-min", 0)]
    assert [(r.label, r.seed) for r in result["failed"]] == [("fedavg-min-matched", 0)]
    assert "runs/fedavg-min-matched/seed0 holds a finished run with other settings" in text
    assert "num-server-rounds: 12 -> 6" in text and "--rerun-changed" in text
    launcher = Launcher(scale=2.0)
    result, _ = run(tmp_path, launcher, rerun_changed=True)
    assert [entry[:4] for entry in launcher.launched] == [("fedavg-min-matched", 0, 6, 3)]
    assert not result["failed"] and (tmp_path / "out/runs/fedavg-min-matched/seed0.v2/summary.json").exists()
    listed = json.loads((tmp_path / "out/suite.json").read_text())["runs"]
    assert "runs/fedavg-min-matched/seed0.v2" in [entry["folder"] for entry in listed]


def test_an_interrupted_matched_run_continues_from_its_checkpoint(tmp_path):
    text = SUITE.replace("seeds = [0, 1]", "seeds = [0]")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, Launcher(interrupt=("fedavg-min-matched", 0)), text)
    launcher = Launcher()
    result, _ = run(tmp_path, launcher, text)
    copy = tmp_path / "out/runs/fedavg-min-matched/seed0.interrupted-1"
    assert launcher.launched == [("fedavg-min-matched", 0, 12, 6, copy)]
    record = json.loads((tmp_path / "out/runs/fedavg-min-matched/seed0" / RUN_RECORD).read_text())
    assert record["resumed_from"] == copy.name and record["resumed_after_round"] == 2
    assert record["status"] == COMPLETED and record["match_compute"]["rounds"] == 12


# -- the report's matched-compute table ----------------------------------------------------------------------------
def report_run(folder: Path, label: str, seed: int, accuracy: float, flops: list[float], match: bool = False):
    """A finished run as the report reads it; a matched run's run.json names the label it matched."""
    method = "feast" if label == "feast" else "fedavg-min"
    run_config = {"method": method, "seed": seed, "num-server-rounds": len(flops), "eval-every": len(flops)}
    folder.mkdir(parents=True)
    write_summary(folder, method, len(flops), seed, accuracy, run_config)
    write_csv(folder / "metrics.csv", [{"round": len(flops), "population_weighted_accuracy": accuracy}])
    write_csv(folder / "rounds.csv", [{"round": r, "client_train_flops": f} for r, f in enumerate(flops, 1)])
    record = {"label": label, "cell": {}, "seed": seed, "commit": "a" * 40, "dirty": False, "run_config": run_config}
    write_json(folder / RUN_RECORD, {**record, **({"match_compute": {"reference": "feast"}} if match else {})})


def test_the_matched_table_by_hand_on_two_seeds(tmp_path):
    report_run(tmp_path / "feast0", "feast", 0, 0.38, [3e9] * 4)  # 12e9
    report_run(tmp_path / "feast1", "feast", 1, 0.41, [3.5e9] * 4)  # 14e9
    report_run(tmp_path / "m0", "fedavg-min-matched", 0, 0.40, [1e9] * 13, match=True)  # 13e9
    report_run(tmp_path / "m1", "fedavg-min-matched", 1, 0.44, [1e9] * 14, match=True)  # 14e9
    tables = report(find_runs([tmp_path]), reference="feast")
    # the seeds trained different rounds and are still one row
    assert [(r["method"], r["rounds"]) for r in tables["accuracy"]] == [("feast", 4), ("fedavg-min-matched", "13-14")]
    (row,) = tables["matched"]
    t = 12.706204736  # t quantile 0.975 at 1 degree of freedom
    assert (row["method"], row["reference"], row["rounds"], row["seeds"]) == (
        "fedavg-min-matched",
        "feast",
        "13,14",
        "0,1",
    )
    assert row["compute_ratio"] == pytest.approx((13 / 12 + 14 / 14) / 2)
    # accuracy 0.40, 0.44: mean 0.42, sd 0.02 * sqrt(2), half-width t * sd / sqrt(2) = 0.02 t
    assert row["accuracy"] == pytest.approx(0.42) and row["accuracy_ci95"] == pytest.approx(0.02 * t)
    # against feast's 0.38, 0.41: differences 0.02, 0.03: mean 0.025, half-width t * 0.005
    assert row["difference"] == pytest.approx(0.025) and row["difference_ci95"] == pytest.approx(0.005 * t)
    assert (row["n"], row["wins"], row["verdict"]) == (2, 2, "not distinguishable at 2 seeds")
    text = report_text(tables)
    assert "| fedavg-min-matched | feast | 13,14 | 1.042 | 42.0 ± 25.4 | +2.5 ± 6.4 | 2/2 |" in text
    write_tables(tmp_path / "report", tables)
    assert (tmp_path / "report/matched.csv").exists()


def test_no_matched_table_without_matched_runs(tmp_path):
    report_run(tmp_path / "feast0", "feast", 0, 0.38, [3e9] * 4)
    report_run(tmp_path / "min0", "fedavg-min", 0, 0.35, [1e9] * 4)
    tables = report(find_runs([tmp_path]), reference="feast")
    assert tables["matched"] == [] and "Matched compute" not in report_text(tables)
    write_tables(tmp_path / "report", tables)
    assert not (tmp_path / "report/matched.csv").exists()
