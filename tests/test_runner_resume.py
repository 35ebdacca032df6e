"""experiments.runner on long suites: an interrupted run continues from its checkpoint, a run left training by a
runner killed hard is stopped before the retry, and the console follows a run's rounds while it trains.

The fast tests launch through stand-ins (the launcher seam); the slow one stops a real `flwr run` after its round-2
checkpoint, parks it, continues it in a copy at another path (its data too) and checks that it ends bit for bit like
one that never stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from experiments.runner import COMPLETED, RUN_RECORD, compare_run, park_suite, plan, run_suite
from experiments.runner.flower_env import process_identity
from fl_app.io.resources import bundled_file
from fl_app.run.checkpoint import DATA_RECORD, MODELS_DIR, load_verified, save_verified
from fl_app.run.outputs import write_csv, write_json
from tests.harness.stopping import stop_after_checkpoint
from tests.harness.suites import run_collecting, write_suite, write_summary

ROOT = Path(__file__).resolve().parents[1]
SUITE = """
[suite]
seeds = [0]
[base]
num-server-rounds = 4
eval-every = 1
checkpoint-every = 1
[federation]
num-supernodes = 4
client-resources-num-cpus = 1
[methods]
feast = {}
fedavg-min = {}
"""


def finish(run, accuracy: float = 0.4) -> str:
    """Write what a finished run writes (as the stand-in launchers of tests/test_runner.py do)."""
    rounds = run.run_config["num-server-rounds"]
    write_round(run, rounds, accuracy)
    write_summary(
        run.folder,
        run.run_config["method"],
        rounds,
        run.seed,
        accuracy,
        {**run.launch_config()},
        tiers=[{"macs": 5e5, "accuracy": accuracy}],
    )
    return COMPLETED


def write_round(run, done: int, accuracy: float) -> None:
    """The round files after round ``done``, in the app's order (metrics.csv, then rounds.csv); round r scores
    ``accuracy * r / 4``."""
    write_csv(
        run.folder / "metrics.csv",
        [{"round": r, "population_weighted_accuracy": accuracy * r / 4} for r in range(1, done + 1)],
    )
    write_csv(run.folder / "rounds.csv", [{"round": r, "client_seconds": 1.0} for r in range(1, done + 1)])


def run(tmp_path, launcher, text: str = SUITE, **kwargs):
    return run_collecting(write_suite(tmp_path, text), tmp_path / "out", launcher, **kwargs)


# -- continuing from the checkpoint -------------------------------------------------------------------------------
def test_an_interrupted_run_continues_from_its_latest_checkpoint_into_a_fresh_folder(tmp_path):
    def interrupted(run, timeout):
        if run.label == "feast":  # killed after its round-2 checkpoint
            write_round(run, 2, 0.3)
            save_verified(run.folder / "checkpoint.pt", {"round": 2, "run_config": {}}, {"sha256": "model"})
            raise KeyboardInterrupt
        return finish(run)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, interrupted)
    launched = []

    def continued(run, timeout):
        launched.append((run.label, run.launch_config()["resume-from"] or None, run.resumed_after_round))
        assert not (run.folder / "checkpoint.pt").exists()  # a fresh folder: the app refuses one with results
        return finish(run)

    result, lines = run(tmp_path, continued)
    home = tmp_path / "out/runs/feast/seed0"
    copy = home.with_name("seed0.interrupted-1")
    assert launched == [("feast", str(copy), 2), ("fedavg-min", None, 0)]
    assert any("continuing seed0.interrupted-1 after round 2" in line for line in lines)
    record = json.loads((home / RUN_RECORD).read_text())
    assert record["status"] == COMPLETED and record["resumed_from"] == copy.name
    assert record["resumed_after_round"] == 2 and "runner" not in record and "flower" not in record
    assert record["run_config"]["resume-from"] == ""  # the settings of the run, as an uninterrupted run's
    # summary.json names the copy relative to the folder, not by a path of this machine
    assert json.loads((home / "summary.json").read_text())["run_config"]["resume-from"] == "../seed0.interrupted-1"
    assert (copy / "checkpoint.pt").exists()  # the copy is kept
    # the reuse rule and the tables take the continued folder as the finished run
    assert not result["failed"] and (tmp_path / "out/table.md").exists()
    from experiments.runner import load_suite

    assert [r.action for r in plan(load_suite(write_suite(tmp_path, SUITE)), tmp_path / "out")] == ["reuse", "reuse"]


def test_a_run_continued_twice_records_which_machine_trained_which_rounds(tmp_path):
    """Stopped after round 2 on one machine and after round 3 on another, finished on a third: the finished record
    lists both earlier segments (rounds kept, machine) oldest first, and verify's machine check names each."""
    from experiments.runner.verification import segment_differences

    def stopping_after(done):
        def launch(run, timeout):
            if run.label != "feast":
                return finish(run)
            write_round(run, done, 0.3)
            save_verified(run.folder / "checkpoint.pt", {"round": done, "run_config": {}}, {"sha256": "model"})
            raise KeyboardInterrupt

        return launch

    def as_other_machine(copy, model):  # the copy's record as that machine wrote it
        record = json.loads((copy / RUN_RECORD).read_text())
        record["machine"]["processor"]["model"] = model
        (copy / RUN_RECORD).write_text(json.dumps(record))

    home = tmp_path / "out/runs/feast/seed0"
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stopping_after(2))
    as_other_machine(home, "first machine")  # the next run moves it aside as seed0.interrupted-1
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stopping_after(3))
    as_other_machine(home, "second machine")
    run(tmp_path, lambda run, timeout: finish(run))
    first, second = home.with_name("seed0.interrupted-1"), home.with_name("seed0.interrupted-2")

    record = json.loads((home / RUN_RECORD).read_text())
    assert record["status"] == COMPLETED and record["resumed_from"] == second.name
    segments = record["earlier_segments"]
    assert [(s["folder"], s["rounds"]) for s in segments] == [(first.name, [1, 2]), (second.name, [3, 3])]
    assert [s["machine"]["processor"]["model"] for s in segments] == ["first machine", "second machine"]
    assert all(s["commit"] == record["commit"] and "load_average_at_end" not in s["machine"] for s in segments)
    changed = segment_differences(record, record["machine"])
    here = record["machine"]["processor"]["model"]
    assert changed == [
        f"rounds 1-2: processor model: 'first machine' -> {here!r}",
        f"rounds 3-3: processor model: 'second machine' -> {here!r}",
    ]
    # a run trained in one piece is compared on its own machine, as before
    assert segment_differences({"machine": record["machine"]}, record["machine"]) == []


