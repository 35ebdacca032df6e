"""Runs side by side (``lanes``): the cores are shared so that lanes x parallel clients x threads stays within them,
two lanes really train two runs at once, a matched run still waits for the runs its rounds come from, and every
run's record says what machine, threads, versions and load it ran under."""

from __future__ import annotations

import json
import threading
import time

import pytest

from experiments.runner import RUN_RECORD, RUNNING, lane_cpus, load_suite
from experiments.runner.flower_runs import RunnerStopped
from experiments.runner.machine import differences, machine_record
from tests.harness.suites import write_suite
from tests.test_matched_compute import SUITE, Launcher, run


def test_each_lane_gets_its_share_of_the_cores_and_clients_must_fit_in_it():
    one = {"client-resources-num-cpus": 1}
    assert lane_cpus(1, one, machine=2) is None  # one lane on every core: Ray sees every core
    assert lane_cpus(1, one, cores=2, machine=2) is None
    assert lane_cpus(2, one, machine=2) == 1  # 2 runs x 1 client x 1 thread
    assert lane_cpus(2, {"client-resources-num-cpus": 2}, machine=8) == 4
    with pytest.raises(ValueError, match="client-resources-num-cpus=2; allowed: at most 1"):
        lane_cpus(2, {"client-resources-num-cpus": 2}, machine=2)
    with pytest.raises(ValueError, match="client-resources-num-cpus=2"):
        lane_cpus(2, {}, machine=2)  # Flower's default asks 2 CPUs per client
    with pytest.raises(ValueError, match="lanes=3: more runs side by side than the 2 cores"):
        lane_cpus(3, one, machine=2)


def test_a_runner_given_fewer_cores_leaves_the_others_free():
    """--cores 1 on two cores: its one lane's Ray gets one CPU (one client at a time), so a second runner can train
    on the other core without oversubscribing them; its two lanes would not fit."""
    one = {"client-resources-num-cpus": 1}
    assert lane_cpus(1, one, cores=1, machine=2) == 1
    assert lane_cpus(2, one, cores=4, machine=8) == 2
    with pytest.raises(ValueError, match="lanes=2: more runs side by side than the 1 cores"):
        lane_cpus(2, one, cores=1, machine=2)
    for cores in (0, 3):
        with pytest.raises(ValueError, match=rf"--cores {cores}: allowed 1 to 2"):
            lane_cpus(1, one, cores=cores, machine=2)


def test_the_cores_option_reaches_every_run_s_ray_and_record(tmp_path, monkeypatch):
    from experiments.runner import cli, execution, flower_runs

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    federations = []
    monkeypatch.setattr(
        flower_runs,
        "flwr_run",
        lambda config, federation, **kw: federations.append(federation) or ("1", "finished:completed"),
    )
    monkeypatch.setattr(
        execution,
        "lane_launcher",
        lambda stack, ray_cpus, *a, **kw: execution.flower_launcher({"FLWR_HOME": str(tmp_path / "home")}, ray_cpus),
    )
    suite = write_suite(tmp_path, SUITE)
    code = cli.main(
        ["run", str(suite), "--out", str(tmp_path / "out"), "--methods", "feast", "--seeds", "0", "--cores", "1"]
    )
    assert federations and all("init-args-num-cpus=1" in f for f in federations), federations
    record = json.loads((tmp_path / "out/runs/feast/seed0" / RUN_RECORD).read_text())
    assert record["machine"]["ray_cpus_per_run"] == 1, (code, record)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_bad_lanes_value_is_refused_naming_it(tmp_path, value):
    text = SUITE.replace("[suite]\n", f"[suite]\nlanes = {json.dumps(value) if isinstance(value, str) else value}\n")
    text = text.replace("lanes = True", "lanes = true")
    with pytest.raises(ValueError, match=r"\[suite\] lanes="):
        load_suite(write_suite(tmp_path, text))


