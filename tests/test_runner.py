"""experiments.runner: suite files, the reuse rule, refusals, resumption and the suite's tables.

Most tests launch runs through a stand-in that writes the files a finished run writes (fast, no Flower); the last
group runs the real smoke suite through `flwr run` once (module-scoped) and checks the done-means of the runner.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.runner import COMPLETED, RUN_RECORD, SuiteMismatch, load_suite, plan, run_suite
from fl_app.run.outputs import write_csv
from tests.harness.suites import run_collecting, write_suite, write_summary

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
[suite]
seeds = [0, 1, 2]
reference = "fedavg-min"
[base]
num-server-rounds = 2
eval-every = 1
[federation]
num-supernodes = 4
client-resources-num-cpus = 1
[methods]
feast = {}
fedavg-min = {}
feast-kd0 = { method = "feast", kd-ratio = 0.0 }
"""
# accuracy of the stand-in runs: label offset + seed effect, so paired differences are known exactly
OFFSET = {"feast": 0.05, "fedavg-min": 0.0, "feast-kd0": 0.04}
SEED_EFFECT = {0: 0.30, 1: 0.36, 2: 0.33}


class FakeLauncher:
    """Writes summary.json / metrics.csv / rounds.csv like a finished run; remembers what it launched."""

    def __init__(self, fail: set = frozenset(), interrupt_at: int | None = None):
        self.launched, self.fail, self.interrupt_at = [], fail, interrupt_at

    def __call__(self, run, timeout):
        self.launched.append((run.label, run.seed, dict(run.cell)))
        if self.interrupt_at == len(self.launched):
            raise KeyboardInterrupt  # the suite is stopped in the middle of this run
        if (run.label, run.seed) in self.fail:
            return "finished:failed"
        acc = OFFSET[run.label] + SEED_EFFECT[run.seed] + 0.01 * run.cell.get("gamma", 0)
        rounds = run.run_config["num-server-rounds"]
        write_csv(
            run.folder / "metrics.csv",
            [{"round": r, "population_weighted_accuracy": acc * r / rounds} for r in range(1, rounds + 1)],
        )
        write_csv(
            run.folder / "rounds.csv",
            [{"round": r, "client_seconds": 10.0 * (1 + (run.label == "feast"))} for r in range(1, rounds + 1)],
        )
        write_summary(
            run.folder,
            run.run_config["method"],
            rounds,
            run.seed,
            acc,
            {**run.run_config, "output-dir": str(run.folder)},
            tiers=[{"macs": 5e5, "accuracy": acc}],
            bytes_down=2e6,
            bytes_up=1e6,
        )
        return COMPLETED


def run(tmp_path, suite_text=SUITE, launcher=None, plots=False, **kwargs):
    launcher = launcher or FakeLauncher()
    result, lines = run_collecting(write_suite(tmp_path, suite_text), tmp_path / "out", launcher, plots=plots, **kwargs)
    return result, launcher, "\n".join(lines)


def test_suite_errors_name_the_section_and_key(tmp_path):
    bad = (
        SUITE.replace('reference = "fedavg-min"', 'reference = "fedprox"').replace(
            "feast = {}", "feast = {}\nfeast-fast = { lr = 0.1 }"
        )
        + "\n[extras]\nx = 1\n"
    )
    with pytest.raises(ValueError) as error:
        load_suite(write_suite(tmp_path, bad))
    text = str(error.value)
    assert "[extras]" in text and "reference='fedprox'" in text and "feast-fast" in text
    with pytest.raises(ValueError, match="kd-ratio"):  # run-config values are validated before anything runs
        plan(load_suite(write_suite(tmp_path, SUITE.replace("kd-ratio = 0.0", "kd-ratio = 2.0"))), tmp_path)


def test_first_run_trains_every_cell_and_records_provenance(tmp_path):
    result, launcher, text = run(tmp_path)
    assert len(launcher.launched) == 9 and not result["failed"]
    # seed by seed, methods in file order
    assert [(label, seed) for label, seed, _ in launcher.launched[:3]] == [
        ("feast", 0),
        ("fedavg-min", 0),
        ("feast-kd0", 0),
    ]
    assert text.count(" start ") == 9 and text.count(" done in ") == 9 and "ETA" in text
    record = json.loads((tmp_path / "out/runs/feast-kd0/seed2" / RUN_RECORD).read_text())
    assert record["status"] == COMPLETED and record["seed"] == 2
    assert record["run_config"]["kd-ratio"] == 0.0 and record["run_config"]["method"] == "feast"
    assert record["federation"] == {"num-supernodes": 4, "client-resources-num-cpus": 1}
    assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)


