"""The plan of a suite: every (label, grid cell, seed) as a ``PlannedRun`` (``expand``), and for each its folder
and action (``decide``): reuse a finished run of equal settings, train a missing or interrupted one, or refuse one
whose settings differ. A match-compute run is decided once its rounds are known (``settle_match``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from experiments.runner.matching import match_sources_of, resolve_match
from experiments.runner.records import data_location, data_record, is_finished, read_record
from experiments.runner.suite import MATCH_FLOPS, Suite, SuiteMismatch, run_overrides
from fl_app.report import settings
from fl_app.run.config import validate_run_config

# keys that say where a run is kept, where its data lie or where its metrics are mirrored, not what it computes: never
# part of the reuse comparison (the data are compared by content, the record's "data")
NOT_COMPARED = ("output-dir", "data-path", "tracker")


@dataclass
class PlannedRun:
    label: str
    cell: dict
    seed: int
    run_config: dict  # validated, complete, without output-dir; data-path as the suite gives it
    federation: dict
    data: dict = field(default_factory=dict)  # data_record(run_config)
    folder: Path = None
    action: str = ""  # "reuse", "train", "refuse"; a match-compute run: "pending" until resolved, "skip" if it cannot
    differences: list[str] = field(default_factory=list)
    moved_aside: Path | None = None
    resume_from: Path | None = None  # an interrupted copy of this run whose checkpoint the run continues from
    resumed_after_round: int = 0
    match: tuple[str, str] | None = None  # a match-compute run's (reference label, source label)
    match_flops: str = "counted"  # which of their FLOPs it matches (``MATCH_FLOPS``)
    match_compute: dict = field(default_factory=dict)  # what its rounds were resolved from (its run.json keeps it)
    reason: str = ""  # "pending": what it waits for; "skip": why it is not run

    @property
    def name(self) -> str:
        return f"{self.label}{cell_suffix(self.cell)}"

    def launch_config(self) -> dict:
        """The run config `flwr run` gets: absolute data-path and output-dir (the ServerApp's working directory is
        not the repository)."""
        data_path = self.run_config.get("data-path", "")
        return {
            **self.run_config,
            **({"data-path": str(data_location(data_path))} if data_path else {}),
            "output-dir": str(self.folder),
            **({"resume-from": str(self.resume_from)} if self.resume_from else {}),
        }


def cell_suffix(cell: dict) -> str:
    return "@" + ",".join(f"{k}={v}" for k, v in cell.items()) if cell else ""


def cells(grid: dict[str, list]) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def expand(suite: Suite) -> list[PlannedRun]:
    """Every run of the suite, seed by seed (so a stopped suite has whole seeds first), validated before any run;
    within a seed the match-compute entries come last, after the runs their rounds are read from."""
    runs = []
    labels = sorted(suite.methods, key=lambda label: label in suite.matched)  # stable: file order otherwise
    for seed in suite.seeds:
        for label in labels:
            for cell in cells(suite.grid):
                request = {**suite.base, **cell, **run_overrides(label, suite.methods[label]), "seed": seed}
                try:
                    config = validate_run_config(request).to_dict()
                    data = data_record(config)
                except ValueError as error:
                    raise ValueError(f"{label}{cell_suffix(cell)} seed={seed}: {error}") from None
                config.pop("output-dir")
                match = suite.matched.get(label)
                flops = suite.methods[label].get(MATCH_FLOPS, "counted")
                runs.append(
                    PlannedRun(label, cell, seed, config, dict(suite.federation), data, match=match, match_flops=flops)
                )
    return runs


def federation_text(federation: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in federation.items())


def data_differences(recorded: dict, run: PlannedRun) -> list[str]:
    """How the recorded data differ from the requested: by content when the record has a fingerprint; a record
    without one (made before fingerprints) matches only the same folder."""
    old = recorded.get("data")
    if isinstance(old, dict):
        out = []
        for kind in ("sha256", "hub"):
            before, after = old.get(kind), run.data.get(kind)
            if isinstance(before, dict) and isinstance(after, dict):
                out += [
                    f"data {kind} of {name}: {str(before.get(name))[:12]} -> {str(after.get(name))[:12]}"
                    for name in sorted(set(before) | set(after))
                    if before.get(name) != after.get(name)
                ]
            elif before != after:
                out.append(f"data {kind}: {before!r} -> {after!r}")
        return out
    old_path = recorded.get("run_config", {}).get("data-path", "")
    new_path = run.run_config.get("data-path", "")
    if (old_path or new_path) and (not old_path or not new_path or data_location(old_path) != data_location(new_path)):
        return [f"data-path (the record has no data fingerprint): {old_path!r} -> {new_path!r}"]
    return []


def differing_keys(recorded: dict, run: PlannedRun) -> list[str]:
    """'key: recorded -> requested' for every difference in run config, federation, seed and data content (keys
    at their default on both sides, e.g. added to the registry after the run, are equal)."""
    out = []
    old_config = {k: v for k, v in settings(recorded.get("run_config", {})).items() if k not in NOT_COMPARED}
    new_config = {k: v for k, v in settings(run.run_config).items() if k not in NOT_COMPARED}
    for scope, old, new in (
        ("", old_config, new_config),
        ("federation.", recorded.get("federation", {}), run.federation),
    ):
        for key in sorted(set(old) | set(new)):
            if old.get(key, "<default>") != new.get(key, "<default>"):
                out.append(f"{scope}{key}: {old.get(key, '<default>')!r} -> {new.get(key, '<default>')!r}")
    if recorded.get("seed") != run.seed:
        out.append(f"seed: {recorded.get('seed')!r} -> {run.seed!r}")
    return out + data_differences(recorded, run)


def home_folder(run: PlannedRun, out: Path) -> Path:
    return out / "runs" / f"{run.label}{cell_suffix(run.cell)}" / f"seed{run.seed}"


def decide(run: PlannedRun, out: Path, rerun_changed: bool) -> None:
    """Choose the run's folder and action: reuse an exact match, train a missing or interrupted run, or refuse."""
    home = home_folder(run, out)
    versions = [home] + sorted(home.parent.glob(f"{home.name}.v*"), key=lambda p: int(p.name.rsplit(".v", 1)[1]))
    for folder in versions:
        record = read_record(folder)
        if is_finished(folder, record) and not differing_keys(record, run):
            run.folder, run.action = folder, "reuse"
            return
    record = read_record(home)
    if not home.exists() or not is_finished(home, record):
        run.folder, run.action = home, "train"  # new, or interrupted/failed: moved aside before training
        return
    run.differences = differing_keys(record, run)
    if not rerun_changed:
        run.folder, run.action = home, "refuse"
        return
    taken = {p.name for p in versions}
    version = next(k for k in itertools.count(2) if f"{home.name}.v{k}" not in taken)
    run.folder, run.action = home.with_name(f"{home.name}.v{version}"), "train"


