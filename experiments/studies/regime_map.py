"""A method's regime map: in every grid cell of one or more suite folders (one factor of the map each), the method
against one named baseline and against the cell's best other baseline, paired by seed, and whether the cell's
curves have flattened.

    python -m experiments.studies.regime_map experiments/results/fedtopo-regime{,-pat,-data,-arch}/runs \\
        --method fedtopo --against local --allow-mixed-commits --out experiments/results/fedtopo-regime

Writes ``regime_map.csv`` (one line per cell), ``regime_map.md`` (the same as a table) and ``regime_map.png`` (both
differences per cell with their 95% intervals) into ``--out``; ``--readme FILE`` rewrites the one-paragraph reading
of the map between ``<!-- generated:regime-headline -->`` and ``<!-- /generated:regime-headline -->`` in FILE. The
best baseline of a cell is the label other than ``--method`` and ``--against`` with the highest mean accuracy there
over the seeds the method ran (chosen on the same runs it is compared on, so its difference leans in its favour). A
cell is "converged" when every row of it is "flat" in ``fl_app.report``'s convergence table (each seed's last two
evaluations inside each other's seed interval).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from fl_app.io.cli import add_readme_option, tool_parser
from fl_app.io.markdown import rewrite_each
from fl_app.report import (
    MixedCommits,
    ReportError,
    csv_bytes,
    find_runs,
    markdown,
    paired_columns,
    percent,
    report,
    signed,
    write_files,
)
from fl_app.run.stats import paired_difference

FILES = ("regime_map.csv", "regime_map.md", "regime_map.png")
HEADLINE = "regime-headline"  # the generated block ``--readme`` rewrites


def cell_text(cell: dict, folder: str) -> str:
    """A cell's grid values; a suite without a grid is one cell, named by its folder (a control cell's own suite)."""
    return ", ".join(f"{k}={v}" for k, v in cell.items()) or folder


def versus(row, other) -> dict:
    """``row`` minus ``other`` paired by seed, as columns (empty when there is no ``other``)."""
    if other is None:
        return {"difference": math.nan, "difference_ci95": math.nan, "n": 0, "wins": 0, "verdict": "no runs"}
    return paired_columns(paired_difference(row.by_seed(), other.by_seed()))


def mean_over(row, seeds) -> float:
    """``row``'s mean accuracy over the given seeds (-inf when it ran none of them)."""
    values = [value for seed, value in row.by_seed().items() if seed in seeds]
    return math.fsum(values) / len(values) if values else -math.inf


def cell_lines(folder: Path, method: str, against: str, allow_mixed_commits: bool) -> list[dict]:
    """One line per grid cell of ``folder`` where ``method`` has runs."""
    tables = report(find_runs([folder]), method, allow_mixed_commits)
    rows = tables["rows"]
    flat = {r["method"]: r["verdict"] == "flat" for r in tables["convergence"] if r["tier_mmacs"] != r["tier_mmacs"]}
    lines = []
    for row in (r for r in rows if r.first.label == method):
        cell = [r for r in rows if r.first.cell == row.first.cell]
        named = next((r for r in cell if r.first.label == against), None)
        others = [r for r in cell if r.first.label not in (method, against)]
        best = max(others, key=lambda r: mean_over(r, row.by_seed()), default=None)
        accuracy = row.estimate()
        not_flat = sorted(r.first.label for r in cell if not flat.get(r.name, False))
        name = folder.name if folder.name != "runs" else folder.parent.name
        lines.append(
            {
                "folder": name,
                "cell": cell_text(row.first.cell, name),
                "methods": len(cell),
                "seeds": min(r.seeds for r in cell),
                "accuracy": accuracy.mean,
                "accuracy_ci95": accuracy.half_width,
                **{f"vs_{against}_{k}": v for k, v in versus(row, named).items()},
                "best_baseline": best.first.label if best else "",
                **{f"vs_best_{k}": v for k, v in versus(row, best).items()},
                "converged": not not_flat,
                "not_flat": " ".join(not_flat),
            }
        )
    return lines


def regime_map(folders: list[Path], method: str, against: str, allow_mixed_commits: bool = False) -> list[dict]:
    missing = [str(f) for f in folders if not Path(f).is_dir()]
    if missing:
        raise ValueError(f"no such folder: {', '.join(missing)}; allowed: suite folders or folders holding runs")
    lines = [line for folder in folders for line in cell_lines(Path(folder), method, against, allow_mixed_commits)]
    if not lines:
        raise ValueError(f"no finished run of '{method}' in {', '.join(map(str, folders))}")
    return lines


def map_markdown(lines: list[dict], method: str, against: str) -> str:
    return markdown(
        [
            "folder",
            "cell",
            "methods × seeds",
            f"{method} (%)",
            f"vs {against} (points)",
            "seeds won",
            "best other baseline",
            "vs it (points)",
            "seeds won",
            "converged",
        ],
        [
            [
                line["folder"],
                line["cell"],
                f"{line['methods']} × {line['seeds']}",
                percent(line["accuracy"], line["accuracy_ci95"]),
                signed(line[f"vs_{against}_difference"], line[f"vs_{against}_difference_ci95"]),
                f"{line[f'vs_{against}_wins']}/{line[f'vs_{against}_n']}",
                line["best_baseline"] or "–",
                signed(line["vs_best_difference"], line["vs_best_difference_ci95"]),
                f"{line['vs_best_wins']}/{line['vs_best_n']}",
                "yes" if line["converged"] else f"not yet: {line['not_flat']}",
            ]
            for line in lines
        ],
    )