def test_second_run_trains_nothing(tmp_path):
    run(tmp_path)
    _, launcher, text = run(tmp_path)
    assert launcher.launched == []
    assert text.count(" reuse ") == 9 and " start " not in text


def test_changed_key_is_refused_naming_it_before_anything_trains(tmp_path):
    run(tmp_path)
    changed = SUITE.replace("kd-ratio = 0.0", "kd-ratio = 0.25")
    with pytest.raises(SuiteMismatch) as error:
        run(tmp_path, changed)
    text = str(error.value)
    assert "runs/feast-kd0/seed0" in text and "kd-ratio: 0.0 -> 0.25" in text
    assert "runs/feast/seed0" not in text  # unchanged runs are not blamed
    federation = SUITE.replace("num-supernodes = 4", "num-supernodes = 8")
    with pytest.raises(SuiteMismatch, match=r"federation.num-supernodes: 4 -> 8"):
        run(tmp_path, federation)


def test_rerun_changed_trains_exactly_the_changed_runs_into_new_folders(tmp_path):
    run(tmp_path)
    changed = SUITE.replace("kd-ratio = 0.0", "kd-ratio = 0.25")
    _, launcher, _ = run(tmp_path, changed, rerun_changed=True)
    assert sorted(launcher.launched) == [("feast-kd0", s, {}) for s in (0, 1, 2)]
    old = json.loads((tmp_path / "out/runs/feast-kd0/seed0" / RUN_RECORD).read_text())
    new = json.loads((tmp_path / "out/runs/feast-kd0/seed0.v2" / RUN_RECORD).read_text())
    assert old["run_config"]["kd-ratio"] == 0.0 and new["run_config"]["kd-ratio"] == 0.25  # the old run is kept
    _, again, _ = run(tmp_path, changed)  # the new folder is now an exact match: nothing to train, nothing refused
    assert again.launched == []


def test_new_grid_values_train_only_the_new_cells(tmp_path):
    grid = SUITE + "[grid]\ngamma = [0.0, 1.0]\n"
    _, first, _ = run(tmp_path, grid)
    assert len(first.launched) == 18
    _, second, _ = run(tmp_path, grid.replace("[0.0, 1.0]", "[0.0, 1.0, 1.5]"))
    assert sorted(second.launched) == sorted((label, seed, {"gamma": 1.5}) for label in OFFSET for seed in (0, 1, 2))


def test_key_added_to_the_registry_later_at_its_default_still_matches(tmp_path):
    run(tmp_path)
    path = tmp_path / "out/runs/feast/seed0" / RUN_RECORD
    record = json.loads(path.read_text())
    del record["run_config"]["topo-kappa"]  # as if the run predates the key
    path.write_text(json.dumps(record))
    _, launcher, _ = run(tmp_path)
    assert launcher.launched == []


def test_a_run_mirrored_to_a_tracker_is_reused_by_one_without(tmp_path):
    # the tracker only mirrors metrics: it changes nothing a run computes, so it is not a reason to retrain
    run(tmp_path, SUITE.replace("eval-every = 1", 'eval-every = 1\ntracker = "tensorboard"'))
    _, launcher, _ = run(tmp_path)
    assert launcher.launched == []


def test_interrupted_suite_resumes_and_keeps_the_partial_run(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, launcher=FakeLauncher(interrupt_at=4))
    partial = tmp_path / "out/runs/feast/seed1"
    assert json.loads((partial / RUN_RECORD).read_text())["status"] == "running"
    _, launcher, text = run(tmp_path)
    assert [(label, seed) for label, seed, _ in launcher.launched] == [
        ("feast", 1),
        ("fedavg-min", 1),
        ("feast-kd0", 1),
        ("feast", 2),
        ("fedavg-min", 2),
        ("feast-kd0", 2),
    ]
    assert (tmp_path / "out/runs/feast/seed1.interrupted-1" / RUN_RECORD).exists()
    assert "seed1.interrupted-1" in text and text.count(" reuse ") == 3


