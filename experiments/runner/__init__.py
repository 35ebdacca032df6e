"""Run a suite of experiments: every (method, grid cell, seed) of a suite file is one `flwr run` of the app.

    python -m experiments.runner run experiments/suites/smoke.toml --out /tmp/smoke
    python -m experiments.runner plan experiments/suites/smoke.toml --out /tmp/smoke     # what would run, no training
    python -m experiments.runner verify experiments/suites/smoke.toml --committed /tmp/smoke --out /tmp/smoke-again \
        --seeds 0 --methods feast       # retrain some runs into a new folder and compare their numbers
    python -m experiments.runner compare COMMITTED NEW    # the same comparison, for run folders made by other tools

A suite file (``experiments/suites/*.toml``)::

    [suite]
    seeds = [0, 1]
    reference = "feast"          # label the paired differences are taken against
    run-timeout = 3600           # seconds per run
    base-file = "experiments/conf/fedtopo-cifar10.toml"   # optional run config under [base] (its seed is ignored)
    [base]                       # run config of every run (fl_app.run.config keys); a relative data-path is read
    num-server-rounds = 2        #   from the repository root
    [federation]                 # simulation settings (--federation-config)
    num-supernodes = 4
    client-resources-num-cpus = 1
    [methods]                    # label -> run-config overrides; the label is the method unless it sets `method`
    feast = {}
    feast-kd0 = { method = "feast", kd-ratio = 0.0 }
    fedavg-min = {}
    fedavg-min-matched = { method = "fedavg-min", match-compute = "feast" }   # see below
    [grid]                       # optional: every combination of these values is one cell
    gamma = [0.0, 1.0]

A [methods] entry with the runner-only key ``match-compute = "<label>"`` trains, per seed and cell, as many rounds
as make its total client training FLOPs equal that label's finished run: num-server-rounds = ceil(T / f), T the
reference's total ``client_train_flops`` (its rounds.csv), f the mean per round of the same method's equal-rounds
run (the label whose overrides are the entry's without ``match-compute``, here ``fedavg-min``); its learning-rate
schedule spans its own rounds, and its eval-every is scaled so it evaluates about as often as that run. Its rounds
are known only once both runs of its seed have finished: it runs after them (matched entries come last within each
seed) and is not run, with the reason, when one failed. Its run.json records what the rounds came from
(``match_compute``); the report adds the matched-compute table (``matched.csv``). Beside it, ``match-flops =
"executed"`` matches the executed FLOPs instead of the counted ones (``client_train_flops_dense`` where a run counts
them apart: FIARSE computes its masked model densely, and the FEAST repository matches FIARSE on that; the default
``"counted"`` matches FIARSE's kept MACs).

Each run lives in ``OUT/runs/<label>[@cell]/seed<N>/``: the app's own outputs, ``run.log`` (the live `flwr run`
output) and ``run.json`` (full run config, federation, seed, data, commit, modified-tree flag, status, elapsed time).
Records hold no path of the machine that made them: ``data-path`` is kept relative to the repository (the suites'
``../shared/data/cifar10``) and the data by content (``data``: SHA-256 of the files read); ``output-dir`` is ``.``,
the folder of the record itself. A finished run is reused only when its run config, federation, seed and data
content equal the request, wherever the checkout and the data lie; any other finished run in the way is refused with
the differing keys named, before anything trains (``--rerun-changed`` trains the changed runs into new folders
``seed<N>.v2``, ... and keeps the old ones).

A stopped suite resumes where it stopped. An interrupted or failed run is moved aside (``seed<N>.interrupted-K``,
kept) and continues in a fresh ``seed<N>/`` from the latest checkpoint (``checkpoint-every``) among its moved-aside
copies made with the same settings at the same commit (``resume-from``; the app checks the checkpoint again and
refuses one of other settings); with none, it trains from round 1. The continued folder ends with the same
metrics.csv, summary and weights as an uninterrupted run, so the tables and the reuse rule treat it as one; its
run.json names the copy (``resumed_from``, ``resumed_after_round``). While a run trains its run.json names the
runner (pid, start time) and its Flower run (run id, FLWR_HOME, ports, SuperLink pids): a runner killed hard
(SIGKILL, out of memory) leaves a detached SuperLink still training, and the next invocation stops it before
anything trains (or refuses while that runner is alive). The console shows each run's rounds as they end (the last
evaluation's accuracy, the ETAs of the run and of the suite, from rounds.csv and metrics.csv). At the end the
suite's tables (means with 95% t-intervals over seeds, paired differences against the reference) are written by
``fl_app.report`` into OUT and printed.

OUT belongs to one suite (``OUT/suite.json``): a request that would drop runs recorded there (a subset of its
methods or seeds, another suite) is refused, since its tables would be rewritten without them; adding seeds,
methods or grid values is allowed. One runner at a time writes OUT (it holds ``OUT/.runner.lock``; a second
is refused before it reads or moves anything); labels are folder names (letters, digits, ``. _ + -``), and a link
inside OUT on the way to a run folder is refused, never followed. The committed ``experiments/results/`` folders
are refused unless ``--into-committed`` says that updating them is the point.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from experiments.runner.flower_env import is_alive, process_identity, stop_in_flight
from experiments.runner.machine import differences as machine_differences
from experiments.runner.machine import machine_record
from fl_app.data.provenance import data_fingerprint
from fl_app.io.cli import add_command, comma_list, run_config_overrides, tool_parser
from fl_app.io.files import first_link
from fl_app.report import MATCHED_COLUMN, read_table, settings, write_suite_tables
from fl_app.run.config import METHODS, SUPERNET_METHODS, validate_run_config
from fl_app.run.outputs import write_json

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "experiments" / "suites"
RESULTS = ROOT / "experiments" / "results"  # the committed results: written only with --into-committed
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"  # the real CIFAR-10 beside the checkout
RUN_RECORD = "run.json"
RUN_LOG = "run.log"
COMPLETED = "finished:completed"
RUNNING = "running"
CHECKPOINT = "checkpoint.pt"  # fl_app.run.checkpoint.CHECKPOINT_FILE (not imported here: it loads torch)
LOCK_FILE = ".runner.lock"  # in OUT: held (flock) by the one runner writing that suite folder
# a [methods] label names a folder under OUT/runs: letters, digits and . _ + - only, starting with a letter or digit
# (so never '..', a path separator or a hidden name)
SAFE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SAFE_LABEL_TEXT = "letters, digits and . _ + - (starting with a letter or digit)"
UNSAFE_IN_FOLDER_NAME = re.compile(r"[/\\\x00-\x1f]")  # grid values are written into folder names too
# the columns a run's accuracy is read from while it trains (supernet methods, model-heterogeneous methods)
ACCURACY_COLUMNS = ("population_weighted_accuracy", "mean_client_accuracy", "test_accuracy")
# keys that say where a run is kept, where its data lie or where its metrics are mirrored, not what it computes: never
# part of the reuse comparison (the data are compared by content, the record's "data")
NOT_COMPARED = ("output-dir", "data-path", "tracker")
SUITE_SECTIONS = ("suite", "base", "federation", "methods", "grid")
SUITE_KEYS = ("seeds", "reference", "run-timeout", "description", "base-file", "lanes")
MATCH_COMPUTE = "match-compute"  # runner-only [methods] key: the label whose client training compute a run matches
# runner-only [methods] key beside match-compute: which FLOPs are matched, rounds.csv column -> (the column, what it
# is): the counted ones (FIARSE's kept MACs, the project's convention) or the executed ones (FIARSE's dense MACs,
# the FEAST repository's; other methods execute what they count)
MATCH_FLOPS = "match-flops"
MATCH_FLOPS_COLUMNS = {"counted": "client_train_flops", "executed": "client_train_flops_dense"}
RUNNER_ONLY = (MATCH_COMPUTE, MATCH_FLOPS)


@dataclass
class Suite:
    path: Path
    seeds: list[int]
    base: dict
    federation: dict
    methods: dict[str, dict]
    grid: dict[str, list]
    reference: str | None = None
    run_timeout: float = 3600.0
    description: str = ""
    matched: dict[str, tuple[str, str]] = field(default_factory=dict)  # match-compute label -> (reference, source)
    lanes: int = 1  # runs trained side by side (``lane_cpus``)


def load_suite(
    path: Path, seeds: list[int] | None = None, methods: list[str] | None = None, overrides: dict | None = None
) -> Suite:
    """Read and check a suite file; errors name the section and key. ``seeds``, ``methods`` (a subset of its
    labels, or plain method names) and ``overrides`` (run-config values over [base]) change it from the command
    line without editing it."""
    raw = tomllib.loads(Path(path).read_text())
    if seeds is not None:
        raw.setdefault("suite", {})["seeds"] = seeds
    if methods is not None:
        known = raw.get("methods", {})
        unknown = [m for m in methods if m not in known and m not in METHODS]
        if unknown:
            raise ValueError(f"--methods {unknown}: not in {path}'s [methods] {list(known)} nor a method name")
        sources = {m for label in methods for m in match_sources(known)[0].get(label, ()) if m not in methods}
        if sources:
            raise ValueError(
                f"--methods {methods}: match-compute labels among them read their rounds from {sorted(sources)}; "
                "name those too"
            )
        raw["methods"] = {m: known.get(m, {}) for m in methods}
        if raw.get("suite", {}).get("reference") not in raw["methods"]:
            raw.get("suite", {}).pop("reference", None)
    if overrides:
        raw["base"] = {**raw.get("base", {}), **overrides}
    errors = [f"unknown section [{s}]; allowed: {list(SUITE_SECTIONS)}" for s in raw if s not in SUITE_SECTIONS]
    head = raw.get("suite", {})
    errors += [f"[suite] unknown key '{k}'; allowed: {list(SUITE_KEYS)}" for k in head if k not in SUITE_KEYS]
    seeds = head.get("seeds", [0])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds)) or len(
        set(seeds)
    ) != len(seeds):
        errors.append(f"[suite] seeds={seeds!r}: a non-empty list of distinct integers >= 0")
    methods = raw.get("methods", {})
    if not methods:
        errors.append("[methods]: name at least one method (label = {overrides})")
    for label, overrides in methods.items():
        if not SAFE_LABEL.fullmatch(label):
            errors.append(f"[methods] {label!r}: a label names a run folder; allowed: {SAFE_LABEL_TEXT}")
        elif not isinstance(overrides, dict):
            errors.append(f"[methods] {label}: expected a table of run-config overrides, e.g. {label} = {{}}")
        elif "method" not in overrides and label not in METHODS:
            errors.append(f"[methods] {label}: not a method name, so it must set method = one of {list(METHODS)}")
        elif any(k in overrides for k in ("seed", "output-dir")):
            errors.append(f"[methods] {label}: seed and output-dir are set by the runner")
    matched, match_errors = match_sources(methods)
    errors += match_errors
    grid = raw.get("grid", {})
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            errors.append(f"[grid] {key}: expected a non-empty list of values")
        elif any(UNSAFE_IN_FOLDER_NAME.search(f"{key}={v}") for v in values):
            errors.append(
                f"[grid] {key!r}: a key or value holds a path separator or control character (they name folders)"
            )
    base = raw.get("base", {})
    if "base-file" in head:  # a run-config TOML (e.g. experiments/conf/*.toml) under [base]; seeds come from [suite]
        base_file = ROOT / head["base-file"]
        if not base_file.is_file():
            errors.append(f"[suite] base-file='{head['base-file']}': no such file under {ROOT}")
        else:
            loaded = {k: v for k, v in tomllib.loads(base_file.read_text()).items() if k not in ("seed", "output-dir")}
            base = {**loaded, **base}
    if any(k in raw.get("base", {}) for k in ("seed", "output-dir")):
        errors.append("[base]: seed and output-dir are set by the runner ([suite] seeds)")
    lanes = head.get("lanes", 1)
    if not (isinstance(lanes, int) and not isinstance(lanes, bool) and lanes >= 1):
        errors.append(f"[suite] lanes={lanes!r}: how many runs train side by side; allowed: a whole number >= 1")
    reference = head.get("reference")
    if reference is not None and reference not in methods:
        errors.append(f"[suite] reference='{reference}': must be one of the [methods] labels {list(methods)}")
    if errors:
        raise ValueError(f"invalid suite {path}:\n  " + "\n  ".join(errors))
    return Suite(
        Path(path),
        seeds,
        base,
        raw.get("federation", {}),
        methods,
        grid,
        reference,
        float(head.get("run-timeout", 3600.0)),
        head.get("description", ""),
        matched,
        lanes if isinstance(lanes, int) else 1,
    )


def run_overrides(label: str, overrides: dict) -> dict:
    """A [methods] entry as run-config overrides: the method its label names, then its own keys but the runner's."""
    own = {k: v for k, v in overrides.items() if k not in RUNNER_ONLY}
    return {**({"method": label} if label in METHODS else {}), **own}