def test_a_parked_run_continues_from_its_committed_copy_on_another_machine(tmp_path, capsys):
    from experiments.runner import main
    from experiments.runner.execution import note_in_flight

    def stopped(run, timeout):  # feast failed after its round-2 checkpoint, fedavg-min interrupted before its first
        note_in_flight(run.folder, {"run_id": "1", "flwr_home": str(tmp_path / "flwr_home"), "processes": []})
        write_round(run, 2, 0.3)
        if run.label == "feast":  # the checkpoint and a client's model file hold the run config the app was given
            blob = {"round": 2, "run_config": run.launch_config(), DATA_RECORD: {"sha256": {"train.parquet": "x"}}}
            save_verified(run.folder / "checkpoint.pt", blob, {"sha256": "model"})
            (run.folder / MODELS_DIR).mkdir()
            save_verified(run.folder / MODELS_DIR / "partition-0-round-2.pt", blob, {"sha256": "model"})
            return "finished:failed"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stopped)
    out, suite = tmp_path / "out", str(tmp_path / "suite.toml")
    assert str(tmp_path) in (out / "runs/feast/seed0/checkpoint.pt").read_bytes().decode("latin-1")

    assert main(["park", suite, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    copy = out / "runs/feast/seed0.interrupted-1"
    assert "feast seed=0: parked as runs/feast/seed0.interrupted-1 (checkpoint of round 2)" in printed
    assert "fedavg-min seed=0: not parked (no checkpoint.pt)" in printed
    model_file = copy / MODELS_DIR / "partition-0-round-2.pt"
    assert f"git add -f {copy / 'checkpoint.pt'} {model_file}" in printed
    assert not (out / "runs/feast/seed0").exists() and (out / "runs/fedavg-min/seed0").is_dir()
    record = json.loads((copy / RUN_RECORD).read_text())
    assert record["status"] == "parked after round 2" and "flower" not in record and "runner" not in record
    for path in (copy / RUN_RECORD, copy / "checkpoint.pt", model_file):  # verified anew, no path of this machine
        assert str(tmp_path) not in path.read_bytes().decode("latin-1")
    for path in (copy / "checkpoint.pt", model_file):
        assert load_verified(path)["run_config"]["output-dir"] == "."

    # another machine: a clone at another path holds the committed folder (the parked copy with its checkpoint)
    elsewhere = tmp_path / "clone"
    shutil.copytree(out, elsewhere / "out")
    launched = []

    def continued(run, timeout):
        launched.append((run.label, run.resume_from, run.resumed_after_round))
        return finish(run)

    run(elsewhere, continued)
    assert launched == [("feast", elsewhere / "out/runs/feast/seed0.interrupted-1", 2), ("fedavg-min", None, 0)]


def test_park_leaves_a_checkpoint_that_records_its_data_by_path_only_unlisted(tmp_path, capsys):
    """A checkpoint written before checkpoints recorded their data by content continues only at its own data-path:
    parked (moved aside, as the next run would), said so, and not offered for committing."""
    from experiments.runner import main

    def stopped(run, timeout):
        save_verified(run.folder / "checkpoint.pt", {"round": 2, "run_config": run.launch_config()}, {"sha256": "m"})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stopped, SUITE.replace("fedavg-min = {}", ""))
    assert main(["park", str(tmp_path / "suite.toml"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        "parked as runs/feast/seed0.interrupted-1 (checkpoint of round 2), to be continued on this machine only: "
        "checkpoint.pt records its data by path only" in printed
    )
    assert "git add" not in printed
    saved = load_verified(tmp_path / "out/runs/feast/seed0.interrupted-1/checkpoint.pt")
    assert saved["run_config"]["output-dir"] == str(tmp_path / "out/runs/feast/seed0")  # left as it was


def test_a_checkpoint_that_names_another_data_path_and_records_no_data_is_not_continued(tmp_path):
    """Such a checkpoint (written before checkpoints recorded their data by content, e.g. copied from another
    machine) would be refused by the app; the runner says why and trains the run from round 1 instead."""
    elsewhere = str(tmp_path / "another-machine" / "cifar10")

    def interrupted(run, timeout):
        config = {**run.launch_config(), "data-path": elsewhere}
        save_verified(run.folder / "checkpoint.pt", {"round": 2, "run_config": config}, {"sha256": "model"})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, interrupted)
    launched = []
    _, lines = run(tmp_path, lambda r, t: launched.append(r.resume_from) or finish(r))
    assert launched == [None, None]
    assert any(
        f"not continued from seed0.interrupted-1: its checkpoint records its data by path only, {elsewhere!r}" in line
        for line in lines
    ), lines


def test_a_checkpoint_of_other_settings_or_a_damaged_one_is_not_continued(tmp_path):
    def interrupted(run, timeout):
        save_verified(run.folder / "checkpoint.pt", {"round": 2, "run_config": {}}, {"sha256": "model"})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, interrupted, SUITE.replace("eval-every = 1", "eval-every = 2"))
    launched = []

    def damaging(run, timeout):
        launched.append(run.resume_from)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, damaging)  # eval-every = 1 now: the round-2 checkpoint is another run's
    assert launched == [None]
    copy = tmp_path / "out/runs/feast/seed0.interrupted-1"
    record = json.loads((copy / RUN_RECORD).read_text())
    write_json(copy / RUN_RECORD, {**record, "run_config": {**record["run_config"], "eval-every": 1}}, replace=True)
    altered = torch.load(copy / "checkpoint.pt", weights_only=True)
    torch.save({**altered, "round": 3}, copy / "checkpoint.pt")  # same settings now, but altered after it was saved
    _, lines = run(tmp_path, lambda r, t: launched.append(r.resume_from) or finish(r))
    assert launched == [None, None, None]
    assert any("not continued from seed0.interrupted-1" in line for line in lines)


