"""Run a suite of experiments: every (method, grid cell, seed) of a suite file is one `flwr run` of the app.

    python -m experiments.runner run experiments/suites/smoke.toml --out /tmp/smoke
    python -m experiments.runner plan experiments/suites/smoke.toml --out /tmp/smoke     # what would run, no training

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
    [grid]                       # optional: every combination of these values is one cell
    gamma = [0.0, 1.0]

Each run lives in ``OUT/runs/<label>[@cell]/seed<N>/``: the app's own outputs, ``run.log`` (the live `flwr run`
output) and ``run.json`` (full run config, federation, seed, commit, modified-tree flag, status, elapsed time).
A finished run is reused only when its run config, federation and seed equal the request; any other finished run in
the way is refused with the differing keys named, before anything trains (``--rerun-changed`` trains the changed
runs into new folders ``seed<N>.v2``, ... and keeps the old ones). An interrupted or failed run is moved aside
(``seed<N>.interrupted-K``) and trained again, so a stopped suite resumes where it stopped. At the end the suite's
tables (means with 95% t-intervals over seeds, paired differences against the reference) are written by
``fl_app.report`` into OUT and printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fl_app.report import settings, write_suite_tables
from fl_app.run.cli import add_command, comma_list, run_config_overrides, tool_parser
from fl_app.run.config import METHODS, validate_run_config
from fl_app.run.outputs import write_json

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "experiments" / "suites"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "cifar10"  # the real CIFAR-10 beside the checkout
RUN_RECORD = "run.json"
RUN_LOG = "run.log"
COMPLETED = "finished:completed"
# keys that say where and how a run is kept, not what it computes: never part of the reuse comparison
NOT_COMPARED = ("output-dir",)
SUITE_SECTIONS = ("suite", "base", "federation", "methods", "grid")
SUITE_KEYS = ("seeds", "reference", "run-timeout", "description", "base-file")


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
        if not isinstance(overrides, dict):
            errors.append(f"[methods] {label}: expected a table of run-config overrides, e.g. {label} = {{}}")
        elif "method" not in overrides and label not in METHODS:
            errors.append(f"[methods] {label}: not a method name, so it must set method = one of {list(METHODS)}")
        elif any(k in overrides for k in ("seed", "output-dir")):
            errors.append(f"[methods] {label}: seed and output-dir are set by the runner")
    grid = raw.get("grid", {})
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            errors.append(f"[grid] {key}: expected a non-empty list of values")
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
    reference = head.get("reference")
    if reference is not None and reference not in methods:
        errors.append(f"[suite] reference='{reference}': must be one of the [methods] labels {list(methods)}")
    if errors:
        raise ValueError(f"invalid suite {path}:\n  " + "\n  ".join(errors))
    if isinstance(base.get("data-path"), str) and base["data-path"] and not Path(base["data-path"]).is_absolute():
        base = {**base, "data-path": str((ROOT / base["data-path"]).resolve())}
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
    )


@dataclass
class PlannedRun:
    label: str
    cell: dict
    seed: int
    run_config: dict  # validated, complete, without output-dir
    federation: dict
    folder: Path = None
    action: str = ""  # "reuse", "train", or "refuse"
    differences: list[str] = field(default_factory=list)
    moved_aside: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.label}{cell_suffix(self.cell)}"


def cell_suffix(cell: dict) -> str:
    return "@" + ",".join(f"{k}={v}" for k, v in cell.items()) if cell else ""


def cells(grid: dict[str, list]) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def expand(suite: Suite) -> list[PlannedRun]:
    """Every run of the suite, seed by seed (so a stopped suite has whole seeds first), validated before any run."""
    runs = []
    for seed in suite.seeds:
        for label, overrides in suite.methods.items():
            for cell in cells(suite.grid):
                method = {"method": label} if label in METHODS else {}
                request = {**suite.base, **cell, **method, **overrides, "seed": seed}
                try:
                    config = validate_run_config(request).to_dict()
                except ValueError as error:
                    raise ValueError(f"{label}{cell_suffix(cell)} seed={seed}: {error}") from None
                for key in NOT_COMPARED:
                    config.pop(key)
                runs.append(PlannedRun(label, cell, seed, config, dict(suite.federation)))
    return runs


def federation_text(federation: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in federation.items())


def differing_keys(recorded: dict, run: PlannedRun) -> list[str]:
    """'key: recorded -> requested' for every difference in run config, federation and seed (keys at their
    default on both sides, e.g. added to the registry after the run, are equal)."""
    out = []
    old_config = {k: v for k, v in settings(recorded.get("run_config", {})).items() if k not in NOT_COMPARED}
    for scope, old, new in (
        ("", old_config, settings(run.run_config)),
        ("federation.", recorded.get("federation", {}), run.federation),
    ):
        for key in sorted(set(old) | set(new)):
            if old.get(key, "<default>") != new.get(key, "<default>"):
                out.append(f"{scope}{key}: {old.get(key, '<default>')!r} -> {new.get(key, '<default>')!r}")
    if recorded.get("seed") != run.seed:
        out.append(f"seed: {recorded.get('seed')!r} -> {run.seed!r}")
    return out


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


def decide(run: PlannedRun, out: Path, rerun_changed: bool) -> None:
    """Choose the run's folder and action: reuse an exact match, train a missing or interrupted run, or refuse."""
    home = out / "runs" / f"{run.label}{cell_suffix(run.cell)}" / f"seed{run.seed}"
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
    runs = expand(suite)
    for run in runs:
        decide(run, out, rerun_changed)
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