def match_sources(methods: dict) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({label: (reference label, source label)} of the entries with ``match-compute``, errors). The source is the
    same method's equal-rounds run: the first label whose overrides equal the entry's without ``match-compute``."""
    entries = {label: o for label, o in methods.items() if isinstance(o, dict)}
    plain = [label for label, o in entries.items() if MATCH_COMPUTE not in o]
    matched, errors = {}, []
    for label, overrides in entries.items():
        if MATCH_COMPUTE not in overrides:
            continue
        reference = overrides[MATCH_COMPUTE]
        where = f"[methods] {label}: {MATCH_COMPUTE}={reference!r}"
        own = run_overrides(label, overrides)
        sources = [other for other in plain if run_overrides(other, entries[other]) == own]
        if reference == label:
            errors.append(f"{where}: a run cannot match its own compute; allowed: one of {plain}")
        elif not isinstance(reference, str) or reference not in plain:
            errors.append(f"{where}: not a [methods] label without {MATCH_COMPUTE}; allowed: one of {plain}")
        elif overrides.get(MATCH_FLOPS, "counted") not in MATCH_FLOPS_COLUMNS:
            errors.append(
                f"[methods] {label}: {MATCH_FLOPS}={overrides[MATCH_FLOPS]!r}; allowed: {list(MATCH_FLOPS_COLUMNS)}"
            )
        elif "num-server-rounds" in overrides:
            errors.append(f"{where}: sets num-server-rounds too; the runner sets the rounds of a matched run")
        elif not sources:
            errors.append(
                f"{where}: no [methods] label has its overrides without {MATCH_COMPUTE} ({own}); that equal-rounds "
                "run's FLOPs per round set its rounds, so add it"
            )
        elif sources[0] == reference:
            errors.append(f"{where}: its equal-rounds run is {reference} itself; it would repeat that run")
        else:
            matched[label] = (reference, sources[0])
    for label, overrides in entries.items():
        if MATCH_FLOPS in overrides and MATCH_COMPUTE not in overrides:
            errors.append(f"[methods] {label}: {MATCH_FLOPS} without {MATCH_COMPUTE}; it says which FLOPs are matched")
    return matched, errors


# -- paths in records: portable ------------------------------------------------------------------------------------
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


def make_summary_portable(folder: Path) -> None:
    """The app writes the absolute paths it was given into summary.json (its ServerApp needs them): keep the
    portable forms instead, once the run has ended. Nothing else in the file changes."""
    path = folder / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(summary, dict) and isinstance(summary.get("run_config"), dict):
        portable = portable_run_config(summary["run_config"])
        if portable.get("resume-from"):  # the interrupted copy it continued, beside it: named relative to the folder
            portable["resume-from"] = os.path.relpath(portable["resume-from"], folder)
        if portable != summary["run_config"]:
            write_json(path, {**summary, "run_config": portable}, replace=True)  # the run's own, written by the app


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


def read_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None


def is_finished(folder: Path, record: dict | None) -> bool:
    if record is None or record.get("status") != COMPLETED:
        return False
    try:  # a run that failed after some rounds may still write a summary, with completed: false
        return json.loads((folder / "summary.json").read_text()).get("completed", True) is not False
    except (OSError, ValueError):
        return False


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


class SuiteMismatch(RuntimeError):
    pass


# -- match-compute runs: rounds from the finished runs of their seed ------------------------------------------------
def match_sources_of(run: PlannedRun, runs: list[PlannedRun]) -> tuple[PlannedRun, PlannedRun]:
    """The reference's and the source's runs of ``run``'s seed and cell (``expand`` plans both)."""
    reference, source = run.match
    found = {(r.label, json.dumps(r.cell, sort_keys=True), r.seed): r for r in runs}
    cell = json.dumps(run.cell, sort_keys=True)
    return found[(reference, cell, run.seed)], found[(source, cell, run.seed)]