# -- a run left training by a runner killed hard ------------------------------------------------------------------
WRITER = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('x')\n    time.sleep(0.05)\n"


def test_a_run_left_training_by_a_dead_runner_is_stopped_before_it_is_retried(tmp_path):
    """The record of a run a SIGKILLed runner left: status running, its runner gone, its Flower run's processes
    (here a stand-in that keeps writing into the run folder) still alive."""
    folder = tmp_path / "out/runs/feast/seed0"
    folder.mkdir(parents=True)
    left = subprocess.Popen([sys.executable, "-c", WRITER, str(folder / "still-writing")])
    try:
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        write_json(
            folder / RUN_RECORD,
            {
                "label": "feast",
                "seed": 0,
                "status": "running",
                "runner": {"pid": gone.pid, "created": 0.0},
                "flower": {"run_id": "123", "processes": [process_identity(left.pid)]},
            },
        )
        seen = []

        def launcher(run, timeout):
            seen.append((run.label, left.poll() is not None))
            return finish(run)

        result, lines = run(tmp_path, launcher)
        assert seen == [("feast", True), ("fedavg-min", True)]  # stopped before anything trained
        assert not result["failed"]
        assert any("stopped Flower run 123" in line for line in lines)
        stopped = json.loads((folder.with_name("seed0.interrupted-1") / RUN_RECORD).read_text())
        assert stopped["status"] == "stopped: its runner died" and "flower" not in stopped
    finally:
        left.kill()
        left.wait()