def flower_launcher(env: dict) -> Callable[[PlannedRun, float], str]:
    """The real launcher: one `flwr run` of the app per run (isolated Flower home in ``env``)."""
    from experiments.flower_runs import flwr_run

    def launch(run: PlannedRun, timeout: float) -> str:
        _, status = flwr_run(
            {**run.run_config, "output-dir": str(run.folder)},
            federation_text(run.federation),
            env=env,
            timeout=timeout,
            log_file=run.folder / RUN_LOG,
        )
        return status

    return launch


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
    launch: Callable[[PlannedRun, float], str] | None,
    run_timeout: float,
    printer=print,
) -> list[PlannedRun]:
    """Train the runs marked 'train' (one at a time), printing a line as each starts and ends; returns failures."""
    commit, dirty = git_state()
    to_train = sum(r.action == "train" for r in runs)
    started, trained, spent, failed = time.time(), 0, 0.0, []
    for index, run in enumerate(runs, 1):
        where = f"[{index}/{len(runs)}] {run.label:<18} seed={run.seed} cell={cell_suffix(run.cell)[1:] or '-'}"
        if run.action == "reuse":
            printer(f"{where}  reuse {run.folder.relative_to(out)}", flush=True)
            continue
        if run.folder.exists():
            run.moved_aside = move_aside(run.folder)
            printer(f"{where}  unfinished earlier run kept as {run.moved_aside.relative_to(out)}", flush=True)
        run.folder.mkdir(parents=True)
        record = {
            "label": run.label,
            "cell": run.cell,
            "seed": run.seed,
            "run_config": {**run.run_config, "output-dir": str(run.folder)},
            "federation": run.federation,
            "commit": commit,
            "dirty": dirty,
            "status": "running",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "log": RUN_LOG,
        }
        write_json(run.folder / RUN_RECORD, record)
        printer(f"{where}  start (log: {(run.folder / RUN_LOG).relative_to(out)})", flush=True)
        t0 = time.time()
        try:
            status = launch(run, run_timeout)
        except Exception as error:  # a run that cannot start or times out must not stop the rest of the suite
            status = f"error: {type(error).__name__}: {str(error)[-500:]}"
        elapsed = time.time() - t0
        trained, spent = trained + 1, spent + elapsed
        if status == COMPLETED and not (run.folder / "summary.json").exists():
            status = "error: completed without summary.json"
        write_json(run.folder / RUN_RECORD, {**record, "status": status, "elapsed_seconds": round(elapsed, 1)})
        if status != COMPLETED:
            failed.append(run)
        eta = spent / trained * (to_train - trained)
        printer(
            f"{where}  {'done' if status == COMPLETED else 'FAILED ' + status} in {duration(elapsed)} "
            f"(suite {duration(time.time() - started)}, ETA {duration(eta)})",
            flush=True,
        )
    return failed