def flops_per_round(folder: Path, flops: str = "counted") -> list[float]:
    """``client_train_flops`` of each round of a finished run's rounds.csv (their sum is the total that
    ``fl_app.report.total_compute`` reads), or with ``flops = "executed"`` its ``client_train_flops_dense`` where
    the run counted them apart (else the counted ones: it executed what it counted); ValueError naming the file when
    a round did not record it."""
    path = folder / "rounds.csv"
    column = MATCH_FLOPS_COLUMNS[flops]
    table = read_table(path, ("round", MATCHED_COLUMN), (MATCHED_COLUMN, column))
    if column not in table.columns:
        column = MATCHED_COLUMN
    values = table[column].tolist()
    if not values or not all(math.isfinite(v) and v >= 0 for v in values) or math.fsum(values) <= 0:
        raise ValueError(f"{path}: {column} is not recorded (a number >= 0, not all zero) in every round")
    return values


def matched_rounds(reference_total: float, per_round: float) -> int:
    """ceil(reference_total / per_round), at least 1; a quotient within float rounding of a whole number is that
    number (matching a run of the same FLOPs per round must not add a round)."""
    ratio = reference_total / per_round
    return max(1, round(ratio) if math.isclose(ratio, round(ratio), rel_tol=1e-9) else math.ceil(ratio))


def resolve_match(run: PlannedRun, reference: PlannedRun, source: PlannedRun) -> None:
    """Set a match-compute run's num-server-rounds from the finished reference and source runs of its seed, and
    its eval-every; ValueError naming the file or key when they cannot be set."""
    flops_kind = run.match_flops
    reference_total = math.fsum(flops_per_round(reference.folder, flops_kind))
    per_round = flops_per_round(source.folder, flops_kind)
    flops = math.fsum(per_round) / len(per_round)
    rounds = matched_rounds(reference_total, flops)
    # evaluate about as often as the source (every eval-every rounds and after the last: ceil(R / eval-every)
    # evaluations): a run several times longer at the same eval-every would spend that many times the evaluation
    # time, and its curve would have more points than the one it is compared with
    evaluations = math.ceil(source.run_config["num-server-rounds"] / source.run_config["eval-every"])
    eval_every = math.ceil(rounds / evaluations)
    config = {**run.run_config, "num-server-rounds": rounds, "eval-every": eval_every}
    run.run_config = validate_run_config(config).to_dict()
    run.run_config.pop("output-dir")
    run.match_compute = {
        "reference": reference.label,
        "reference_total_flops": reference_total,
        "source": source.label,
        "source_flops_per_round": flops,
        **({"flops": flops_kind} if flops_kind != "counted" else {}),
        "rounds": rounds,
        "eval_every": eval_every,
    }


def match_text(run: PlannedRun) -> str:
    """A match-compute run's rounds, or what it waits for or why it is not run ('' for other runs)."""
    if run.match_compute and run.action != "skip":
        kind = " executed" if run.match_flops == "executed" else ""
        return f"{run.match_compute['rounds']} rounds, the{kind} client training FLOPs of {run.match[0]}"
    return run.reason


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


# -- the suite folder: one suite's runs and tables ------------------------------------------------------------------
def portable_suite_path(path: Path) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else resolved.name


def suite_record(suite: Suite, runs: list[PlannedRun], out: Path) -> dict:
    """OUT/suite.json: what the folder's tables are of."""
    return {
        "suite": portable_suite_path(suite.path),
        "suite_text": suite.path.read_text(),
        "reference": suite.reference,
        "seeds": suite.seeds,
        "methods": suite.methods,
        "base": portable_run_config(suite.base),
        "federation": suite.federation,
        "grid": suite.grid,
        "runs": [
            {"label": r.label, "cell": r.cell, "seed": r.seed, "folder": str(r.folder.relative_to(out))} for r in runs
        ],
    }


def run_key(label: str, cell: dict, seed: int) -> str:
    return f"{label}{cell_suffix(cell)} seed={seed}"


