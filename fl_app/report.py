"""Read run folders (a suite's, or ``~/fl_app_runs/*``) and print one table; optionally write CSV tables and plots.

    python -m fl_app.report ~/fl_app_runs/*
    python -m fl_app.report /tmp/smoke --reference feast --out /tmp/smoke/report --plots
    python -m fl_app.report --update-readme README.md docs/*.md $(find experiments -name README.md)

Runs that share everything but the seed are one row: the mean over seeds with its 95% t-interval. With
``--reference LABEL`` every other row also gets the paired difference against that label over the seeds both ran.
Each row names the commit(s) its runs were made at; a table of runs from different commits is refused unless
``--allow-mixed-commits`` is given.

Accuracy is the population-weighted accuracy for the supernet methods (each client scored with a tier it can afford,
see the run-config key ``population-tier``) and the mean client accuracy for the model-heterogeneous ones (each
client's own model on its own test split).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from fl_app.run.cli import tool_parser
from fl_app.run.config import KEYS
from fl_app.run.outputs import write_csv
from fl_app.run.stats import Estimate, format_estimate, mean_ci, paired_difference, value_at_budget

# summary key of the headline accuracy, in order of preference
ACCURACY_KEYS = ("population_weighted_accuracy", "mean_client_accuracy")
# run-config keys that do not change what a run computes: ignored when grouping runs into rows
NOT_GROUPED = ("seed", "output-dir", "checkpoint-every", "round-timeout", "resume-from")


def settings(run_config: dict) -> dict:
    """A run config without the keys at their default value.

    Runs are compared through this, so a key added to the registry later, with a default that keeps the old
    behaviour, does not split or invalidate earlier runs; a changed default does show as a difference."""
    return {k: v for k, v in run_config.items() if k not in KEYS or KEYS[k].default != v}


class MixedCommits(ValueError):
    pass


@dataclass
class Run:
    folder: Path
    summary: dict
    record: dict  # the runner's run.json ({} for runs started by hand)
    curve: list[tuple[int, float]] = field(default_factory=list)  # (round, accuracy) at each evaluation
    round_rows: list[dict] = field(default_factory=list)  # rounds.csv

    @property
    def label(self) -> str:
        return self.record.get("label") or self.summary.get("method", "?")

    @property
    def cell(self) -> dict:
        return self.record.get("cell") or {}

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", self.config.get("seed", 0)))

    @property
    def config(self) -> dict:
        """The run config's settings that differ from today's defaults (see ``settings``)."""
        return settings(self.record.get("run_config") or self.summary.get("run_config") or {})

    @property
    def commit(self) -> str:
        commit = self.record.get("commit")
        if not commit:
            return "unrecorded"
        return commit[:7] + ("+modified" if self.record.get("dirty") else "")

    @property
    def accuracy(self) -> float:
        return next((float(self.summary[k]) for k in ACCURACY_KEYS if self.summary.get(k) is not None), math.nan)

    @property
    def accuracy_kind(self) -> str:
        return next((k for k in ACCURACY_KEYS if self.summary.get(k) is not None), ACCURACY_KEYS[0])

    def group_key(self) -> tuple:
        config = {k: v for k, v in self.config.items() if k not in NOT_GROUPED}
        return (
            self.label,
            json.dumps(self.cell, sort_keys=True),
            json.dumps(config, sort_keys=True),
            json.dumps(self.record.get("federation", {}), sort_keys=True),
            self.summary.get("rounds"),
            self.summary.get("num_clients"),
        )

    def compute_curve(self, column: str) -> list[tuple[float, float]]:
        """(cumulative client compute after the round, accuracy) at each evaluated round; [] when unrecorded."""
        if not self.round_rows or column not in self.round_rows[0]:
            return []
        total, cumulative = 0.0, {}
        for row in self.round_rows:
            total += float(row[column] or 0)
            cumulative[int(row["round"])] = total
        return [(cumulative[r], a) for r, a in self.curve if r in cumulative]


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def load_run(folder: Path) -> Run:
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    try:
        record = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        record = {}
    curve = {}
    for row in read_csv(folder / "metrics.csv"):
        for key in ACCURACY_KEYS:
            if row.get(key) not in (None, ""):
                curve[int(row["round"])] = float(row[key])
                break
    return Run(folder, summary, record, sorted(curve.items()), read_csv(folder / "rounds.csv"))


def find_runs(paths: list[Path]) -> list[Run]:
    """Run folders named directly, the current runs of a suite folder (its suite.json), or any summary.json below."""
    folders = []
    for path in map(Path, paths):
        if (path / "summary.json").exists():
            folders.append(path)
        elif (path / "suite.json").exists():
            listed = json.loads((path / "suite.json").read_text())["runs"]
            folders += [path / r["folder"] for r in listed if (path / r["folder"] / "summary.json").exists()]
        else:
            folders += sorted(p.parent for p in path.rglob("summary.json") if ".interrupted-" not in str(p))
    runs = [load_run(f) for f in dict.fromkeys(folders)]
    return [run for run in runs if run.summary.get("completed", True)]  # a failed run's summary says completed: false


@dataclass
class Row:
    runs: list[Run]
    name: str = ""

    @property
    def first(self) -> Run:
        return self.runs[0]

    def by_seed(self, value=lambda run: run.accuracy) -> dict[int, float]:
        return {run.seed: value(run) for run in self.runs}

    def estimate(self, value=lambda run: run.accuracy) -> Estimate:
        return mean_ci([value(run) for run in self.runs])

    @property
    def commits(self) -> str:
        return ", ".join(sorted({run.commit for run in self.runs}))


def group_runs(runs: list[Run]) -> list[Row]:
    """One row per set of runs that differ only in the seed; a row's name is its label and grid cell, plus the
    run-config keys that tell apart rows that would otherwise share a name."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.group_key()].append(run)
    rows = [Row(sorted(members, key=lambda r: r.seed)) for members in groups.values()]
    by_name = defaultdict(list)
    for row in rows:
        cell = ", ".join(f"{k}={v}" for k, v in row.first.cell.items())
        row.name = f"{row.first.label} ({cell})" if cell else row.first.label
        by_name[row.name].append(row)
    for same in (group for group in by_name.values() if len(group) > 1):
        configs = [r.first.config or {"rounds": r.first.summary.get("rounds")} for r in same]
        differing = sorted(
            k
            for k in set().union(*configs)
            if k not in NOT_GROUPED and len({json.dumps(c.get(k)) for c in configs}) > 1
        )
        for row, config in zip(same, configs):
            row.name += " [" + ", ".join(f"{k}={config.get(k)}" for k in differing) + "]"
    return rows