def run_suite(
    suite: Path | Suite,
    out: Path,
    rerun_changed: bool = False,
    allow_mixed_commits: bool = False,
    launch: Callable[[PlannedRun, float], str] | None = None,
    printer=print,
    plots: bool = True,
) -> dict:
    """Plan (refusing mismatches before any training), train what is missing, write and print the tables."""
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    out = Path(out).resolve()
    runs = plan(suite, out, rerun_changed)
    out.mkdir(parents=True, exist_ok=True)
    write_json(
        out / "suite.json",
        {
            "suite": str(suite.path),
            "suite_text": suite.path.read_text(),
            "reference": suite.reference,
            "seeds": suite.seeds,
            "methods": suite.methods,
            "base": suite.base,
            "grid": suite.grid,
            "runs": [
                {"label": r.label, "cell": r.cell, "seed": r.seed, "folder": str(r.folder.relative_to(out))}
                for r in runs
            ],
        },
    )
    printer(
        f"suite {suite.path.name}: {len(runs)} runs ({sum(r.action == 'train' for r in runs)} to train, "
        f"{sum(r.action == 'reuse' for r in runs)} finished earlier) -> {out}",
        flush=True,
    )
    if launch is not None or not any(r.action == "train" for r in runs):
        failed = execute(runs, out, launch, suite.run_timeout, printer)
    else:
        from experiments.flower_env import local_flower_env

        with local_flower_env() as env:  # one SuperLink (own FLWR_HOME, free ports) for the whole suite
            failed = execute(runs, out, flower_launcher(env), suite.run_timeout, printer)
    finished = [r for r in runs if r not in failed]
    text = write_suite_tables(
        out,
        [r.folder for r in finished],
        reference=suite.reference,
        allow_mixed_commits=allow_mixed_commits,
        plots=plots,
    )
    printer(text, flush=True)
    if failed:
        printer(
            "failed runs (moved aside and trained again on the next invocation):\n  "
            + "\n  ".join(f"{r.folder.relative_to(out)} (log {RUN_LOG})" for r in failed),
            flush=True,
        )
    return {"runs": runs, "failed": failed}


def add_suite_options(command: argparse.ArgumentParser) -> None:
    """The options of running a suite (its file aside), shared by ``run``, ``plan`` and the wrapper scripts."""
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
    command.add_argument(
        "--seeds", type=comma_list(int, "seeds"), help="seeds replacing the suite's, e.g. 0,1 (unset: the suite's)"
    )
    command.add_argument(
        "--methods",
        type=comma_list(str, "labels"),
        help="the suite's labels (or method names) to run, e.g. feast,fedavg-min (unset: all)",
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


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.runner", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("run", "train what is missing, then write the tables"),
        ("plan", "print what would be reused, trained or refused; trains nothing"),
    ):
        command = add_command(sub, name, text)
        command.add_argument("suite", type=Path, help="suite file, e.g. experiments/suites/smoke.toml")
        add_suite_options(command)
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
    overrides = run_config_of(args)
    try:
        suite = load_suite(args.suite, args.seeds, args.methods, overrides)
        if args.command == "plan":
            for run in plan(suite, args.out.resolve(), args.rerun_changed):
                print(f"{run.action:<6} {run.name} seed={run.seed} -> {run.folder}")
            return 0
        result = run_suite(suite, args.out, args.rerun_changed, args.allow_mixed_commits)
    except (SuiteMismatch, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
