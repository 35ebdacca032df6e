"""What the runner records and reads back in a run folder: run.json (``read_record``, ``is_finished``), the run's
data by content (``data_record``), paths kept portable (relative to the repository; ``output-dir`` is the record's own
folder), and the checkout's commit. The names of a run folder's files live here."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from experiments.tools.git_state import git_state
from fl_app.data.provenance import data_fingerprint
from fl_app.run.outputs import write_json

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"  # the real CIFAR-10 beside the checkout
RUN_RECORD = "run.json"
RUN_LOG = "run.log"
COMPLETED = "finished:completed"
RUNNING = "running"


def data_location(data_path: str) -> Path:
    """Where a run config's data-path points on this machine: a relative path is read from the repository root."""
    path = Path(data_path).expanduser()
    return path if path.is_absolute() else Path(os.path.normpath(ROOT / path))


def portable_data_path(data_path: str) -> str:
    """data-path as a record keeps it: relative to the repository when the folder lies in or beside it (the suites'
    ``../shared/data/cifar10``), else as given (a path of this machine, which tests/test_no_absolute_paths.py keeps
    out of committed files)."""
    if not data_path:
        return data_path
    path = Path(data_path).expanduser()
    if not path.is_absolute():
        return data_path
    normal = Path(os.path.normpath(path))  # not resolved: a shared folder may be a link to elsewhere
    if normal.is_relative_to(ROOT.parent):
        return os.path.relpath(normal, ROOT)
    return data_path


def data_record(run_config: dict) -> dict:
    """The record's ``data``: the portable data-path and the content fingerprint of what the run reads."""
    source, data_path = run_config.get("data-source", "sample"), run_config.get("data-path", "")
    fingerprint = data_fingerprint(run_config.get("dataset", "cifar10"), source, str(data_location(data_path)))
    return {"path": portable_data_path(data_path), **fingerprint}


def portable_run_config(run_config: dict) -> dict:
    """A run config as records keep it: portable data-path, output-dir '.' (the folder of the record)."""
    out = dict(run_config)
    if "data-path" in out:
        out["data-path"] = portable_data_path(out["data-path"])
    if "output-dir" in out:
        out["output-dir"] = "."
    return out


def portable_record_config(run_config: dict, folder: Path) -> dict:
    """``portable_run_config`` for the run config a file in the run ``folder`` records; resume-from (the interrupted
    copy it continued, beside it) is named relative to the folder."""
    portable = portable_run_config(run_config)
    if portable.get("resume-from"):
        portable["resume-from"] = os.path.relpath(portable["resume-from"], folder)
    return portable


def make_summary_portable(folder: Path) -> None:
    """The app writes the absolute paths it was given into summary.json (its ServerApp needs them): keep the
    portable forms instead, once the run has ended. Nothing else in the file changes."""
    path = folder / "summary.json"
    summary = try_read_json(path)
    if isinstance(summary, dict) and isinstance(summary.get("run_config"), dict):
        portable = portable_record_config(summary["run_config"], folder)
        if portable != summary["run_config"]:
            write_json(path, {**summary, "run_config": portable}, replace=True)  # the run's own, written by the app


def try_read_json(path: Path):
    """A JSON file's content (None when it cannot be read or parsed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_record(folder: Path) -> dict | None:
    return try_read_json(folder / RUN_RECORD)


def is_finished(folder: Path, record: dict | None) -> bool:
    if record is None or record.get("status") != COMPLETED:
        return False
    # a run that failed after some rounds may still write a summary, with completed: false
    summary = try_read_json(folder / "summary.json")
    return summary is not None and summary.get("completed", True) is not False


def ran_to_the_end(folder: Path) -> bool:
    """Whether the run's own summary.json, which the app writes last (after the weights and round files), says it
    completed all its rounds: a runner stopped after that moment still records the run as finished."""
    summary = try_read_json(folder / "summary.json")
    return (
        isinstance(summary, dict)
        and summary.get("completed") is True
        and summary.get("rounds_done") == summary.get("rounds")
    )


def read_rows(path: Path) -> list[dict] | None:
    """A CSV's rows (None when it cannot be read)."""
    try:
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError:
        return None


def recorded_git_state(root: Path = ROOT) -> tuple[str, bool]:
    """(commit, dirty) as run.json records them (``experiments.tools.git_state``, over the whole checkout);
    ('unknown', True) outside a git checkout."""
    commit, dirty = git_state(root)
    return ("unknown", True) if commit is None else (commit, dirty)