def test_failed_run_does_not_stop_the_suite_and_is_trained_again(tmp_path):
    result, launcher, text = run(tmp_path, launcher=FakeLauncher(fail={("feast", 1)}))
    assert len(launcher.launched) == 9 and [r.label for r in result["failed"]] == ["feast"]
    assert "FAILED finished:failed" in text
    _, again, _ = run(tmp_path)
    assert again.launched == [("feast", 1, {})]


def test_suite_tables_give_means_with_intervals_and_paired_differences(tmp_path):
    run(tmp_path, plots=True)
    table = (tmp_path / "out/table.md").read_text()
    # feast: 0.35, 0.41, 0.38 -> mean 38.0, sd 3.0 points, half-width 4.3027 * 3 / sqrt(3) = 7.45
    assert "| feast | cifar10 | 2 | 0,1,2 | 0.50M | 38.0 ± 7.5 |" in table
    # paired against fedavg-min: every seed +5 points, no spread
    assert "| feast | fedavg-min | +5.0 ± 0.0 | 3/3 | better |" in table
    assert "| feast-kd0 | fedavg-min | +4.0 ± 0.0 | 3/3 | better |" in table
    import csv

    with open(tmp_path / "out/table.csv") as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    assert float(rows["feast"]["accuracy_ci95"]) == pytest.approx(4.302653 * 0.03 / math.sqrt(3), rel=1e-5)
    # equal compute: fedavg-min spends 20 client seconds, feast 40; at 20 feast has only its round-1 value
    with open(tmp_path / "out/compute.csv") as handle:
        compute = {r["method"]: r for r in csv.DictReader(handle)}
    assert float(compute["feast"]["compute_budget"]) == 20.0
    assert float(compute["feast"]["accuracy_at_budget"]) == pytest.approx(0.38 / 2)
    assert float(compute["fedavg-min"]["accuracy_at_budget"]) == pytest.approx(0.33)
    assert (tmp_path / "out/accuracy_per_round.png").read_bytes()[:4] == b"\x89PNG"


# -- the real smoke suite through `flwr run` -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    lines = []
    result = run_suite(ROOT / "experiments/suites/smoke.toml", out, printer=lambda text, **_: lines.append(text))
    return out, result, "\n".join(lines)


@pytest.mark.slow  # real `flwr run`s
def test_smoke_suite_finishes_with_progress_and_a_table_with_intervals(smoke):
    out, result, text = smoke
    assert not result["failed"], text
    assert text.count(" start ") == 4 and text.count(" done in ") == 4
    for label in ("feast", "fedavg-min"):
        for seed in (0, 1):
            folder = out / "runs" / label / f"seed{seed}"
            record = json.loads((folder / RUN_RECORD).read_text())
            assert record["status"] == COMPLETED
            assert "Successfully started run" in (folder / "run.log").read_text()
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["seed"] == seed and summary["rounds"] == 2
    table = (out / "table.md").read_text()
    assert table.count(" ± ") >= 3  # two method rows and the paired difference
    assert "| feast | fedavg-min |" in table


@pytest.mark.slow  # real `flwr run`s
def test_smoke_suite_again_trains_nothing_and_a_changed_key_is_refused(smoke, tmp_path):
    out, _, _ = smoke
    lines = []
    result = run_suite(ROOT / "experiments/suites/smoke.toml", out, printer=lambda text, **_: lines.append(text))
    text = "\n".join(lines)
    assert text.count(" reuse ") == 4 and " start " not in text and not result["failed"]
    changed = tmp_path / "smoke.toml"
    changed.write_text(
        (ROOT / "experiments/suites/smoke.toml").read_text().replace("max-local-steps = 3", "max-local-steps = 4")
    )
    with pytest.raises(SuiteMismatch, match=r"max-local-steps: 3 -> 4"):
        run_suite(changed, out, printer=lambda *a, **k: None)


@pytest.mark.slow  # real `flwr run`s
def test_a_smoke_run_retrained_into_a_new_folder_equals_the_first_bit_for_bit(smoke, tmp_path):
    """verify on the real app: one smoke run through `flwr run` again gives the same numbers (CPU, same seed), here
    on a Ray head the runner starts for the suite (``shared_ray``) where the first started a Ray of its own."""
    from experiments.runner import verify

    out, _, _ = smoke
    lines = []
    suite = load_suite(ROOT / "experiments/suites/smoke.toml", seeds=[1], methods=["fedavg-min"])
    equal = verify(suite, out, tmp_path / "again", printer=lambda text, **_: lines.append(text), shared_ray=True)
    text = "\n".join(lines)
    assert equal, text
    assert json.loads((tmp_path / "again/runs/fedavg-min/seed1" / RUN_RECORD).read_text())["machine"]["ray"] == (
        "one Ray head per lane"
    )
    assert "EQUAL   fedavg-min seed=1" in text and "bit-identical" in text