def test_a_run_whose_runner_is_alive_is_refused_and_left_alone(tmp_path):
    from experiments.runner import SuiteMismatch

    folder = tmp_path / "out/runs/feast/seed0"
    folder.mkdir(parents=True)
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        record = {"label": "feast", "seed": 0, "status": "running", "runner": process_identity(runner.pid)}
        write_json(folder / RUN_RECORD, record)
        with pytest.raises(SuiteMismatch, match=f"runner process {runner.pid} is training this run now"):
            run(tmp_path, finish)
        assert runner.poll() is None and json.loads((folder / RUN_RECORD).read_text()) == record
    finally:
        runner.kill()
        runner.wait()


# -- the console while a run trains -------------------------------------------------------------------------------
def test_the_console_shows_each_round_with_the_last_accuracy_and_etas(tmp_path):
    lines, shown = [], threading.Event()

    def printer(line, **_):
        lines.append(line)
        if " round " in line:
            shown.set()

    def launcher(run, timeout):
        for done in range(1, 5):
            shown.clear()
            write_round(run, done, 0.5)
            assert shown.wait(60), f"no progress line for round {done}"  # a hang guard, not a timing check
        return finish(run, 0.5)

    run_suite(
        write_suite(tmp_path, SUITE),
        tmp_path / "out",
        launch=launcher,
        printer=printer,
        plots=False,
        progress_every=0.01,
    )
    progress = [line for line in lines if " round " in line]
    assert [line.split(" round ")[1].split(",")[0] for line in progress] == ["1/4", "2/4", "3/4", "4/4"] * 2
    assert "accuracy 25.0% (round 2)" in progress[1]  # metrics.csv's last population-weighted accuracy
    assert all("ETA run " in line and ", suite " in line for line in progress)
    assert "ETA run 0s" in progress[3]


# -- the real app: stopped after round 2, continued, equal to a run that never stopped ----------------------------
REAL = """
[suite]
seeds = [0]
run-timeout = 900
[base]
data-source = "local"
data-path = "{data}"
num-server-rounds = 6
clients-per-round = 2
max-local-steps = 3
batch-size = 16
eval-every = 1
val-size = 200
test-size = 500
calib-size = 200
tiers = "0.5e6,2e6,13.6e6"
checkpoint-every = 1
[federation]
num-supernodes = 4
client-resources-num-cpus = 1
[methods]
feast = {}
"""


def sample_data_folder(path: Path) -> str:
    """A local data folder holding the bundled CIFAR-10 sample's files (the same content at every path)."""
    path.mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        shutil.copyfile(bundled_file(f"data/cifar10-sample/{name}"), path / name)
    return str(path)