def check_suite_folder(suite: Suite, runs: list[PlannedRun], out: Path) -> None:
    """Refuse a request that would rewrite OUT's tables without runs OUT/suite.json records (a subset of methods or
    seeds, another suite), or against another reference. A request equal to the recorded suite, or one that only
    adds runs (seeds, methods, grid values), is accepted; changed settings of recorded runs are refused run by run
    (``plan``)."""
    try:
        recorded = json.loads((out / "suite.json").read_text())
    except OSError:
        return  # a new folder, or one made before suite.json existed
    except ValueError:
        raise SuiteMismatch(f"{out / 'suite.json'}: not valid JSON; use another --out") from None
    old_runs = {run_key(r["label"], r.get("cell", {}), r["seed"]): r for r in recorded.get("runs", [])}
    new_runs = {run_key(r.label, r.cell, r.seed) for r in runs}
    dropped = [key for key in old_runs if key not in new_runs]
    if not dropped and recorded.get("reference") == suite.reference:
        return
    now = suite_record(suite, runs, out)
    differences = [
        f"{key}: {recorded.get(key)!r} -> {now[key]!r}"
        for key in ("reference", "seeds", "methods", "grid")
        if recorded.get(key) != now[key]
    ]
    if _parsed_toml(recorded.get("suite_text", "")) != _parsed_toml(now["suite_text"]):
        differences.append(f"suite file: {recorded.get('suite')} -> {now['suite']} (settings differ)")
    raise SuiteMismatch(
        f"{out / 'suite.json'} records another suite ({'; '.join(differences) or 'other runs'}). "
        + (
            f"This request would rewrite its tables without {len(dropped)} runs: {', '.join(dropped)}. "
            if dropped
            else ""
        )
        + "Use another --out for a subset or another suite (or remove that suite.json to hand the folder over)."
    )


def _parsed_toml(text: str) -> dict | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def is_committed(out: Path) -> bool:
    """Whether OUT is one of the committed results folders (or the folder holding them)."""
    return Path(out).resolve().is_relative_to(Path(RESULTS).resolve())


def refuse_committed(out: Path, into_committed: bool) -> None:
    if is_committed(out) and not into_committed:
        raise SuiteMismatch(
            f"--out {out}: a committed results folder; running into it rewrites committed files. Train into a new "
            "folder (`verify` compares it with the committed runs), or pass --into-committed to update the committed "
            "results on purpose."
        )


def git_state(root: Path = ROOT) -> tuple[str, bool]:
    """(commit, whether tracked files differ from it); ('unknown', True) outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True


def move_aside(folder: Path) -> Path:
    """Keep an interrupted or failed run's partial files under a new name instead of deleting them."""
    k = next(k for k in itertools.count(1) if not folder.with_name(f"{folder.name}.interrupted-{k}").exists())
    target = folder.with_name(f"{folder.name}.interrupted-{k}")
    folder.rename(target)
    return target


def interrupted_copies(folder: Path) -> list[Path]:
    """The interrupted or failed earlier attempts at ``folder``'s run (``move_aside``), oldest first."""
    copies = folder.parent.glob(f"{folder.name}.interrupted-*")
    numbered = [p for p in copies if p.name.rsplit("-", 1)[1].isdigit()]
    return sorted(numbered, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def checkpoint_round(folder: Path) -> tuple[int | None, str]:
    """(round, '') of the verified checkpoint in ``folder``, or (None, why it cannot be used)."""
    from fl_app.run.checkpoint import load_verified

    path = folder / CHECKPOINT
    if path.is_symlink() or not path.is_file():
        return None, f"no {CHECKPOINT}"
    try:
        saved = load_verified(path, what=str(path))
    except ValueError as error:
        return None, str(error)
    return (saved["round"], "") if isinstance(saved.get("round"), int) else (None, f"{path}: no round recorded")


def resume_point(run: PlannedRun, commit: str) -> tuple[Path | None, int, list[str]]:
    """The interrupted copy of ``run`` to continue from: the one whose checkpoint has the latest round among those
    made with the run's settings (``differing_keys``) at this commit, before the last round. Returns (folder,
    round, why the other copies are not used); (None, 0, ...) when none is usable, so the run starts at round 1.
    The app checks the checkpoint again (content hash, model, run config, federation) before it trains.

    The model-heterogeneous methods keep each client's model in the folder of the run that last trained it, so a
    copy that itself continued another is never continued again (its clients' files are partly in the older copy):
    those methods continue only from a run that started at round 1."""
    best, best_round, skipped = None, 0, []
    for folder in interrupted_copies(run.folder):
        record = read_record(folder)
        if record is None:
            skipped.append(f"{folder.name}: no {RUN_RECORD}")
            continue
        differences = differing_keys(record, run)
        number, why = checkpoint_round(folder)
        if differences:
            why = "other settings: " + "; ".join(differences)
        elif record.get("commit") != commit:
            why = f"made at commit {str(record.get('commit'))[:7]}, this tree is at {commit[:7]}"
        elif record.get("resumed_from") and run.run_config["method"] not in SUPERNET_METHODS:
            why = f"it continued {record['resumed_from']} (client model files lie in both)"
        elif number is not None and number >= run.run_config["num-server-rounds"]:
            why = f"its checkpoint is at the last round ({number})"
        if why:
            skipped.append(f"{folder.name}: {why}")
        elif number >= best_round:
            best, best_round = folder, number
    return best, best_round, skipped


def stop_left_running(runs: list[PlannedRun], out: Path, printer=print) -> None:
    """Before anything trains: a run whose record says it is running was left by a runner that died (SIGKILL, out of
    memory) and its detached SuperLink may still be training it, writing into the folder the runner is about to
    reuse. Stop it (the processes its record names, by pid and start time, and what they spawned) and say so;
    refuse when the runner that owns the record is still alive, or when its processes do not stop."""
    for run in runs:
        record = read_record(run.folder) if run.action in ("train", "pending") else None
        if not record or record.get("status") != RUNNING:
            continue
        where = run.folder / RUN_RECORD
        runner = record.get("runner")
        if isinstance(runner, dict) and runner.get("pid") != os.getpid() and is_alive(runner):
            raise SuiteMismatch(
                f"{where}: runner process {runner.get('pid')} is training this run now; "
                "wait for it to end (or stop it), then run again"
            )
        flower = record.get("flower")
        if not isinstance(flower, dict):
            continue
        left = stop_in_flight(flower)
        if left:
            raise SuiteMismatch(
                f"{where}: the Flower run {flower.get('run_id')} left running did not stop (pids {left})"
            )
        printer(
            f"{run.name} seed={run.seed}: stopped Flower run {flower.get('run_id')}, left running by a runner that "
            f"died, before retrying it ({run.folder.relative_to(out)})",
            flush=True,
        )
        stopped = {k: v for k, v in record.items() if k not in ("flower", "runner")}
        write_json(run.folder / RUN_RECORD, {**stopped, "status": "stopped: its runner died"}, replace=True)


def note_in_flight(folder: Path, flower: dict) -> None:
    """Add to a running run's record what identifies its Flower run (``flower_env.in_flight``); the record written
    when the run ends drops it again."""
    record = read_record(folder) or {}
    write_json(folder / RUN_RECORD, {**record, "flower": flower})


def flower_launcher(env: dict, ray_cpus: int | None = None) -> Callable[[PlannedRun, float], str]:
    """The real launcher: one `flwr run` of the app per run (isolated Flower home in ``env``); the run's record
    names its Flower run while it trains (``stop_left_running``). ``ray_cpus``: the CPUs the run's Ray may use (a
    lane's share of the cores; it caps how many clients train at once, not what they compute)."""
    from experiments.runner.flower_env import in_flight
    from experiments.runner.flower_runs import flwr_run

    def launch(run: PlannedRun, timeout: float) -> str:
        federation = {**run.federation, **({"init-args-num-cpus": ray_cpus} if ray_cpus else {})}
        _, status = flwr_run(
            run.launch_config(),
            federation_text(federation),
            env=env,
            timeout=timeout,
            log_file=run.folder / RUN_LOG,
            started=lambda run_id: note_in_flight(run.folder, in_flight(env, run_id)),
        )
        return status

    return launch


def last_row(path: Path) -> dict:
    """The last row of a CSV the app rewrites after each round ({} while it is missing or unreadable)."""
    rows = _table(path) or []
    return rows[-1] if rows else {}


def accuracy_of(path: Path) -> tuple[float, int] | None:
    """(accuracy, round) of the last evaluation in a run's metrics.csv, from the first of ``ACCURACY_COLUMNS`` it
    has a number in."""
    for row in reversed(_table(path) or []):
        for column in ACCURACY_COLUMNS:
            try:
                value, number = float(row.get(column) or "nan"), int(row["round"])
            except (KeyError, TypeError, ValueError):
                continue
            if not math.isnan(value):
                return value, number
    return None


class Progress:
    """Follows a training run through the rounds.csv and metrics.csv the app rewrites after each round, and prints a
    line for each new round: the round, the last evaluation's accuracy and the ETAs of the run and of the suite.
    ``later(run_seconds)`` gives the seconds the runs after this one will take, given this one's projected length."""

    def __init__(self, run: PlannedRun, where: str, printer, later: Callable[[float], float], every: float):
        self.run, self.where, self.printer, self.later, self.every = run, where, printer, later, every
        self.total = int(run.run_config["num-server-rounds"])
        self.started, self.shown = time.time(), 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name=f"progress {run.name}", daemon=True)

    def __enter__(self) -> "Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.poll()  # rounds that ended since the last look (a short run, or a long interval) are shown too

    def _follow(self) -> None:
        while not self.stop.wait(self.every):
            self.poll()

    def poll(self) -> None:
        try:
            done = int(last_row(self.run.folder / "rounds.csv").get("round", 0))
        except ValueError:
            return
        if done <= self.shown:
            return
        self.shown = done
        elapsed, trained = time.time() - self.started, done - self.run.resumed_after_round
        left = elapsed / trained * (self.total - done) if trained > 0 else math.nan
        accuracy = accuracy_of(self.run.folder / "metrics.csv")
        scored = f"accuracy {100 * accuracy[0]:.1f}% (round {accuracy[1]})" if accuracy else "not evaluated yet"
        self.printer(
            f"{self.where}  round {done}/{self.total}, {scored}, ETA run {duration(left)}, "
            f"suite {duration(left + self.later(elapsed + left))}",
            flush=True,
        )


def duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
        if seconds >= 60
        else f"{seconds}s"
    )


def execute(
    runs: list[PlannedRun],
    out: Path,
    launch: Callable[[PlannedRun, float], str] | list[Callable[[PlannedRun, float], str]] | None,
    run_timeout: float,
    printer=print,
    progress_every: float = 10.0,
    rerun_changed: bool = False,
    ray_cpus: int | None = None,
) -> list[PlannedRun]:
    """Train the runs marked 'train', printing a line as each starts, after each of its rounds (``Progress``, every
    ``progress_every`` seconds at most) and as it ends; returns failures. ``launch`` is one launcher, or a list of
    them: one lane each, the lanes training side by side (each takes the next run in order whose sources, for a
    match-compute run, have ended). Runs left running by a runner that died are stopped first; an interrupted run is
    moved aside and continues from its checkpoint. A pending match-compute run is resolved when it is reached (its
    sources, earlier in ``runs``, have ended); one that cannot run (a source failed, its folder holds a run of other
    settings) is a failure with its reason."""
    launchers = launch if isinstance(launch, list) else [launch]
    commit, dirty = git_state()
    stop_left_running(runs, out, printer)
    state = {"to_train": sum(r.action in ("train", "pending") for r in runs), "trained": 0, "spent": 0.0}
    started, failed, taken, ended = time.time(), [], set(), set()
    turn = threading.Condition()

    def ready(run: PlannedRun) -> bool:
        return run.action != "pending" or all(id(source) in ended for source in match_sources_of(run, runs))

    def train_one(index: int, run: PlannedRun, launch: Callable[[PlannedRun, float], str]) -> None:
        where = f"[{index}/{len(runs)}] {run.label:<18} seed={run.seed} cell={cell_suffix(run.cell)[1:] or '-'}"
        with turn:  # settling a match reads its sources' files and may change the plan: one lane at a time
            if run.action == "pending":
                settle_match(run, runs, out, rerun_changed, failed)
                if run.action == "refuse":
                    run.action = "skip"
                    run.reason = (
                        f"{run.folder.relative_to(out)} holds a finished run with other settings: "
                        f"{'; '.join(run.differences)} (--rerun-changed trains it into a new folder)"
                    )
                if run.action == "train":
                    stop_left_running([run], out, printer)  # its folder is known only now
                else:
                    state["to_train"] -= 1
            if run.match_compute and run.action != "skip":
                printer(f"{where}  {match_text(run)}", flush=True)
            if run.action == "skip":
                printer(f"{where}  NOT RUN: {run.reason}", flush=True)
                failed.append(run)
                return
            if run.action == "reuse":
                printer(f"{where}  reuse {run.folder.relative_to(out)}", flush=True)
                return
        if run.folder.exists():
            run.moved_aside = move_aside(run.folder)
            printer(f"{where}  unfinished earlier run kept as {run.moved_aside.relative_to(out)}", flush=True)
        run.resume_from, run.resumed_after_round, skipped = resume_point(run, commit)
        for reason in skipped:
            printer(f"{where}  not continued from {reason}", flush=True)
        run.folder.mkdir(parents=True)
        record = {
            "label": run.label,
            "cell": run.cell,
            "seed": run.seed,
            "run_config": portable_run_config({**run.run_config, "output-dir": str(run.folder)}),
            "federation": run.federation,
            "data": run.data,
            "commit": commit,
            "dirty": dirty,
            "status": RUNNING,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "log": RUN_LOG,
            "machine": machine_record(len(launchers), ray_cpus),
            **({"match_compute": run.match_compute} if run.match_compute else {}),
            **(
                {"resumed_from": run.resume_from.name, "resumed_after_round": run.resumed_after_round}
                if run.resume_from
                else {}
            ),
        }
        # who trains it, while it trains: a restarted runner tells a dead runner's record from a live one's
        write_json(run.folder / RUN_RECORD, {**record, "runner": process_identity(os.getpid())})
        resumed = (
            f", continuing {run.resume_from.name} after round {run.resumed_after_round}" if run.resume_from else ""
        )
        printer(f"{where}  start (log: {(run.folder / RUN_LOG).relative_to(out)}){resumed}", flush=True)
        t0 = time.time()

        # the runs after this one take the mean of those trained so far (none yet: this one's projected length),
        # spread over the lanes
        def later(run_seconds: float) -> float:
            left = state["to_train"] - state["trained"] - len(launchers)
            mean = state["spent"] / max(state["trained"], 1)
            return max(left, 0) * (mean or run_seconds) / len(launchers)

        try:
            with Progress(run, where, printer, later, progress_every):
                status = launch(run, run_timeout)
        except Exception as error:  # a run that cannot start or times out must not stop the rest of the suite
            status = f"error: {type(error).__name__}: {str(error)[-500:]}"
        elapsed = time.time() - t0
        if status == COMPLETED and not (run.folder / "summary.json").exists():
            status = "error: completed without summary.json"
        make_summary_portable(run.folder)
        machine = {**record["machine"], "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
        write_json(
            run.folder / RUN_RECORD,
            {**record, "machine": machine, "status": status, "elapsed_seconds": round(elapsed, 1)},
        )
        with turn:
            state["trained"], state["spent"] = state["trained"] + 1, state["spent"] + elapsed
            if status != COMPLETED:
                failed.append(run)
            eta = state["spent"] / state["trained"] * (state["to_train"] - state["trained"]) / len(launchers)
            printer(
                f"{where}  {'done' if status == COMPLETED else 'FAILED ' + status} in {duration(elapsed)} "
                f"(suite {duration(time.time() - started)}, ETA {duration(eta)})",
                flush=True,
            )

    def lane(launch: Callable[[PlannedRun, float], str]) -> None:
        while True:
            with turn:
                while True:
                    waiting = [(i, r) for i, r in enumerate(runs, 1) if id(r) not in taken]
                    if not waiting:
                        return
                    chosen = next(((i, r) for i, r in waiting if ready(r)), None)
                    if chosen is not None:
                        taken.add(id(chosen[1]))
                        break
                    turn.wait()
            try:
                train_one(*chosen, launch)
            finally:
                with turn:
                    ended.add(id(chosen[1]))
                    turn.notify_all()

    if len(launchers) == 1:
        lane(launchers[0])
    else:
        threads = [threading.Thread(target=lane, args=(f,), name=f"lane {k}") for k, f in enumerate(launchers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return sorted(failed, key=runs.index)


def lane_cpus(lanes: int, federation: dict, cores: int | None = None) -> int | None:
    """The CPUs each lane's runs may give Ray so that lanes x parallel clients x threads stays within the cores:
    None for one lane (Ray sees every core, as a run started by hand does). Raises ValueError when the suite's
    clients each ask for more CPUs than a lane has (Ray would never schedule them)."""
    cores = cores or os.cpu_count() or 1
    if lanes == 1:
        return None
    if lanes > cores:
        raise ValueError(f"lanes={lanes}: more runs side by side than the {cores} cores; allowed: 1 to {cores}")
    share = cores // lanes
    per_client = federation.get("client-resources-num-cpus", 2)  # Flower's default
    if per_client > share:
        raise ValueError(
            f"lanes={lanes}: each lane has {share} of the {cores} cores, but [federation] "
            f"client-resources-num-cpus={per_client}; allowed: at most {share} (or fewer lanes)"
        )
    return share


def run_suite(
    suite: Path | Suite,
    out: Path,
    rerun_changed: bool = False,
    allow_mixed_commits: bool = False,
    launch: Callable[[PlannedRun, float], str] | None = None,
    printer=print,
    plots: bool = True,
    into_committed: bool = False,
    progress_every: float = 10.0,
    lanes: int | None = None,
) -> dict:
    """Plan (refusing mismatches before any training), train what is missing (``lanes`` runs side by side, else the
    suite's ``lanes``), write and print the tables. One runner at a time per OUT (``suite_lock``); a run folder
    reached through a link inside OUT is refused."""
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    lanes = lanes or suite.lanes
    ray_cpus = lane_cpus(lanes, suite.federation)
    out = Path(out).resolve()
    refuse_committed(out, into_committed)
    with suite_lock(out):
        return _run_locked_suite(
            suite, out, rerun_changed, allow_mixed_commits, launch, printer, plots, progress_every, lanes, ray_cpus
        )


class SuiteBusy(SuiteMismatch):
    pass


@contextlib.contextmanager
def suite_lock(out: Path):
    """Hold OUT's lock file (``LOCK_FILE``, ``flock``) while a runner plans and writes there: a second runner on the
    same OUT is refused at once, before it reads or moves anything. The lock ends with the process, however it
    ends, so a killed runner leaves nothing to clean up."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise SuiteMismatch(
            f"{path}: cannot be opened as the runner's lock ({error.strerror}); nothing was changed"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SuiteBusy(
                f"--out {out}: another runner is writing this suite folder (it holds {LOCK_FILE}); nothing was "
                "read, moved or written; run again when it has ended, or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)


def refuse_links(runs: list[PlannedRun], out: Path) -> None:
    """A link inside OUT on the way to a run folder (runs/, runs/<label>, seed<N>) is refused before anything is
    moved or written: the runner never follows one out of its folder."""
    for run in runs:
        for folder in (run.folder, *interrupted_copies(run.folder)):
            link = first_link(out, folder)
            if link is not None:
                raise SuiteMismatch(
                    f"{link}: a symbolic link inside --out {out}; the runner never follows links in its output "
                    "folder (replace it with a real folder)"
                )


def _run_locked_suite(
    suite: Suite,
    out: Path,
    rerun_changed: bool,
    allow_mixed_commits: bool,
    launch: Callable[[PlannedRun, float], str] | None,
    printer,
    plots: bool,
    progress_every: float,
    lanes: int,
    ray_cpus: int | None,
) -> dict:
    runs = plan(suite, out, rerun_changed)
    refuse_links(runs, out)
    check_suite_folder(suite, runs, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "suite.json", suite_record(suite, runs, out), replace=True)  # check_suite_folder: this suite's
    pending = sum(r.action == "pending" for r in runs)
    printer(
        f"suite {suite.path.name}: {len(runs)} runs ({sum(r.action == 'train' for r in runs)} to train, "
        f"{sum(r.action == 'reuse' for r in runs)} finished earlier"
        + (f", {pending} matching the compute of runs that train first" if pending else "")
        + f") -> {out}",
        flush=True,
    )
    if launch is not None or not any(r.action in ("train", "pending") for r in runs):
        launchers = [launch] * lanes if launch is not None else None
        failed = execute(runs, out, launchers, suite.run_timeout, printer, progress_every, rerun_changed, ray_cpus)
    else:
        from experiments.runner.flower_env import local_flower_env

        with contextlib.ExitStack() as stack:  # one SuperLink (own FLWR_HOME, free ports) per lane for the suite
            launchers = [flower_launcher(stack.enter_context(local_flower_env()), ray_cpus) for _ in range(lanes)]
            failed = execute(runs, out, launchers, suite.run_timeout, printer, progress_every, rerun_changed, ray_cpus)
    if pending:  # the folders of the matched runs are known only now (a .vK with --rerun-changed)
        write_json(out / "suite.json", suite_record(suite, runs, out), replace=True)
    finished = [r for r in runs if r not in failed]
    text = write_suite_tables(
        out,
        [r.folder for r in finished],
        reference=suite.reference,
        allow_mixed_commits=allow_mixed_commits,
        plots=plots,
    )
    printer(text, flush=True)
    not_run = [r for r in failed if r.action == "skip"]
    if not_run:
        printer("runs not run:\n  " + "\n  ".join(f"{r.name} seed={r.seed}: {r.reason}" for r in not_run), flush=True)
    if len(not_run) < len(failed):
        printer(
            "failed runs (moved aside, and continued from their last checkpoint or trained again, on the next "
            "invocation):\n  "
            + "\n  ".join(f"{r.folder.relative_to(out)} (log {RUN_LOG})" for r in failed if r not in not_run),
            flush=True,
        )
    return {"runs": runs, "failed": failed}


# -- verify: retrain runs into a new folder and compare their numbers with the committed ones -----------------------
# columns and keys that measure the machine (time, memory), not the computation: never compared
MEASURED = re.compile(r"seconds|rss|peak|_mb$|^wall|elapsed|started")
# summary.json keys that say how a run was made (continued from a checkpoint), not what it computed
HOW_MADE = ("resumed_after_round",)
COMPARED_FILES = ("metrics.csv", "rounds.csv", "clients.csv", "summary.json")


@dataclass
class Finding:
    file: str
    metric: str
    values: int
    differing: int = 0
    largest: float = 0.0  # largest |new - committed| among numbers
    first: str = ""  # where the first difference is, e.g. "row 3: 0.351 -> 0.352"

    @property
    def equal(self) -> bool:
        return self.differing == 0


def _same(old, new, tolerance: float) -> tuple[bool, float]:
    """(equal, |difference|): numbers equal within ``tolerance`` (relative and absolute; 0 = the same float; NaN
    equals NaN), anything else equal as text."""
    try:
        a, b = float(old), float(new)
    except (TypeError, ValueError):
        return str(old) == str(new), 0.0
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b), 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance) if tolerance else a == b, abs(a - b)


def _leaves(value, where: str = "") -> dict:
    """A JSON value as {'a.b[2].c': leaf}."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _leaves(item, f"{where}.{key}" if where else key).items()
        }
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{where}[{i}]").items()}
    return {where: value}


def _table(path: Path) -> list[dict] | None:
    try:
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError:
        return None


def _summary(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: v for k, v in data.items() if k != "run_config"} if isinstance(data, dict) else None


ABSENT = "<absent>"


def _values(name: str, old, new) -> dict[str, dict[str, tuple]]:
    """metric -> {where: (committed value, new value)} for one file (rows of a CSV by position; summary.json keys
    with list positions folded into one metric, e.g. ``tiers[].accuracy``)."""
    out: dict[str, dict[str, tuple]] = {}
    if name.endswith(".csv"):
        for i in range(max(len(old), len(new))):
            rows = [table[i] if i < len(table) else {} for table in (old, new)]
            for column in dict.fromkeys([*rows[0], *rows[1]]):
                out.setdefault(column, {})[f"row {i + 1}"] = tuple(row.get(column, ABSENT) for row in rows)
    else:
        leaves = [_leaves(side) for side in (old, new)]
        for key in dict.fromkeys([*leaves[0], *leaves[1]]):
            metric = re.sub(r"\[\d+\]", "[]", key)
            out.setdefault(metric, {})[key] = tuple(side.get(key, ABSENT) for side in leaves)
    return out


def compare_run(committed: Path, new: Path, tolerance: float = 0.0) -> tuple[list[Finding], list[str]]:
    """Per file and metric (CSV column, or summary.json key), how many values of the new run differ from the
    committed run's; and the metrics only the new run has (recorded since, not compared). Time and memory
    (``MEASURED``), the round a run was continued after (``HOW_MADE``) and the run config are not compared."""
    findings, added = [], []
    for name in COMPARED_FILES:
        read = _summary if name == "summary.json" else _table
        old, now = read(committed / name), read(new / name)
        if old is None and now is None:
            continue
        if old is None or now is None:
            findings.append(Finding(name, "(file)", 1, 1, math.inf, f"missing in {committed if old is None else new}"))
            continue
        for metric, values in _values(name, old, now).items():
            if MEASURED.search(metric.split(".")[-1]) or metric in HOW_MADE:
                continue
            if all(pair[0] == ABSENT for pair in values.values()):
                added.append(f"{name} {metric}")
                continue
            finding = Finding(name, metric, len(values))
            for where, (before, after) in values.items():
                equal, difference = _same(before, after, tolerance)
                if not equal:
                    finding.differing += 1
                    finding.largest = max(finding.largest, difference)
                    finding.first = finding.first or f"{where}: {before} -> {after}"
            findings.append(finding)
    return findings, added


def report_comparison(pairs: list[tuple[str, Path, Path]], tolerance: float, printer=print) -> bool:
    """Compare (name, committed folder, new folder) pairs and print one line per run and one per differing metric;
    True when every compared value is equal (within ``tolerance``)."""
    rule = "bit-identical (tolerance 0)" if not tolerance else f"equal within {tolerance:g} (relative and absolute)"
    printer(f"comparing {len(pairs)} runs, numbers {rule}; time and memory are not compared", flush=True)
    all_equal = True
    for name, committed, new in pairs:
        findings, added = compare_run(committed, new, tolerance)
        differing = [f for f in findings if not f.equal]
        all_equal &= not differing and bool(findings)
        values = sum(f.values for f in findings)
        verdict = "EQUAL" if not differing and findings else "DIFFERS"
        printer(f"{verdict:<7} {name}: {len(findings)} metrics, {values} values ({committed} vs {new})", flush=True)
        if added:
            printer(f"        not in the committed run, not compared: {', '.join(added)}", flush=True)
        for f in findings:
            if not f.equal:
                printer(
                    f"        {f.file} {f.metric}: {f.differing} of {f.values} differ, largest |diff| {f.largest:.3g};"
                    f" first at {f.first}",
                    flush=True,
                )
    printer("all equal" if all_equal else "some numbers differ", flush=True)
    return all_equal


def verify(
    suite: Suite,
    committed: Path,
    out: Path,
    tolerance: float = 0.0,
    launch: Callable[[PlannedRun, float], str] | None = None,
    printer=print,
) -> bool:
    """Train the suite's runs (usually a few seeds and methods of it) into the new folder OUT and compare their
    numbers with the committed folder's runs of the same settings; True when all are equal."""
    committed, out = Path(committed).resolve(), Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SuiteMismatch(f"--out {out}: exists and is not empty; verify trains into a new (or empty) folder")
    if is_committed(out):
        raise SuiteMismatch(f"--out {out}: in the committed results; verify trains into a new folder outside them")
    try:
        references = plan(suite, committed)
    except SuiteMismatch as error:
        raise SuiteMismatch(f"--committed {committed}: {error}") from None
    missing = [r for r in references if r.action != "reuse"]
    if missing:
        raise SuiteMismatch(
            f"--committed {committed} has no finished run with these settings for: "
            + ", ".join(run_key(r.label, r.cell, r.seed) for r in missing)
        )
    commits = sorted({(read_record(r.folder) or {}).get("commit", "unknown")[:7] for r in references})
    commit, dirty = git_state()
    printer(
        f"committed runs made at commit {', '.join(commits)}; this tree: {commit[:7]}{' (modified)' if dirty else ''}",
        flush=True,
    )
    result = run_suite(suite, out, launch=launch, printer=printer, plots=False)
    if result["failed"]:
        printer("some runs failed: nothing compared for them", flush=True)
    done = [(old, new) for old, new in zip(references, result["runs"]) if new not in result["failed"]]
    for old, new in done:
        changed = machine_differences(
            (read_record(old.folder) or {}).get("machine"), (read_record(new.folder) or {}).get("machine")
        )
        if changed:
            printer(
                f"{run_key(new.label, new.cell, new.seed)}: made on another machine setup ("
                + "; ".join(changed)
                + "). Bit-identical numbers need the same kernels, threads and versions; with these differences "
                "expect the first round to agree to about 1e-5 (relative) and the final accuracy to differ by up "
                "to the seed-to-seed spread, since training amplifies the last bits",
                flush=True,
            )
    equal = report_comparison(
        [(run_key(new.label, new.cell, new.seed), old.folder, new.folder) for old, new in done], tolerance, printer
    )
    return equal and not result["failed"]


def run_folders(out: Path) -> dict[str, Path]:
    """OUT's finished run folders by their place under OUT (runs/<label>[@cell]/seed<N>, or any folder with a
    summary.json); interrupted copies are left out."""
    return {
        str(p.parent.relative_to(out)): p.parent
        for p in sorted(Path(out).rglob("summary.json"))
        if ".interrupted-" not in str(p) and p.parent != out
    }


def compare_folders(committed: Path, new: Path, tolerance: float = 0.0, printer=print) -> bool:
    """Compare every run of NEW with the run at the same place under COMMITTED (for runs made by other tools, e.g.
    experiments.studies.fedtopo_inprocess)."""
    new_runs, old_runs = run_folders(new), run_folders(committed)
    unmatched = [place for place in new_runs if place not in old_runs]
    if not new_runs or unmatched:
        raise SuiteMismatch(
            f"{new}: no run folders to compare" if not new_runs else f"no committed run for: {', '.join(unmatched)}"
        )
    return report_comparison([(place, old_runs[place], new_runs[place]) for place in new_runs], tolerance, printer)


# -- the command line -----------------------------------------------------------------------------------------------
def add_suite_options(command: argparse.ArgumentParser, committed_flag: bool = True) -> None:
    """The options of running a suite (its file aside), shared by ``run``, ``plan``, ``verify`` and the wrapper
    scripts."""
    command.add_argument(
        "--out",
        type=Path,
        required=True,
        help="suite folder (the runner writes only here, never to a default location)",
    )
    command.add_argument(
        "--rerun-changed",
        action="store_true",
        help="train runs whose finished folder has other settings into new folders",
    )
    command.add_argument(
        "--allow-mixed-commits", action="store_true", help="let one table hold runs made at different commits"
    )
    if committed_flag:
        command.add_argument(
            "--into-committed",
            action="store_true",
            help="allow --out in experiments/results/ (updates the committed results)",
        )
    command.add_argument(
        "--seeds", type=comma_list(int, "seeds"), help="seeds replacing the suite's, e.g. 0,1 (unset: the suite's)"
    )
    command.add_argument(
        "--methods",
        type=comma_list(str, "labels"),
        help="the suite's labels (or method names) to run, e.g. feast,fedavg-min (unset: all)",
    )
    command.add_argument(
        "--lanes",
        type=int,
        help="runs trained side by side, each on its share of the cores (unset: the suite's [suite] lanes, else 1)",
    )
    add_run_config_option(command, "run-config values over the suite's [base]")


def add_run_config_option(parser: argparse.ArgumentParser, text: str) -> None:
    """``--run-config "key=value ..."`` (Flower's syntax); read it with ``run_config_of``."""
    parser.add_argument(
        "--run-config", type=run_config_overrides, help=f'{text}, Flower\'s syntax: "num-server-rounds=8 lr=0.1"'
    )


def run_config_of(args: argparse.Namespace) -> dict:
    """The run-config values of ``--run-config`` (none given: {})."""
    return dict(args.run_config or {})


def add_tolerance_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="numbers equal when within this, relative and absolute (default 0: bit-identical, which the same "
        "code and seed give on CPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.runner", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("run", "train what is missing, then write the tables"),
        ("plan", "print what would be reused, trained or refused; trains nothing"),
        ("verify", "train the chosen runs into a new folder and compare their numbers with --committed's"),
    ):
        command = add_command(sub, name, text)
        command.add_argument("suite", type=Path, help="suite file, e.g. experiments/suites/smoke.toml")
        add_suite_options(command, committed_flag=name != "verify")
        if name == "verify":
            command.add_argument(
                "--committed", type=Path, required=True, help="the folder with the runs to compare against"
            )
            add_tolerance_option(command)
    command = add_command(sub, "compare", "compare every run of NEW with the run at the same place under COMMITTED")
    command.add_argument("committed", type=Path, help="folder of the reference runs, e.g. experiments/results/X")
    command.add_argument("new", type=Path, help="folder of the new runs (same runs/<label>/seed<N> layout)")
    add_tolerance_option(command)
    return parser


def suite_parser(module: str, doc: str, ablations: str | None = None) -> argparse.ArgumentParser:
    """The parser of a script that runs one suite of ``SUITES`` (``--ablations``: the file ``ablations``)."""
    parser = tool_parser(module, doc)
    if ablations:
        parser.add_argument("--ablations", action="store_true", help=f"run suites/{ablations} instead")
    add_suite_options(parser)
    return parser


def run_named_suite(
    parser: argparse.ArgumentParser, suite: str, ablations: str | None = None, argv: list[str] | None = None
) -> int:
    """``python -m experiments.runner run SUITES/<suite> ARGV`` (``--ablations``: ``SUITES/<ablations>``), after
    ``parser`` (from ``suite_parser``) has checked ARGV."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    chosen = ablations if getattr(args, "ablations", False) else suite
    return main(["run", str(SUITES / chosen), *(a for a in argv if a != "--ablations")])


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    # a kill (SIGTERM) unwinds like Ctrl-C, so the run in progress is stopped in the SuperLink (flwr_run)
    signal.signal(signal.SIGTERM, _interrupt)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            return 0 if compare_folders(args.committed, args.new, args.tolerance) else 1
        suite = load_suite(args.suite, args.seeds, args.methods, run_config_of(args))
        if args.command == "plan":
            out = args.out.resolve()
            runs = plan(suite, out, args.rerun_changed)
            check_suite_folder(suite, runs, out)
            for run in runs:
                note = match_text(run)
                print(f"{run.action:<6} {run.name} seed={run.seed} -> {run.folder}" + (f" ({note})" if note else ""))
            if is_committed(out):
                print("note: a committed results folder; `run` into it needs --into-committed")
            return 0
        if args.command == "verify":
            return 0 if verify(suite, args.committed, args.out, args.tolerance) else 1
        result = run_suite(
            suite,
            args.out,
            args.rerun_changed,
            args.allow_mixed_commits,
            into_committed=args.into_committed,
            lanes=args.lanes,
        )
    except (SuiteMismatch, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if result["failed"] else 0