def cells(count: int) -> str:
    return "no cell" if count == 0 else f"{count} cell" + "s" * (count > 1)


def verdict_groups(lines: list[dict], key: str) -> str:
    """Where the method is ahead, behind and level on ``key`` ("vs_local", "vs_best"), in words."""

    def named(group):
        return "; ".join(
            f"{line['cell']} {signed(line[f'{key}_difference'], line[f'{key}_difference_ci95'])}" for line in group
        )

    paired = [line for line in lines if line[f"{key}_n"]]
    ahead = [line for line in paired if line[f"{key}_verdict"] == "better"]
    behind = [line for line in paired if line[f"{key}_verdict"] == "worse"]
    level = [line for line in paired if line not in ahead and line not in behind]
    differences = sorted(paired, key=lambda line: line[f"{key}_difference"])
    parts = [f"ahead beyond the interval in {cells(len(ahead))}" + (f" ({named(ahead)})" if ahead else "")]
    parts.append(f"behind in {cells(len(behind))}" + (f" ({named(behind)})" if behind else ""))
    text = f"level in {cells(len(level))}"
    if level:
        lo, hi = differences[0], differences[-1]
        text += f" (from {named([lo])} to {named([hi])} points)" if lo is not hi else f" ({named(level)})"
    unpaired = len(lines) - len(paired)  # cells whose other baselines have not run yet: counted, not hidden
    missing = f"; no other baseline has run yet in {cells(unpaired)}" if unpaired else ""
    return ", ".join(parts) + ", " + text + missing


def headline(lines: list[dict], method: str, against: str) -> str:
    """The map in one paragraph: where ``method`` gains, where it does not, and how sure (seeds, convergence)."""
    seeds = [line[f"vs_{against}_n"] for line in lines]
    converged = sum(line["converged"] for line in lines)
    gains = [line["cell"] for line in lines if line[f"vs_{against}_verdict"] == line["vs_best_verdict"] == "better"]
    verdict = (
        f"It gains over both in: {'; '.join(gains)}."
        if gains
        else f"No cell shows {method} ahead of {against} and of the best other baseline beyond the interval."
    )
    paired = [line for line in lines if line[f"vs_{against}_n"] > 1]
    if paired:  # how sure: the largest gain over ``against`` the intervals leave room for
        reach = [line[f"vs_{against}_difference"] + line[f"vs_{against}_difference_ci95"] for line in paired]
        at = max(range(len(paired)), key=reach.__getitem__)
        upper, bound = paired[at], 100 * reach[at]
        verdict += (
            f" The intervals leave room for a gain over {against} of at most {bound:+.1f} points ({upper['cell']})."
        )
    # "so far" only while some cell is still short of convergence: a complete map speaks in the present
    where = "(all converged; " if converged == len(lines) else f"so far ({converged} of them converged; "
    return (
        f"Across the {len(lines)} cells of the regime map {where}"
        f"{min(seeds)}{f'-{max(seeds)}' * (max(seeds) > min(seeds))} seeds paired per cell, 95% paired intervals), "
        f"{method} against {against} is "
        f"{verdict_groups(lines, f'vs_{against}')}; against each cell's best other baseline it is "
        f"{verdict_groups(lines, 'vs_best')}. {verdict}"
    )


def figure_map(lines: list[dict], method: str, against: str):
    """Both paired differences per cell, points with 95% intervals, one row per cell."""
    from fl_app.report.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(lines) + 1.6))
    labels = [f"{line['folder']}: {line['cell']} ({line[f'vs_{against}_n']} seeds)" for line in lines]
    for offset, (key, text, colour) in enumerate(
        ((f"vs_{against}", f"{method} − {against}", "tab:blue"), ("vs_best", f"{method} − best other", "tab:orange"))
    ):
        ys = [i + 0.15 - 0.3 * offset for i in range(len(lines))]
        xs = [100 * line[f"{key}_difference"] for line in lines]
        errors = [0.0 if math.isnan(h := line[f"{key}_difference_ci95"]) else 100 * h for line in lines]
        ax.errorbar(xs, ys, xerr=errors, fmt="o", color=colour, capsize=3, label=text)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(lines)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("paired difference (points), 95% interval over seeds")
    ax.set_title(f"{method}: where it gains, cell by cell")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def build_parser():
    parser = tool_parser("experiments.studies.regime_map", __doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="suite folders or folders of runs, one factor each")
    parser.add_argument("--method", required=True, help="the label mapped (e.g. fedtopo)")
    parser.add_argument("--against", required=True, help="the baseline every cell is paired with (e.g. local)")
    parser.add_argument("--allow-mixed-commits", action="store_true", help="as in fl_app.report")
    parser.add_argument("--out", type=Path, help="write regime_map.csv, .md and .png here (unset: print only)")
    add_readme_option(parser, "regime-headline block")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lines = regime_map(args.folders, args.method, args.against, args.allow_mixed_commits)
        text = map_markdown(lines, args.method, args.against)
        print(text)
        if args.out:
            from fl_app.report.plots import png_bytes

            plot = png_bytes(figure_map(lines, args.method, args.against))
            write_files(args.out, dict(zip(FILES, (csv_bytes(lines), (text + "\n").encode(), plot))))
        rewrite_each(args.readme, {HEADLINE: headline(lines, args.method, args.against)})
    except (MixedCommits, ReportError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
