"""The runner's command line (``python -m experiments.runner run|plan|verify|report|park|compare``) and the options the
wrapper scripts of one suite share (``suite_parser``, ``run_named_suite``)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import experiments.runner as package
from experiments.runner.comparison import compare_folders
from experiments.runner.execution import park_suite, report_suite, run_suite
from experiments.runner.flower_runs import RunnerStopped
from experiments.runner.matching import match_text
from experiments.runner.planning import plan
from experiments.runner.records import ROOT
from experiments.runner.suite import SuiteMismatch, load_suite
from experiments.runner.suite_folder import check_suite_folder, is_committed
from experiments.runner.verification import verify
from fl_app.io.cli import add_command, comma_list, run_config_overrides, tool_parser

SUITES = ROOT / "experiments" / "suites"


def add_suite_options(command: argparse.ArgumentParser, committed_flag: bool = True, training: bool = True) -> None:
    """The options of running a suite (its file aside), shared by ``run``, ``plan``, ``verify``, ``report`` and the
    wrapper scripts (``training=False``: without the options only training reads)."""
    command.add_argument(
        "--out",
        type=Path,
        required=True,
        help="suite folder (the runner writes only here, never to a default location)",
    )
    if training:
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
    if training:
        command.add_argument(
            "--lanes",
            type=int,
            help="runs trained side by side, each on its share of the cores (unset: the suite's [suite] lanes, else 1)",
        )
        command.add_argument(
            "--cores",
            type=int,
            help="cores the lanes share, e.g. 1 to leave the other core to another runner (unset: all the machine's)",
        )
        command.add_argument(
            "--shared-ray",
            action="store_true",
            help="each lane's runs join one Ray head started for the suite, which saves each run starting and "
            "stopping its own Ray, a few seconds a run; same numbers (default: off)",
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
    parser = tool_parser("experiments.runner", package.__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("run", "train what is missing, then write the tables"),
        ("plan", "print what would be reused, trained or refused; trains nothing"),
        ("verify", "train the chosen runs into a new folder and compare their numbers with --committed's"),
        ("report", "write the tables of the request's finished runs and list the rest; trains nothing"),
        ("park", "move the stopped suite's unfinished runs aside with their checkpoints, ready to be committed"),
    ):
        command = add_command(sub, name, text)
        command.add_argument("suite", type=Path, help="suite file, e.g. experiments/suites/smoke.toml")
        add_suite_options(command, committed_flag=name != "verify", training=name not in ("report", "park"))
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


def shell_path(path: Path) -> str:
    """``path`` relative to the working directory where it lies under it (what a `git add` typed here takes)."""
    path = Path(path)
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


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
        if args.command == "park":
            parked = park_suite(suite, args.out, into_committed=args.into_committed)
            if parked:
                print("commit them with: git add -f " + " ".join(shell_path(p) for p in parked))
            return 0
        if args.command == "report":
            report_suite(suite, args.out, args.allow_mixed_commits, into_committed=args.into_committed)
            return 0
        if args.command == "verify":
            return 0 if verify(suite, args.committed, args.out, args.tolerance, shared_ray=args.shared_ray) else 1
        result = run_suite(
            suite,
            args.out,
            args.rerun_changed,
            args.allow_mixed_commits,
            into_committed=args.into_committed,
            lanes=args.lanes,
            shared_ray=args.shared_ray,
            cores=args.cores,
        )
    except (SuiteMismatch, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, RunnerStopped) as stopped:
        print(
            f"stopped ({stopped or 'Ctrl-C'}): the runs in flight were stopped; the same command continues them from "
            "their last checkpoints (`park` readies them to be committed and continued elsewhere)",
            file=sys.stderr,
        )
        return 130
    return 1 if result["failed"] else 0
