"""An interrupted `flwr run` is stopped in the SuperLink, so it cannot go on writing into the run's folder."""

import subprocess

import pytest

from experiments import flower_runs


def test_interrupt_stops_the_run_in_the_superlink(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        if command[:2] == ["flwr", "run"]:
            kwargs["stdout"].write("Successfully started run 4242\n")
            kwargs["stdout"].flush()
            raise KeyboardInterrupt
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(flower_runs.subprocess, "run", fake_run)
    with pytest.raises(KeyboardInterrupt):
        flower_runs.flwr_run({"method": "feast"}, log_file=tmp_path / "run.log")
    assert calls[-1][:3] == ["flwr", "stop", "4242"]
