"""Whether a horizon has converged: one method and seed trained to several horizons, runs that differ only in
``num-server-rounds``. Each run decays its learning rate over its own horizon, so a longer run is not the shorter
one continued; the check compares where each ends. A horizon is converged when the run at twice its rounds (or
more) ends within ``--tolerance`` points of it.

    python -m experiments.studies.horizon_check experiments/results/reference-regime/runs/feast/seed0 \\
        experiments/results/reference-regime-1000/runs/feast/seed0 \\
        experiments/results/reference-regime-1000/horizon-2000/runs/feast/seed0 \\
        --out experiments/results/reference-regime-1000/horizon-2000

Prints the table; ``--out`` writes ``horizon_check.csv``, ``.md`` and ``.png`` (accuracy per round, one curve a
horizon); ``--readme FILE`` rewrites FILE's block ``horizon-check`` with the table. The accuracy is client-subnet
accuracy where every run recorded it, else each run's headline accuracy (``fl_app.report``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from fl_app.io.cli import add_readme_option, tool_parser
from fl_app.io.markdown import rewrite_each
from fl_app.report import ReportError, csv_bytes, load_run, markdown, write_files
from fl_app.report.plots import png_bytes, pyplot
from fl_app.report.read import NOT_GROUPED, Run

FILES = ("horizon_check.csv", "horizon_check.md", "horizon_check.png")
BLOCK = "horizon-check"
HORIZON_KEYS = ("num-server-rounds", "eval-every")  # what may differ between the runs of one check


def compared_settings(run: Run) -> dict:
    """The run's settings that must agree across the horizons of one check (``Run.config`` less those that may
    differ)."""
    return {k: v for k, v in run.config.items() if k not in (*NOT_GROUPED, *HORIZON_KEYS)}


def read_horizons(folders: list[Path]) -> list[Run]:
    """The completed runs of ``folders``, shortest horizon first; refused unless they share label, seed and every
    setting apart from ``HORIZON_KEYS`` and have different horizons."""
    if len(folders) < 2:
        raise ReportError(f"{len(folders)} run folder(s) given; allowed: two or more, one per horizon")
    runs = []
    for folder in folders:
        run = load_run(folder)
        if not run.summary.get("completed"):
            raise ReportError(f"{folder / 'summary.json'}: 'completed' is not true; allowed: a finished run")
        runs.append(run)
    first = runs[0]
    same = compared_settings(first)
    for run in runs[1:]:
        if (run.label, run.seed) != (first.label, first.seed):
            raise ReportError(
                f"{run.folder}: label {run.label!r} seed {run.seed}; allowed: those of {first.folder} "
                f"({first.label!r} seed {first.seed})"
            )
        theirs = compared_settings(run)
        differ = sorted(k for k in same.keys() | theirs.keys() if same.get(k) != theirs.get(k))
        if differ:
            shown = ", ".join(f"{k}: {same.get(k)!r} / {theirs.get(k)!r}" for k in differ)
            raise ReportError(
                f"{run.folder}: run config differs from {first.folder} in {shown}; "
                f"allowed: only {', '.join(HORIZON_KEYS)} differ"
            )
    runs.sort(key=lambda r: r.summary["rounds"])
    horizons = [r.summary["rounds"] for r in runs]
    if len(set(horizons)) != len(horizons):
        raise ReportError(f"horizons {horizons}: two runs of one horizon; allowed: one run per horizon")
    return runs


def accuracy_curves(runs: list[Run]) -> tuple[list[list[tuple[int, float]]], bool]:
    """Each run's (round, accuracy) curve, and whether it is client-subnet accuracy (when every run recorded it)."""
    client_subnet = all(r.client_subnet_curve for r in runs)
    curves = [r.client_subnet_curve if client_subnet else r.curve for r in runs]
    for run, points in zip(runs, curves):
        if not points:
            raise ReportError(f"{run.folder / 'metrics.csv'}: no evaluated round")
    return curves, client_subnet