def check_commits(runs: list[Run], allow_mixed: bool) -> None:
    commits = defaultdict(int)
    for run in runs:
        commits[run.commit] += 1
    if len(commits) > 1 and not allow_mixed:
        listed = ", ".join(f"{c} ({n} runs)" for c, n in sorted(commits.items()))
        raise MixedCommits(
            f"these runs were made at different commits: {listed}; rerun them at one commit, or pass "
            "--allow-mixed-commits to put them in one table (each row names its commits)"
        )


def tier_text(run: Run) -> str:
    tiers = run.summary.get("tiers") or []
    if not tiers:
        return "–"
    return "/".join(f"{t['macs'] / 1e6:.2f}" for t in tiers) + "M"


def seeds_text(row: Row) -> str:
    return ",".join(str(run.seed) for run in row.runs)


def accuracy_rows(rows: list[Row]) -> list[dict]:
    table = []
    for row in rows:
        s = row.first.summary
        acc = row.estimate()
        table.append(
            {
                "method": row.name,
                "dataset": s.get("dataset", "?"),
                "rounds": s.get("rounds", "?"),
                "seeds": seeds_text(row),
                "tiers": tier_text(row.first),
                "accuracy": acc.mean,
                "accuracy_ci95": acc.half_width,
                "n": acc.n,
                "accuracy_kind": row.first.accuracy_kind,
                "mb_down": row.estimate(lambda r: r.summary.get("bytes_down", math.nan) / 1e6).mean,
                "mb_up": row.estimate(lambda r: r.summary.get("bytes_up", math.nan) / 1e6).mean,
                "commit": row.commits,
            }
        )
    return table


