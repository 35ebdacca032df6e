"""`flwr_run` takes the run id from `flwr run --format json` (never from log text), follows the run with `flwr log`,
and stops an interrupted run in the SuperLink, so it cannot go on writing into the run's folder."""

import json
import subprocess

import pytest

from experiments.runner import flower_runs

STARTED = {"success": True, "run-id": "4242", "federation-id": "", "fab-id": "fl-app/fl-app"}


def use_fake_flwr(monkeypatch, fake_run) -> None:
    """Every flwr command through ``fake_run``: subprocess.run and `flwr log --stream`, which ``follow_log`` starts
    with Popen (a real `flwr log` would start a local SuperLink in the default Flower home)."""
    monkeypatch.setattr(flower_runs.subprocess, "run", fake_run)
    monkeypatch.setattr(
        flower_runs, "follow_log", lambda command, env, handle, timeout, stop: fake_run(command, stdout=handle)
    )


def test_the_run_id_comes_from_json_and_an_interrupt_stops_the_run(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        if command[:2] == ["flwr", "run"]:
            assert "--format" in command and command[command.index("--format") + 1] == "json"
            assert "--stream" not in command
            # a log line that looks like another run id must not matter
            return subprocess.CompletedProcess(command, 0, json.dumps(STARTED, indent=2), "Successfully started run 1")
        if command[:2] == ["flwr", "log"]:
            kwargs["stdout"].write(b"INFO : [ROUND 1/2]\n")
            kwargs["stdout"].flush()
            raise KeyboardInterrupt
        return subprocess.CompletedProcess(command, 0, "", "")

    use_fake_flwr(monkeypatch, fake_run)
    with pytest.raises(KeyboardInterrupt):
        flower_runs.flwr_run({"method": "feast"}, log_file=tmp_path / "run.log", superlink="lab")
    assert calls[1] == ["flwr", "log", "4242", "lab", "--stream"]
    assert calls[-1][:4] == ["flwr", "stop", "4242", "lab"]
    assert (tmp_path / "run.log").read_bytes() == b"Successfully started run 4242\nINFO : [ROUND 1/2]\n"


def test_the_status_comes_from_flwr_ls(tmp_path, monkeypatch):
    def fake_run(command, **kwargs):
        if command[:2] == ["flwr", "run"]:
            return subprocess.CompletedProcess(command, 0, json.dumps(STARTED), "")
        if command[:2] == ["flwr", "ls"]:
            assert command[command.index("--run-id") + 1] == "4242"
            return subprocess.CompletedProcess(command, 0, json.dumps({"runs": [{"status": "finished:failed"}]}), "")
        return subprocess.CompletedProcess(command, 0, "", "")

    use_fake_flwr(monkeypatch, fake_run)
    assert flower_runs.flwr_run("method='feast'") == ("4242", "finished:failed")


def test_a_run_that_did_not_start_is_an_error(monkeypatch):
    failed = {"success": False, "error-message": "Failed to start run"}
    use_fake_flwr(monkeypatch, lambda command, **_: subprocess.CompletedProcess(command, 1, json.dumps(failed), ""))
    with pytest.raises(RuntimeError, match="flwr run did not start a run"):
        flower_runs.flwr_run("method='feast'")


def test_the_status_is_asked_again_until_the_run_has_finished(monkeypatch):
    """flwr_run reads the status as fetch_results does (fl_app.run.flwr_status: text before the JSON is skipped)
    and asks again, once a second, until the run has finished."""
    answers, asked = iter(["running", "running", "finished:completed"]), []

    def fake_run(command, **kwargs):
        if command[:2] == ["flwr", "run"]:
            return subprocess.CompletedProcess(command, 0, json.dumps(STARTED), "")
        if command[:2] == ["flwr", "ls"]:
            asked.append(command)
            listing = json.dumps({"runs": [{"status": next(answers)}]})
            return subprocess.CompletedProcess(command, 0, f"Loading project configuration...\n{listing}", "")
        return subprocess.CompletedProcess(command, 0, "", "")

    use_fake_flwr(monkeypatch, fake_run)
    monkeypatch.setattr(flower_runs.time, "sleep", lambda seconds: None)
    assert flower_runs.flwr_run("method='feast'", superlink="lab") == ("4242", "finished:completed")
    assert asked == [["flwr", "ls", "lab", "--run-id", "4242", "--format", "json"]] * 3


def test_a_flwr_command_started_without_a_home_of_its_own_never_reaches_the_user_s(tmp_path_factory):
    """The session's default Flower home (tests/conftest.py): a `flwr` command a test starts with the plain
    environment finds this session's folder and ports, not ``~/.flwr`` and Flower's default ports."""
    import os
    from pathlib import Path

    home = Path(os.environ["FLWR_HOME"])
    assert home.is_relative_to(tmp_path_factory.getbasetemp()) and home != Path.home() / ".flwr"
    assert os.environ["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] != "39091"  # flwr.cli.constant's default