@pytest.mark.parametrize("suite_file", sorted((ROOT / "experiments/suites").glob("*.toml")), ids=lambda p: p.name)
def test_every_committed_suite_is_valid(suite_file, tmp_path):
    runs = plan(load_suite(suite_file), tmp_path)
    suite = load_suite(suite_file)
    assert len(runs) == len(suite.seeds) * len(suite.methods) * max(1, math.prod(len(v) for v in suite.grid.values()))
    assert suite.reference in suite.methods
    for run in runs:  # the app gets an absolute data-path read from the repository root, not the caller's folder
        data_path = run.launch_config()["data-path"]
        if run.run_config["data-source"] == "local":
            assert Path(data_path).is_absolute() and (Path(data_path) / "train.parquet").is_file()
            assert not Path(run.run_config["data-path"]).is_absolute()  # what records keep
            assert run.data["path"] == "../shared/data/cifar10" and len(run.data["sha256"]) == 2


def test_wrappers_run_their_suites_through_the_runner(monkeypatch):
    from experiments.runner import cli
    from experiments.studies import compare, fedtopo_compare, gamma

    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
    compare.main(["--ablations", "--out", "x", "--seeds", "0"])
    gamma.main(["--out", "y"])
    fedtopo_compare.main(["--out", "z", "--run-config", "num-server-rounds=4"])
    assert [(c[0], Path(c[1]).name, c[2:]) for c in calls] == [
        ("run", "ablations.toml", ["--out", "x", "--seeds", "0"]),
        ("run", "gamma.toml", ["--out", "y"]),
        ("run", "fedtopo.toml", ["--out", "z", "--run-config", "num-server-rounds=4"]),
    ]