def paired_rows(rows: list[Row], reference: str) -> list[dict]:
    """Each row against the row of the reference label in the same grid cell, paired by seed."""
    table = []
    for row in rows:
        candidates = [r for r in rows if r.first.label == reference and r.first.cell == row.first.cell]
        if not candidates or row in candidates:
            continue
        # several reference rows (e.g. hand-made runs of two lengths): the one whose settings differ least
        ref = min(candidates, key=lambda r: config_distance(r.first.config, row.first.config))
        paired = paired_difference(row.by_seed(), ref.by_seed())
        table.append(
            {
                "method": row.name,
                "reference": ref.name,
                "difference": paired.difference.mean,
                "difference_ci95": paired.difference.half_width,
                "n": paired.difference.n,
                "wins": paired.wins,
                "verdict": paired.verdict,
            }
        )
    return table


def config_distance(a: dict, b: dict) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b) if k not in NOT_GROUPED)


def tier_rows(rows: list[Row]) -> list[dict]:
    table = []
    for row in rows:
        count = min(len(run.summary.get("tiers") or []) for run in row.runs)
        for i in range(count):
            acc = row.estimate(lambda run, i=i: run.summary["tiers"][i]["accuracy"])
            table.append(
                {
                    "method": row.name,
                    "tier_mmacs": round(row.first.summary["tiers"][i]["macs"] / 1e6, 3),
                    "accuracy": acc.mean,
                    "accuracy_ci95": acc.half_width,
                    "n": acc.n,
                }
            )
    return table


def round_rows(rows: list[Row]) -> list[dict]:
    table = []
    for row in rows:
        rounds = sorted({r for run in row.runs for r, _ in run.curve})
        for rnd in rounds:
            acc = row.estimate(lambda run, rnd=rnd: dict(run.curve).get(rnd, math.nan))
            table.append(
                {"method": row.name, "round": rnd, "accuracy": acc.mean, "accuracy_ci95": acc.half_width, "n": acc.n}
            )
    return table


COMPUTE_COLUMNS = (("client_train_flops", "client training FLOPs"), ("client_seconds", "client seconds"))


def compute_column(runs: list[Run]) -> tuple[str, str] | None:
    """The best compute measure every run recorded per round (analytic FLOPs before seconds)."""
    for column, text in COMPUTE_COLUMNS:
        if runs and all(run.round_rows and column in run.round_rows[0] for run in runs):
            return column, text
    return None


def total_compute(run: Run, column: str) -> float:
    curve = run.compute_curve(column)
    return curve[-1][0] if curve else math.nan


def equal_compute_rows(rows: list[Row], reference: str | None = None) -> tuple[list[dict], str]:
    """Accuracy of every row after a common client compute budget: the reference's total (mean over its seeds)
    when a reference is named, otherwise the least total of any run (so every run has spent it). A row that
    stopped below the budget shows its final accuracy, marked as not having reached the budget."""
    found = compute_column([run for row in rows for run in row.runs])
    if found is None:
        return [], ""
    column, text = found
    totals = [row.estimate(lambda run: total_compute(run, column)) for row in rows]
    references = [t.mean for row, t in zip(rows, totals) if row.first.label == reference and t.n]
    budget = min(references) if references else min(total_compute(run, column) for row in rows for run in row.runs)
    table = []
    for row, total in zip(rows, totals):
        acc = row.estimate(lambda run: value_at_budget(run.compute_curve(column), budget))
        table.append(
            {
                "method": row.name,
                "compute_budget": budget,
                "total_compute": total.mean,
                "reached_budget": total.mean >= budget,
                "accuracy_at_budget": acc.mean,
                "accuracy_at_budget_ci95": acc.half_width,
                "n": acc.n,
            }
        )
    return table, text