def stop_after_round(folder: Path, at_round: int, done: threading.Event, stopped_at: list) -> None:
    """Once the runner's run.json in ``folder`` names its Flower run (run id, FLWR_HOME, ports), stop that run
    right after its round-``at_round`` checkpoint (tests/harness/stopping.py); appends the round it stopped at."""
    from experiments.runner.flower_env import isolated_env

    while not done.is_set():
        try:
            flower = json.loads((folder / RUN_RECORD).read_text())["flower"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
            continue
        env = isolated_env(
            Path(flower["flwr_home"]),
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=flower["http_port"],
            FLWR_LOCAL_CONTROL_API_PORT=flower["control_port"],
        )
        stopped_at.append(stop_after_checkpoint(folder, at_round, env, flower["run_id"], cancelled=done.is_set))
        return


@pytest.mark.slow  # real `flwr run`s
def test_a_real_run_stopped_after_round_2_parked_and_continued_elsewhere_equals_one_that_never_stopped(tmp_path):
    """The whole chain across machines: a real run stopped after its round-2 checkpoint, parked (the checkpoint's run
    config made portable), its folder copied into another clone whose data folder, at another path, holds the same
    files, and continued there: it ends bit for bit as a run that never stopped."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    data = sample_data_folder(here / "cifar10")
    suite = write_suite(here, REAL.replace("{data}", data))
    straight = tmp_path / "straight"
    result = run_suite(suite, straight, printer=lambda *a, **k: None, plots=False)
    assert not result["failed"]

    out = here / "stopped"
    folder = out / "runs/feast/seed0"
    done, stopped_at = threading.Event(), []
    stopper = threading.Thread(target=stop_after_round, args=(folder, 2, done, stopped_at), daemon=True)
    stopper.start()
    try:
        first = run_suite(suite, out, printer=lambda *a, **k: None, plots=False)
    finally:
        done.set()
        stopper.join()
    assert stopped_at == [2] and first["failed"] and not (folder / "summary.json").exists()
    parked = park_suite(suite, out, printer=lambda *a, **k: None)
    assert [p.name for p in parked] == ["checkpoint.pt"]
    checkpoint = load_verified(parked[0])
    assert str(here) not in checkpoint["run_config"]["output-dir"]
    # the round in flight when the stop came may still end and save while Flower's exit handlers run
    # (tests/harness/stopping.py): the run continues after whichever round the parked checkpoint holds
    saved = checkpoint["round"]
    assert 2 <= saved < 6

    shutil.copytree(out, elsewhere / "stopped")
    suite = write_suite(elsewhere, REAL.replace("{data}", sample_data_folder(elsewhere / "cifar10")))
    out, folder = elsewhere / "stopped", elsewhere / "stopped/runs/feast/seed0"
    lines = []
    again = run_suite(suite, out, printer=lambda line, **_: lines.append(line), plots=False, progress_every=1)
    assert not again["failed"], "\n".join(lines)
    text = "\n".join(lines)
    assert f"continuing seed0.interrupted-1 after round {saved}" in text and " round 6/6" in text
    record = json.loads((folder / RUN_RECORD).read_text())
    assert record["resumed_after_round"] == saved
    reference = straight / "runs/feast/seed0"
    assert (folder / "metrics.csv").read_text() == (reference / "metrics.csv").read_text()
    weights = torch.load(reference / "supernet.pt", weights_only=True)["state_dict"]
    resumed = torch.load(folder / "supernet.pt", weights_only=True)["state_dict"]
    assert weights.keys() == resumed.keys() and all(torch.equal(weights[k], resumed[k]) for k in weights)
    # every other number verify compares (time and memory aside) is equal too, the clients' statistics included
    # (the checkpoint holds them: clients.csv and rounds.csv's client_train_flops count the rounds before the resume)
    findings, _ = compare_run(reference, folder)
    assert {f.file for f in findings} >= {"clients.csv", "rounds.csv"}
    assert any(f.metric == "client_train_flops" for f in findings)
    assert all(f.equal for f in findings), [f for f in findings if not f.equal]