def test_command_line_changes_seeds_methods_and_values(tmp_path, capsys):
    from experiments.runner import main

    suite = str(ROOT / "experiments/suites/ablations.toml")
    assert (
        main(
            [
                "plan",
                suite,
                "--out",
                str(tmp_path),
                "--seeds",
                "3",
                "--methods",
                "feast,feast-kd0",
                "--run-config",
                "num-server-rounds=40",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in printed] == [["train", "feast", "seed=3"], ["train", "feast-kd0", "seed=3"]]
    assert main(["plan", suite, "--out", str(tmp_path), "--run-config", "num-server-round=40"]) == 2
    assert "did you mean 'num-server-rounds'" in capsys.readouterr().err


# -- a suite folder belongs to one suite; the committed results are not overwritten by accident -------------------
def snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "change",
    [
        {"methods": ["feast"]},  # a subset of the methods
        {"seeds": [0]},  # a subset of the seeds
        {"text": SUITE.replace("feast-kd0 = ", "feast-lr = { method = 'feast', lr = 0.1 }\nx = ")},  # another suite
    ],
    ids=["methods-subset", "seeds-subset", "another-suite"],
)
def test_a_subset_or_another_suite_into_a_suite_folder_is_refused_and_nothing_is_written(tmp_path, change):
    run(tmp_path)
    before = snapshot(tmp_path / "out")
    suite = load_suite(
        write_suite(tmp_path, change.get("text", SUITE), name="other.toml"), change.get("seeds"), change.get("methods")
    )
    launcher = FakeLauncher()
    with pytest.raises(SuiteMismatch) as error:
        run_suite(suite, tmp_path / "out", launch=launcher, printer=lambda *a, **k: None, plots=False)
    assert "suite.json" in str(error.value) and "feast-kd0 seed=" in str(error.value)  # the runs it would drop
    assert launcher.launched == [] and snapshot(tmp_path / "out") == before


def test_extending_a_suite_with_seeds_trains_only_the_new_runs(tmp_path):
    run(tmp_path)
    _, launcher, _ = run(tmp_path, SUITE.replace("seeds = [0, 1, 2]", "seeds = [0, 1, 2, 3]"))
    assert sorted(launcher.launched) == sorted((label, 3, {}) for label in OFFSET)


def test_report_writes_the_tables_of_the_finished_runs_trains_nothing_and_run_continues_the_rest(tmp_path, capsys):
    from experiments.runner import main, report_suite

    with pytest.raises(KeyboardInterrupt):  # a first sitting: seed 0 of every method, then stopped in feast seed 1
        run(tmp_path, launcher=FakeLauncher(interrupt_at=4))
    out = tmp_path / "out"
    assert not (out / "table.md").exists()
    suite = tmp_path / "suite.toml"
    assert main(["report", str(suite), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "table.md").read_text()
    # seed 0 only: feast 0.35, fedavg-min 0.30; one seed gives a difference but no interval
    assert "| feast | cifar10 | 2 | 0 | 0.50M | 35.0 |" in table
    assert "| feast | fedavg-min | +5.0 | 1/1 | not distinguishable at 1 seed |" in table
    assert "6 of the 9 runs have not finished" in printed
    assert "feast seed=1" in printed and "feast-kd0 seed=2" in printed
    recorded = json.loads((out / "suite.json").read_text())
    assert len(recorded["runs"]) == 9  # the whole request: a later `run` of it continues the suite
    assert json.loads((out / "runs/feast/seed1" / RUN_RECORD).read_text())["status"] == "running"  # nothing moved

    _, launcher, _ = run(tmp_path)
    assert sorted(launcher.launched) == sorted((label, seed, {}) for label in OFFSET for seed in (1, 2))
    assert "| feast | fedavg-min | +5.0 ± 0.0 | 3/3 | better |" in (out / "table.md").read_text()

    # a subset is refused as `run` refuses it; an empty folder has nothing to report
    assert main(["report", str(suite), "--out", str(out), "--seeds", "0"]) == 2
    assert "suite.json" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="none of the suite's 9 runs has finished"):
        report_suite(suite, tmp_path / "empty", printer=lambda *a, **k: None, plots=False)
    with pytest.raises(ValueError, match="no such suite folder"):
        report_suite(suite, tmp_path / "missing", printer=lambda *a, **k: None, plots=False)
    assert not (tmp_path / "missing").exists()


def test_committed_results_folders_are_refused_unless_asked_for(tmp_path, monkeypatch):
    from experiments.runner import suite_folder

    monkeypatch.setattr(suite_folder, "RESULTS", tmp_path / "results")
    suite = write_suite(tmp_path, SUITE)
    with pytest.raises(SuiteMismatch, match="--into-committed"):
        run_suite(suite, tmp_path / "results/x", launch=FakeLauncher(), printer=lambda *a, **k: None, plots=False)
    assert not (tmp_path / "results/x").exists()
    result = run_suite(
        suite,
        tmp_path / "results/x",
        launch=FakeLauncher(),
        printer=lambda *a, **k: None,
        plots=False,
        into_committed=True,
    )
    assert not result["failed"] and (tmp_path / "results/x/suite.json").exists()


def test_the_real_committed_folders_are_refused_before_anything_is_written(capsys):
    from experiments.runner import main

    folder = ROOT / "experiments/results/compare-seeds"
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    argv = ["run", str(ROOT / "experiments/suites/compare.toml"), "--out", str(folder), "--methods", "feast"]
    assert main([*argv, "--seeds", "0"]) == 2
    assert "--into-committed" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before


# -- records without machine paths; reuse by data content ----------------------------------------------------------
def string_values(value) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in string_values(item)]
    if isinstance(value, list):
        return [s for item in value for s in string_values(item)]
    return [value] if isinstance(value, str) else []


def test_records_hold_no_absolute_path_and_name_the_data_by_content(tmp_path):
    run(tmp_path)
    folder = tmp_path / "out/runs/feast/seed0"
    for name in (RUN_RECORD, "summary.json"):
        record = json.loads((folder / name).read_text())
        assert record["run_config"]["output-dir"] == "."  # the stand-in wrote the absolute folder into its summary
        assert not [s for s in string_values(record) if s.startswith("/")], name
    suite_record = json.loads((tmp_path / "out/suite.json").read_text())
    assert not [s for s in string_values(suite_record) if s.startswith("/")]
    data = json.loads((folder / RUN_RECORD).read_text())["data"]
    assert set(data["sha256"]) == {"train.parquet", "test.parquet"}  # the bundled sample: data-source default


def local_data_suite(tmp_path, data: Path) -> Path:
    text = SUITE.replace("[base]\n", f"[base]\ndata-source = 'local'\ndata-path = '{data}'\n")
    return write_suite(tmp_path, text)