def percent(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "–"
    return format_estimate(Estimate(mean, half, 2 if not math.isnan(half) else 1, math.nan))


def markdown(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


def accuracy_markdown(table: list[dict]) -> str:
    kinds = {row["accuracy_kind"] for row in table}
    title = {
        "population_weighted_accuracy": "population-weighted accuracy (%)",
        "mean_client_accuracy": "mean client accuracy (%)",
    }
    acc_header = title[kinds.pop()] if len(kinds) == 1 else "accuracy (%)"
    return markdown(
        ["method", "dataset", "rounds", "seeds", "tiers (MMACs)", acc_header, "MB down", "MB up", "commit"],
        [
            [
                r["method"],
                r["dataset"],
                r["rounds"],
                r["seeds"],
                r["tiers"],
                percent(r["accuracy"], r["accuracy_ci95"]),
                f"{r['mb_down']:.1f}",
                f"{r['mb_up']:.1f}",
                r["commit"],
            ]
            for r in table
        ],
    )


def paired_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "vs", "difference (points)", "seeds won", "verdict"],
        [
            [
                r["method"],
                r["reference"],
                _signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


def _signed(mean: float, half: float) -> str:
    text = percent(mean, half)
    return text if text.startswith("-") else "+" + text


def compute_markdown(table: list[dict], text: str) -> str:
    return markdown(
        ["method", f"total {text}", f"accuracy (%) at {table[0]['compute_budget']:.4g} {text}"],
        [
            [
                r["method"],
                f"{r['total_compute']:.4g}",
                percent(r["accuracy_at_budget"], r["accuracy_at_budget_ci95"])
                + ("" if r["reached_budget"] else " (final; ran out before)"),
            ]
            for r in table
        ],
    )


def report(runs: list[Run], reference: str | None = None, allow_mixed_commits: bool = False) -> dict:
    """Every table of a set of runs: {'accuracy', 'paired', 'tiers', 'rounds', 'compute', 'compute_text'}."""
    if not runs:
        raise ValueError("no finished runs found (a run folder holds summary.json)")
    check_commits(runs, allow_mixed_commits)
    rows = group_runs(runs)
    compute, compute_text = equal_compute_rows(rows, reference)
    return {
        "accuracy": accuracy_rows(rows),
        "paired": paired_rows(rows, reference) if reference else [],
        "tiers": tier_rows(rows),
        "rounds": round_rows(rows),
        "compute": compute,
        "compute_text": compute_text,
        "rows": rows,
    }


def report_text(tables: dict) -> str:
    parts = [accuracy_markdown(tables["accuracy"])]
    if tables["paired"]:
        parts.append(paired_markdown(tables["paired"]))
    if tables["compute"]:
        parts.append(compute_markdown(tables["compute"], tables["compute_text"]))
    parts.append("Means over seeds with 95% t-intervals (±); differences are paired by seed.")
    return "\n\n".join(parts)


def write_tables(out: Path, tables: dict) -> str:
    """table.md (what is printed) and table.csv, paired.csv, tiers.csv, rounds.csv, compute.csv."""
    out.mkdir(parents=True, exist_ok=True)
    text = report_text(tables)
    (out / "table.md").write_text(text + "\n")
    for name in ("accuracy", "paired", "tiers", "rounds", "compute"):
        if tables[name]:
            write_csv(out / ("table.csv" if name == "accuracy" else f"{name}.csv"), tables[name])
    return text


def write_suite_tables(
    out: Path, folders: list[Path], reference: str | None = None, allow_mixed_commits: bool = False, plots: bool = True
) -> str:
    """The runner's last step: tables (and plots) of a suite's finished runs, written into its folder."""
    runs = [load_run(f) for f in folders]
    try:
        tables = report(runs, reference, allow_mixed_commits)
    except (MixedCommits, ValueError) as error:
        return f"no table written: {error}"
    text = write_tables(out, tables)
    if plots:
        write_plots(out, tables)
    return text


# -- plots ---------------------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def write_plots(out: Path, tables: dict) -> list[Path]:
    """accuracy_per_round.png (bands = 95% interval over seeds), accuracy_vs_compute.png, accuracy_vs_macs.png
    (error bars per tier), traffic.png (MB down/up per method)."""
    plt, rows, written = _pyplot(), tables["rows"], []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        points = [r for r in tables["rounds"] if r["method"] == row.name]
        x = [p["round"] for p in points]
        y = [100 * p["accuracy"] for p in points]
        half = [100 * (p["accuracy_ci95"] if not math.isnan(p["accuracy_ci95"]) else 0) for p in points]
        ax.plot(x, y, marker="o", markersize=3, label=row.name)
        ax.fill_between(x, [a - h for a, h in zip(y, half)], [a + h for a, h in zip(y, half)], alpha=0.2)
    ax.set(xlabel="round", ylabel="accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    written.append(out / "accuracy_per_round.png")
    _save(fig, written[-1])

    found = compute_column([run for row in rows for run in row.runs])
    if found:
        column, text = found
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for row in rows:
            for i, run in enumerate(row.runs):
                curve = run.compute_curve(column)
                ax.plot(
                    [c for c, _ in curve],
                    [100 * a for _, a in curve],
                    marker="o",
                    markersize=3,
                    alpha=0.7,
                    color=f"C{rows.index(row) % 10}",
                    label=row.name if i == 0 else None,
                )
        ax.set(xlabel=f"cumulative {text}", ylabel="accuracy (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        written.append(out / "accuracy_vs_compute.png")
        _save(fig, written[-1])

    if tables["tiers"]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for row in rows:
            points = [t for t in tables["tiers"] if t["method"] == row.name]
            if points:
                ax.errorbar(
                    [p["tier_mmacs"] for p in points],
                    [100 * p["accuracy"] for p in points],
                    yerr=[100 * (0 if math.isnan(p["accuracy_ci95"]) else p["accuracy_ci95"]) for p in points],
                    marker="o",
                    capsize=3,
                    label=row.name,
                )
        ax.set_xscale("log")
        ax.set(xlabel="MMACs", ylabel="test accuracy (%)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        written.append(out / "accuracy_vs_macs.png")
        _save(fig, written[-1])

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["method"] for r in tables["accuracy"]]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [r["mb_down"] for r in tables["accuracy"]], width=0.4, label="down")
    ax.bar([i + 0.2 for i in x], [r["mb_up"] for r in tables["accuracy"]], width=0.4, label="up")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="MB per run")
    ax.legend()
    written.append(out / "traffic.png")
    _save(fig, written[-1])
    return written


# -- tables kept in READMEs ----------------------------------------------------------------------------------------
# <!-- report: experiments/results/x/runs --reference feast --table tiers -->  ...generated...  <!-- /report -->
README_BLOCK = re.compile(r"(<!-- report: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)
README_TABLES = {
    "accuracy": lambda t: accuracy_markdown(t["accuracy"]),
    "paired": lambda t: paired_markdown(t["paired"]),
    "tiers": lambda t: tiers_markdown(t["tiers"]),
}


def tiers_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "accuracy (%)", "seeds"],
        [[r["method"], f"{r['tier_mmacs']:.2f}", percent(r["accuracy"], r["accuracy_ci95"]), r["n"]] for r in table],
    )


def readme_block(args_text: str, root: Path) -> str:
    parser = argparse.ArgumentParser(prog="report block", add_help=False)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--reference")
    parser.add_argument("--table", choices=list(README_TABLES), default="accuracy")
    parser.add_argument("--allow-mixed-commits", action="store_true")
    args = parser.parse_args(args_text.split())
    tables = report(find_runs([root / p for p in args.paths]), args.reference, args.allow_mixed_commits)
    return README_TABLES[args.table](tables) + "\n"


def regenerate_readme(text: str, root: Path) -> str:
    """``text`` with every marked block replaced by the table the report tool makes of the committed runs it names
    (paths relative to ``root``, the repository)."""
    return README_BLOCK.sub(lambda m: m.group(1) + readme_block(m.group("args"), root) + m.group(4), text)


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("fl_app.report", __doc__)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, suite folders, or folders holding runs")
    parser.add_argument("--reference", help="label to take paired differences against (unset: no differences)")
    parser.add_argument("--out", type=Path, help="write table.md and the CSV tables here (unset: print only)")
    parser.add_argument("--plots", action="store_true", help="with --out: also write the plots")
    parser.add_argument(
        "--allow-mixed-commits", action="store_true", help="let one table hold runs made at different commits"
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="the paths are markdown files: regenerate their <!-- report: ... --> tables in place",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.update_readme:
        root = Path(__file__).resolve().parents[1]
        for path in args.paths:
            path.write_text(regenerate_readme(path.read_text(), root))
            print(f"updated {path}")
        return 0
    try:
        tables = report(find_runs(args.paths), args.reference, args.allow_mixed_commits)
    except (MixedCommits, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.out:
        print(write_tables(args.out, tables))
        if args.plots:
            for path in write_plots(args.out, tables):
                print(f"wrote {path}")
    else:
        print(report_text(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
