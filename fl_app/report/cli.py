"""Read run folders (a suite's, or ``~/fl_app_runs/*``) and print one table; optionally write CSV tables and plots.

    python -m fl_app.report ~/fl_app_runs/*
    python -m fl_app.report /tmp/smoke --reference feast --out /tmp/smoke/report --plots
    python -m fl_app.report RUN_FOLDER --clients --out DIR      # each client's labels and budget (reads the data)
    python -m fl_app.report --update-readme README.md docs/*.md $(find experiments -name README.md)

Runs that share everything but the seed are one row: the mean over seeds with its 95% t-interval. With
``--reference LABEL`` every other row also gets the paired difference against that label over the seeds both ran.
Each row names the commit(s) its runs were made at; a table of runs from different commits is refused unless
``--allow-mixed-commits`` is given. A quantity a run did not record (e.g. client seconds that are all zero) gets no
table and no plot.

Accuracy is the population-weighted accuracy for the supernet methods (each client scored with a tier it can afford,
see the run-config key ``population-tier``) and the mean client accuracy for the model-heterogeneous ones (each
client's own model on its own test split). When every run of a table recorded ``client_subnet_accuracy`` (each client
scored with its own largest affordable cached subnet), the table uses that instead, for all of its runs.

Runs the suite runner trained to another label's client training compute (``match-compute``, see
``experiments.runner``; their run.json has ``match_compute``) also get the matched-compute table (``matched.csv``):
their compute relative to that label's runs and their final accuracy against its own, paired by seed.

Whether a run has converged (``convergence.csv``): per row, and per tier of a supernet row, the last two evaluations
over seeds, the change between them paired by seed, and "flat" when each mean lies inside the other's seed interval.

How long a run trained (the README table ``passes``): its passes over the images its clients hold, from each client's
answered rounds and partition size in clients.csv and the run's local-training keys.

What a run costs on each machine (the README table ``machine-time``): per row and processor (model, cores, widest
vector extension, from the machine records of run.json and of the parked copies a run continued, ``earlier_segments``),
the rounds trained there, their mean wall seconds (rounds.csv ``seconds``) and the hours a seed takes at that rate.

Every file read is checked: a malformed field (``completed`` not a boolean, a summary that is not an object, a
metrics.csv without its columns, text where a number belongs) is an error that names the file, not a count. Files
are written through ``fl_app.io.files.replace_file``: a symlink at an output name is refused, never written through.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fl_app.io.cli import tool_parser
from fl_app.report.read import MixedCommits, find_runs
from fl_app.report.readme import README_TABLES, regenerate_readme
from fl_app.report.tables import report
from fl_app.report.text import report_text
from fl_app.report.writing import client_plot, stale_files, write_file, write_plots, write_tables


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("fl_app.report", __doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, suite folders, or folders holding runs")
    parser.add_argument("--reference", help="label to take paired differences against (unset: no differences)")
    parser.add_argument("--out", type=Path, help="write table.md and the CSV tables here (unset: print only)")
    parser.add_argument("--plots", action="store_true", help="with --out: also write the plots")
    parser.add_argument(
        "--table",
        choices=list(README_TABLES),
        help="print only this table as markdown: what a README's generated:report block holds (unset: all tables)",
    )
    parser.add_argument(
        "--clients",
        action="store_true",
        help="with --out: the paths are run folders; plot each client's labels and budget (reads the run's data)",
    )
    parser.add_argument(
        "--allow-mixed-commits", action="store_true", help="let one table hold runs made at different commits"
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="the paths are markdown files: regenerate their <!-- generated:report (COMMAND) --> tables in place",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.update_readme:
            root = Path(__file__).resolve().parents[2]
            for path in args.paths:
                text = path.read_text()
                updated = regenerate_readme(text, root)
                if updated != text:
                    write_file(path, updated.encode())
                print(f"{'updated' if updated != text else 'unchanged'} {path}")
            return 0
        if args.clients:
            if not args.out:
                raise ValueError("--clients writes plots: give --out DIR")
            for folder in args.paths:
                print(f"wrote {client_plot(folder, args.out)}")
            return 0
        tables = report(find_runs(args.paths), args.reference, args.allow_mixed_commits)
        if args.table:
            print(README_TABLES[args.table](tables))
            return 0
        if not args.out:
            print(report_text(tables))
            return 0
        print(write_tables(args.out, tables))
        plotted = write_plots(args.out, tables) if args.plots else None
        for path in plotted or []:
            print(f"wrote {path}")
        for path in stale_files(args.out, tables, plotted):
            print(f"note: {path} is left from an earlier report (this one has nothing to put there)", file=sys.stderr)
    except (MixedCommits, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
