"""`fl_app.deploy results`: a finished run's output folder, found by the run id in its flower_run.json, is copied whole
into a new local folder, from this machine or through ssh (here a stand-in `ssh` that runs the command locally, as
the remote shell would); unfinished or unknown runs and an existing --out are refused. The real thing, against a TLS
SuperLink on loopback, is in tests/test_deployment.py."""

from __future__ import annotations

import json
import os
import stat

import pytest

from fl_app import deploy
from fl_app.deploy import results as deploy_results


def _tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def runs(tmp_path):
    """A runs folder with an odd name holding two finished runs' folders and one foreign folder."""
    root = tmp_path / "runs of 'lab' $HOME"
    for run_id, name in (("111", "feast-cifar10-s0-20260101-000000"), ("222", "fedtopo-cifar10-s1-20260101-010000")):
        folder = root / name
        (folder / "client-models").mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"method": name.split("-")[0], "completed": True}))
        (folder / "metrics.csv").write_text("round,test_accuracy\n2,0.5\n")
        (folder / "client-models" / "partition-0-round-2.pt").write_bytes(os.urandom(4096))
        (folder / "flower_run.json").write_text(json.dumps({"flower_run_id": run_id}) + "\n")
    (root / "notes").mkdir()
    (root / "notes" / "flower_run.json").write_text("not json")
    return root


@pytest.fixture
def finished(monkeypatch):
    status = {"value": "finished:completed"}
    monkeypatch.setattr(deploy_results, "run_status", lambda run_id, connection, env=None: status["value"])
    return status


def test_a_finished_runs_folder_is_copied_whole(runs, finished, tmp_path, capsys):
    out = tmp_path / "fetched" / "222"
    deploy.main(["results", "222", "--connection", "lab", "--out", str(out), "--runs", str(runs)])
    source = runs / "fedtopo-cifar10-s1-20260101-010000"
    assert _tree(out) == _tree(source)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700 and stat.S_IMODE(os.stat(out.parent).st_mode) == 0o700
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"run_id": "222", "status": "finished:completed", "folder": str(source), "out": str(out)}


def test_through_ssh_the_search_and_the_copy_run_on_the_host(runs, finished, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "ssh-calls"
    # the remote side of ssh: the host argument dropped, the command line run by a shell
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$1" >> "{calls}"\nshift\nexec sh -c "$*"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "fetched"
    result = deploy_results.fetch_results("111", "lab", out, runs=[str(runs)], ssh="me@superlink")
    assert _tree(out) == _tree(runs / "feast-cifar10-s0-20260101-000000")
    assert calls.read_text().split() == ["me@superlink", "me@superlink"]  # one search, one copy
    assert result["folder"] == str(runs / "feast-cifar10-s0-20260101-000000")


def test_a_run_folder_itself_and_a_home_relative_root_are_searched(runs, finished, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(runs.parent))
    folder = runs / "feast-cifar10-s0-20260101-000000"
    for root in (str(folder), f"~/{runs.name}"):
        out = tmp_path / f"out-{len(root)}"
        assert deploy_results.fetch_results("111", "lab", out, runs=[root])["folder"] == str(folder)
        assert _tree(out) == _tree(folder)


@pytest.mark.parametrize("status", ["running", "pending", "starting"])
def test_an_unfinished_run_is_refused(runs, finished, tmp_path, status):
    finished["value"] = status
    with pytest.raises(ValueError, match=rf"run 111 is '{status}': its files are complete once it has finished"):
        deploy_results.fetch_results("111", "lab", tmp_path / "out", runs=[str(runs)])
    assert not (tmp_path / "out").exists()


def test_an_unknown_run_and_an_existing_out_are_refused(runs, finished, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        deploy.main(["results", "333", "--connection", "lab", "--out", str(tmp_path / "o"), "--runs", str(runs)])
    assert exit_.value.code == 2 and "run 333: no run folder under" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]

    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="--out .*taken already exists"):
        deploy_results.fetch_results("111", "lab", tmp_path / "taken", runs=[str(runs)])


def test_a_folder_whose_record_changed_meanwhile_is_not_delivered(runs, finished, tmp_path, monkeypatch):
    folder = runs / "feast-cifar10-s0-20260101-000000"
    real_locate = deploy_results.locate_run

    def locate_then_reuse(*args, **kwargs):
        found = real_locate(*args, **kwargs)
        (folder / "flower_run.json").write_text(json.dumps({"flower_run_id": "999"}))  # another run took it
        return found

    monkeypatch.setattr(deploy_results, "locate_run", locate_then_reuse)
    with pytest.raises(ValueError, match="names run 999, not 111"):
        deploy_results.fetch_results("111", "lab", tmp_path / "out", runs=[str(runs)])
    assert not (tmp_path / "out").exists()