def plan(suite: Suite, out: Path, rerun_changed: bool = False) -> list[PlannedRun]:
    """Every run with its folder and action. A match-compute run whose sources are reused is resolved now (so a
    finished run of other rounds is refused before anything trains); one whose sources train first is "pending"
    (``settle_match`` resolves it when ``execute`` reaches it)."""
    runs = expand(suite)
    for run in runs:
        if run.match is None:
            decide(run, out, rerun_changed)
    for run in runs:
        if run.match is not None:
            reference, source = match_sources_of(run, runs)
            if reference.action == "reuse" and source.action == "reuse":
                settle_match(run, runs, out, rerun_changed)
            else:
                run.folder, run.action = home_folder(run, out), "pending"
                run.reason = f"its rounds are set once {reference.label} and {source.label} of seed {run.seed} end"
    refused = [r for r in runs if r.action == "refuse"]
    if refused:
        lines = [
            f"{r.folder.relative_to(out)} holds a finished run with other settings: " + "; ".join(r.differences)
            for r in refused
        ]
        raise SuiteMismatch(
            "refusing to reuse or overwrite finished runs whose settings differ from the suite:\n  "
            + "\n  ".join(lines)
            + "\nUse another --out, or --rerun-changed to train the changed "
            "runs into new folders (the old runs are kept)."
        )
    return runs


def settle_match(
    run: PlannedRun, runs: list[PlannedRun], out: Path, rerun_changed: bool, failed: list[PlannedRun] = ()
) -> None:
    """Resolve a match-compute run once its sources have ended, then decide it like any run (``decide``: reuse,
    train or refuse). When a source failed or recorded no FLOPs it becomes "skip", with the reason."""
    reference, source = match_sources_of(run, runs)
    run.folder = home_folder(run, out)
    ended = [r for r in (reference, source) if r not in failed and is_finished(r.folder, read_record(r.folder))]
    missing = [r for r in (reference, source) if r not in ended]
    if missing:
        run.action = "skip"
        run.reason = "no finished run of " + " and ".join(f"{r.label} seed={r.seed}" for r in missing)
        return
    try:
        resolve_match(run, reference, source)
    except ValueError as error:
        run.action, run.reason = "skip", f"its rounds cannot be set: {error}"
        return
    decide(run, out, rerun_changed)