def copy_sample(folder: Path) -> Path:
    from fl_app.io.resources import bundled_file

    folder.mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (folder / name).write_bytes(bundled_file(f"data/cifar10-sample/{name}").read_bytes())
    return folder


def test_runs_are_reused_by_data_content_not_by_path(tmp_path):
    first, second = copy_sample(tmp_path / "a"), copy_sample(tmp_path / "b")
    printer = lambda *a, **k: None  # noqa: E731
    run_suite(local_data_suite(tmp_path, first), tmp_path / "out", launch=FakeLauncher(), printer=printer, plots=False)
    launcher = FakeLauncher()  # the same files at another path: nothing to train
    run_suite(local_data_suite(tmp_path, second), tmp_path / "out", launch=launcher, printer=printer, plots=False)
    assert launcher.launched == []
    (second / "test.parquet").write_bytes((second / "test.parquet").read_bytes()[:-1] + b"x")
    with pytest.raises(SuiteMismatch, match="data sha256 of test.parquet"):
        plan(load_suite(local_data_suite(tmp_path, second)), tmp_path / "out")


def test_committed_runs_are_reused_from_a_checkout_at_another_path(tmp_path, monkeypatch):
    """The committed ablation suite, planned as from a clone at another path with its own ../shared beside it."""
    from experiments.runner import records

    data = ROOT.parent / "shared/data/cifar10"
    if not (data / "train.parquet").is_file():
        pytest.skip("no ../shared/data/cifar10 beside the checkout")
    clone = tmp_path / "elsewhere/main"
    (clone / "experiments").mkdir(parents=True)
    (tmp_path / "elsewhere/shared/data").mkdir(parents=True)
    (tmp_path / "elsewhere/shared/data/cifar10").symlink_to(data)
    monkeypatch.setattr(records, "ROOT", clone)
    suite = load_suite(ROOT / "experiments/suites/ablations.toml")
    runs = plan(suite, ROOT / "experiments/results/ablations-seeds")
    assert [r.action for r in runs] == ["reuse"] * 10
    assert str(runs[0].launch_config()["data-path"]).startswith(str(clone.parent / "shared"))


# -- the runner writes inside its folder only ----------------------------------------------------------------------
@pytest.mark.parametrize("label", ["../../victim", "a/b", ".hidden", "x\ny"])
def test_a_label_that_is_no_safe_folder_name_is_refused_naming_it_and_the_allowed_characters(tmp_path, label):
    text = SUITE.replace("feast-kd0 = ", f"{json.dumps(label)} = ")
    with pytest.raises(ValueError, match=r"a label names a run folder; allowed: letters, digits") as error:
        run(tmp_path, text)
    assert repr(label) in str(error.value)
    assert not (tmp_path / "victim").exists() and not (tmp_path / "out").exists()


def test_a_link_inside_out_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    (victim / "seed0").mkdir(parents=True)
    (victim / "seed0/keep.txt").write_text("mine")
    (tmp_path / "out/runs").mkdir(parents=True)
    (tmp_path / "out/runs/feast").symlink_to(victim, target_is_directory=True)
    with pytest.raises(SuiteMismatch, match=r"runs/feast: a symbolic link inside --out"):
        run(tmp_path)
    assert sorted(p.name for p in victim.rglob("*")) == ["keep.txt", "seed0"]


def test_a_second_runner_on_the_same_out_is_refused_and_moves_nothing(tmp_path):
    import fcntl
    import os

    run(tmp_path, SUITE.replace("seeds = [0, 1, 2]", "seeds = [0]"))
    (tmp_path / "out/runs/feast/seed0/summary.json").unlink()  # unfinished: a runner would move it aside
    before = snapshot(tmp_path / "out")
    holder = os.open(tmp_path / "out/.runner.lock", os.O_RDWR | os.O_CREAT)  # the first runner, still running
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(SuiteMismatch, match="another runner is writing this suite folder"):
            run(tmp_path, SUITE.replace("seeds = [0, 1, 2]", "seeds = [0]"))
    finally:
        os.close(holder)
    assert snapshot(tmp_path / "out") == before and not list((tmp_path / "out/runs/feast").glob("*interrupted*"))
    _, launcher, _ = run(tmp_path, SUITE.replace("seeds = [0, 1, 2]", "seeds = [0]"))  # once it has ended
    assert launcher.launched == [("feast", 0, {})]