def final_tiers(run: Run) -> str:
    """Each tier's test accuracy (%) at the run's last evaluation with tiers, smallest tier first."""
    if not run.tier_curve:
        return ""
    last = max(r for r, _, _ in run.tier_curve)
    return " / ".join(f"{100 * a:.1f}" for _, _, a in sorted((m, r, a) for r, m, a in run.tier_curve if r == last))


def horizon_rows(runs: list[Run], tolerance: float) -> list[dict]:
    """One row per horizon: its passes, final accuracy and tiers, the change from the next shorter horizon, and its
    verdict against the shortest run of at least twice its rounds ("no 2x run" where none was trained)."""
    curves, client_subnet = accuracy_curves(runs)
    finals = [points[-1][1] for points in curves]
    rows = []
    for i, run in enumerate(runs):
        rounds = run.summary["rounds"]
        longer = next((j for j in range(i + 1, len(runs)) if runs[j].summary["rounds"] >= 2 * rounds), None)
        if longer is None:
            verdict = "no 2x run"
        else:
            change = 100 * (finals[longer] - finals[i])
            within = abs(change) <= tolerance
            verdict = (
                f"{'converged' if within else 'not converged'}: {runs[longer].summary['rounds']} rounds end "
                f"{change:+.1f} points from it ({'within' if within else 'beyond'} {tolerance:g})"
            )
        rows.append(
            {
                "rounds": rounds,
                "passes": round(run.passes, 1) if math.isfinite(run.passes) else math.nan,
                "accuracy": round(finals[i], 6),
                "accuracy_kind": "client_subnet_accuracy" if client_subnet else run.accuracy_kind,
                "tiers": final_tiers(run),
                "change": round(100 * (finals[i] - finals[i - 1]), 2) if i else math.nan,
                "verdict": verdict,
                "commit": run.commit,
            }
        )
    return rows


def render(runs: list[Run], rows: list[dict]) -> str:
    first = runs[0]
    table = markdown(
        ["rounds", "passes", "accuracy (%)", "tiers (%)", "change (points)", "verdict", "commit"],
        [
            [
                r["rounds"],
                f"{r['passes']:.1f}",
                f"{100 * r['accuracy']:.1f}",
                r["tiers"],
                "" if math.isnan(r["change"]) else f"{r['change']:+.1f}",
                r["verdict"],
                r["commit"],
            ]
            for r in rows
        ],
    )
    kind = rows[0]["accuracy_kind"].replace("_", " ")
    return (
        f"{first.label}, seed {first.seed}, trained to each horizon (its learning rate decayed over its own rounds); "
        f"{kind} at each run's last evaluation, tiers smallest first, change from the next shorter horizon:\n\n"
        f"{table}\n"
    )


def figure(runs: list[Run], rows: list[dict]):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    curves, _ = accuracy_curves(runs)
    for points, row in zip(curves, rows):
        ax.plot(
            [r for r, _ in points],
            [100 * a for _, a in points],
            label=f"{row['rounds']} rounds ({row['passes']:.0f} passes)",
        )
    ax.set_xlabel("round")
    ax.set_ylabel(f"{rows[0]['accuracy_kind'].replace('_', ' ')} (%)")
    ax.set_title(f"{runs[0].label}, seed {runs[0].seed}: one run per horizon")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def build_parser():
    parser = tool_parser("experiments.studies.horizon_check", __doc__)
    parser.add_argument("folders", type=Path, nargs="+", help="run folders of one method and seed, one per horizon")
    parser.add_argument(
        "--tolerance", type=float, default=1.0, help="points within which a horizon counts as converged"
    )
    parser.add_argument("--out", type=Path, help="write horizon_check.csv, .md and .png here (unset: print only)")
    add_readme_option(parser, f"block '{BLOCK}'")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    try:
        if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
            raise ReportError(f"--tolerance {args.tolerance!r}; allowed: a finite number of points >= 0")
        runs = read_horizons(args.folders)
        rows = horizon_rows(runs, args.tolerance)
        text = render(runs, rows)
        print(text, end="")
        if args.out:
            plot = png_bytes(figure(runs, rows))
            write_files(args.out, dict(zip(FILES, (csv_bytes(rows), text.encode(), plot))))
        rewrite_each(args.readme, {BLOCK: text})
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return rows


if __name__ == "__main__":
    main()
