"""The completed runs of a suite folder as the runner lays them out (``runs/LABEL/seedN/`` with ``summary.json`` and
the runner's ``run.json``): one reader for the studies that compare runs by label and seed. Interrupted copies
(``seedN.interrupted-K``) and runs that did not complete are left out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fl_app.report import ReportError
from fl_app.report.read import read_json


@dataclass(frozen=True)
class SuiteRun:
    label: str  # the run folder's name: the runner's label and grid cell, e.g. fedtopo@topo-beta=0.5,topo-tau=0.1
    seed: int
    summary: dict
    folder: Path


def completed_runs(folder: Path) -> list[SuiteRun]:
    """Every completed run under ``folder`` (a suite folder or its ``runs/``), by label then seed; an error naming
    the folder when it does not exist (an empty list when it holds no completed run: the caller says what it needs)."""
    runs_dir = folder / "runs" if (folder / "runs").is_dir() else folder
    if not runs_dir.is_dir():
        raise ReportError(f"{folder}: no such folder; allowed: a suite folder or the runs/ folder of one")
    runs = []
    for path in sorted(runs_dir.glob("*/seed*/summary.json")):
        seed_text = path.parent.name.removeprefix("seed")
        if not seed_text.isdigit():  # an interrupted copy or another folder
            continue
        summary = read_json(path, {})
        if summary.get("completed"):
            runs.append(SuiteRun(path.parent.parent.name, int(seed_text), summary, path.parent))
    return runs