class OverlapLauncher(Launcher):
    """The matched-compute stand-in, holding each run until a second one is in flight (or a short wait passes)."""

    def __init__(self):
        super().__init__()
        self.lock, self.in_flight, self.most = threading.Lock(), 0, 0
        self.both = threading.Event()

    def __call__(self, run, timeout):
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            if self.in_flight >= 2:
                self.both.set()
        self.both.wait(timeout=2.0)
        try:
            return super().__call__(run, timeout)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_two_lanes_train_two_runs_at_once_and_a_matched_run_waits_for_its_sources(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    launcher = OverlapLauncher()
    result, _ = run(tmp_path, launcher, lanes=2)
    assert not result["failed"] and launcher.most == 2
    order = [(label, seed) for label, seed, *_ in launcher.launched]
    for seed in (0, 1):  # each matched run started after both runs its rounds are read from had started...
        matched = order.index(("fedavg-min-matched", seed))
        assert matched > order.index(("feast", seed)) and matched > order.index(("fedavg-min", seed))
    # ... and its rounds are the same as with one lane (both sources had ended: 12 and 14 rounds)
    rounds = {(label, seed): r for label, seed, r, *_ in launcher.launched}
    assert rounds[("fedavg-min-matched", 0)] == 12 and rounds[("fedavg-min-matched", 1)] == 14
    record = json.loads((tmp_path / "out/runs/feast/seed0" / RUN_RECORD).read_text())
    assert record["machine"]["lanes"] == 2 and record["machine"]["ray_cpus_per_run"] == 1


def test_one_lane_records_the_machine_it_ran_on(tmp_path):
    # one lane keeps the suite's order: test_matched_compute's order test runs through the same lane
    result, _ = run(tmp_path, Launcher())
    assert not result["failed"]
    machine = json.loads((tmp_path / "out/runs/feast/seed1" / RUN_RECORD).read_text())["machine"]
    assert machine["lanes"] == 1 and machine["versions"]["flwr"] and machine["processor"]["architecture"]
    assert len(machine["load_average_at_start"]) == 3 and len(machine["load_average_at_end"]) == 3


def test_machine_differences_name_what_can_change_the_last_bits():
    committed = machine_record(1, None)
    assert differences(committed, committed) == []
    other = json.loads(json.dumps(committed))
    other["processor"]["vector_extensions"] = ["avx2"]
    other["versions"]["torch"] = "9.9"
    other["threads"]["OMP_NUM_THREADS"] = "4"
    other["load_average_at_start"] = [9, 9, 9]  # the load changes time, not results
    found = differences(committed, other)
    assert len(found) == 3 and any("torch" in f for f in found) and any("vector_extensions" in f for f in found)
    assert differences(None, committed) == ["the committed run recorded no machine (made before run.json held one)"]


def test_a_lane_caps_its_own_ray_but_not_a_ray_cluster_it_joins(tmp_path, monkeypatch):
    """A run's own Ray gets the lane's CPUs (init-args-num-cpus); a run joining a Ray head or cluster (RAY_ADDRESS)
    must not pass them (ray.init refuses num_cpus when connecting): there the head's CPUs are the cap."""
    from experiments.runner import execution, flower_runs

    federations = []
    monkeypatch.setattr(
        flower_runs,
        "flwr_run",
        lambda config, federation, **kw: federations.append(federation) or ("1", "finished:completed"),
    )
    run = next(r for r in execution.plan(load_suite(write_suite(tmp_path, SUITE)), tmp_path / "out"))
    run.folder.mkdir(parents=True)
    execution.flower_launcher({"FLWR_HOME": "x"}, ray_cpus=1)(run, 60)
    execution.flower_launcher({"FLWR_HOME": "x", "RAY_ADDRESS": "127.0.0.1:1"}, ray_cpus=1)(run, 60)
    assert "init-args-num-cpus=1" in federations[0] and "init-args-num-cpus" not in federations[1]


def test_where_a_suites_runs_get_ray_is_recorded(monkeypatch):
    from experiments.runner.execution import CLUSTER_RAY, PRIVATE_RAY, SHARED_RAY, ray_kind

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert (ray_kind(False), ray_kind(True)) == (PRIVATE_RAY, SHARED_RAY)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a cluster the user named wins: the runner starts no head
    assert ray_kind(True) == ray_kind(False) == CLUSTER_RAY
    assert machine_record(2, 1, SHARED_RAY)["ray"] == "one Ray head per lane"


# -- stopping a runner of several lanes ------------------------------------------------------------------------------
class StopAwareLauncher:
    """Stands in for ``flower_launcher``: a run trains until the suite's stop event is set, then ends as ``flwr_run``
    does for a stopping lane (the Flower run stopped, ``RunnerStopped`` raised)."""

    def __init__(self, stop: threading.Event):
        self.stop, self.started, self.two_in_flight = stop, [], threading.Event()

    def __call__(self, run, timeout):
        self.started.append((run.label, run.seed))
        if len(self.started) == 2:
            self.two_in_flight.set()
        if self.stop.wait(timeout=60):
            raise RunnerStopped("the runner is stopping")
        raise AssertionError("the lane was never told to stop")


def test_sigterm_stops_every_lane_s_run_and_no_lane_takes_another(tmp_path, monkeypatch):
    """SIGTERM reaches the main thread only; with two lanes it must not unwind past lanes still training (their
    SuperLinks would be closed under them and the lanes go on to the next runs): both lanes stop their runs, neither
    takes another, the interrupt ends the runner once they have ended, and the stopped runs' records still say they
    were training (as a one-lane runner leaves them, for the next runner or ``park``)."""
    import os
    import signal

    from experiments.runner import run_suite
    from experiments.runner.cli import _interrupt

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    stop = threading.Event()
    launcher = StopAwareLauncher(stop)
    lines = []
    previous = signal.signal(signal.SIGTERM, _interrupt)  # what `python -m experiments.runner` installs
    try:
        killer = threading.Thread(
            target=lambda: launcher.two_in_flight.wait(30) and os.kill(os.getpid(), signal.SIGTERM), daemon=True
        )
        killer.start()
        with pytest.raises(KeyboardInterrupt):
            run_suite(
                write_suite(tmp_path, SUITE),
                tmp_path / "out",
                launch=launcher,
                printer=lambda line, **_: lines.append(line),
                plots=False,
                lanes=2,
                stop=stop,
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.is_set() and len(launcher.started) == 2, launcher.started
    assert not [t for t in threading.enumerate() if t.name.startswith("lane ") and t.is_alive()]
    assert any(line.startswith("stopping: each lane stops its run") for line in lines)
    for label, seed in launcher.started:
        record = json.loads((tmp_path / f"out/runs/{label}/seed{seed}" / RUN_RECORD).read_text())
        assert record["status"] == RUNNING and "runner" in record


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_stop_set_by_another_thread_ends_the_suite_as_stopped_not_as_done(tmp_path, monkeypatch, lanes):
    """No interrupt: a caller's thread sets the suite's stop event. The runs in flight stop and the suite raises
    ``RunnerStopped`` instead of returning, so no caller takes the stopped runs for done; their records still say
    they were training, and no table is written."""
    from experiments.runner import run_suite

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    stop = threading.Event()
    launcher = StopAwareLauncher(stop)
    threading.Thread(target=lambda: time.sleep(0.3) or stop.set(), daemon=True).start()
    with pytest.raises(RunnerStopped):
        run_suite(
            write_suite(tmp_path, SUITE),
            tmp_path / "out",
            launch=launcher,
            printer=lambda *a, **k: None,
            plots=False,
            lanes=lanes,
            stop=stop,
        )
    assert len(launcher.started) == lanes  # each lane stopped its run and took no other
    for label, seed in launcher.started:
        record = json.loads((tmp_path / f"out/runs/{label}/seed{seed}" / RUN_RECORD).read_text())
        assert record["status"] == RUNNING
    assert not (tmp_path / "out/table.md").exists()


def test_flwr_run_stops_its_flower_run_once_its_lane_is_told_to_stop(tmp_path, monkeypatch):
    import subprocess
    import sys

    from experiments.runner import flower_runs

    calls = []
    monkeypatch.setattr(flower_runs, "start_run", lambda *a, **k: "123")
    real_follow = flower_runs.follow_log
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]  # a `flwr log --stream` that would not end

    def follow(command, *args):
        calls.append(command)
        real_follow(sleeper, *args)

    monkeypatch.setattr(flower_runs, "follow_log", follow)
    real_run = subprocess.run
    monkeypatch.setattr(
        flower_runs.subprocess, "run", lambda command, **k: calls.append(command) or real_run(["true"], **k)
    )
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(flower_runs.RunnerStopped):
        flower_runs.flwr_run("num-server-rounds=1", env={"FLWR_HOME": str(tmp_path)}, timeout=60, stop=stop)
    assert calls == [["flwr", "log", "123", "--stream"], ["flwr", "stop", "123"]]


def test_follow_log_ends_its_command_at_the_timeout_or_the_stop(tmp_path):
    import subprocess
    import sys
    import time

    from experiments.runner.flower_runs import RunnerStopped, follow_log

    marker = tmp_path / "still-running"
    # the command writes the marker only if it outlives the wait below: a killed command never does
    command = [sys.executable, "-c", f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"]
    with pytest.raises(subprocess.TimeoutExpired):
        follow_log(command, {}, subprocess.DEVNULL, 0.5, None)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(RunnerStopped):
        follow_log(command, {}, subprocess.DEVNULL, 60, stop)
    time.sleep(3.5)
    assert not marker.exists()
    follow_log([sys.executable, "-c", "pass"], {}, subprocess.DEVNULL, 60, threading.Event())  # ends by itself


def test_a_stopped_runner_says_how_to_continue_and_exits_130(tmp_path, monkeypatch, capsys):
    from experiments.runner import cli

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(cli, "run_suite", stopped)
    assert cli.main(["run", str(write_suite(tmp_path, SUITE)), "--out", str(tmp_path / "out")]) == 130
    message = capsys.readouterr().err
    assert message.startswith("stopped (signal 15): the runs in flight were stopped") and "`park`" in message


@pytest.mark.parametrize("completed", [True, False])
def test_a_run_whose_app_finished_just_before_the_stop_is_recorded_finished_and_not_trained_again(
    tmp_path, monkeypatch, completed
):
    """The stop can come in the seconds between the app writing its summary (last, after the weights) and the
    runner recording the run: a summary that says every round completed makes the run finished, so the next runner
    reuses it instead of training it again; a summary of a run that did not complete leaves it to be continued."""
    from experiments.runner import COMPLETED, run_suite
    from tests.harness.suites import write_summary

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    stop, lines = threading.Event(), []

    def finish_then_stop(run, timeout):
        rounds = run.run_config["num-server-rounds"]
        done = rounds if completed else rounds - 2
        write_summary(
            run.folder, "feast", rounds, run.seed, 0.5, run.launch_config(), completed=completed, rounds_done=done
        )
        stop.set()
        raise RunnerStopped("the runner is stopping")

    suite = write_suite(tmp_path, SUITE)
    with pytest.raises(RunnerStopped):
        run_suite(
            suite,
            tmp_path / "out",
            launch=finish_then_stop,
            printer=lambda line, **_: lines.append(line),
            plots=False,
            stop=stop,
        )
    record = json.loads((tmp_path / "out/runs/feast/seed0" / RUN_RECORD).read_text())
    assert record["status"] == (COMPLETED if completed else RUNNING)
    assert any("just before the stop" in line for line in lines) == completed
    assert ("elapsed_seconds" in record) == completed and ("load_average_at_end" in record["machine"]) == completed

    launcher = Launcher()
    run_suite(suite, tmp_path / "out", launch=launcher, printer=lambda *a, **k: None, plots=False)
    trained_again = ("feast", 0) in [(label, seed) for label, seed, *_ in launcher.launched]
    assert trained_again is not completed
