"""Whether a cell of the FedTopo family is a positive control, and FedTopo's verdict in it: every method against a
reference (Local) and one method (FedTopo) against every other, paired by seed, on each score that can see sharing:
the own-distribution mean (each client on its own label mix), the pooled accuracy (HtFLlib's), the accuracy balanced
over each client's held classes, and each client model on a class-balanced sample of the global test set; each at the
last round and at the best round, which the run chose on its validation split (never on test).

    python -m experiments.studies.sharing_scores experiments/results/fedtopo-control \\
        --reference local --method fedtopo --out experiments/results/fedtopo-control

Writes ``sharing_scores.csv`` (one line per comparison, score and round) and ``sharing_scores.md`` (two tables and
the verdict) into ``--out``; ``--readme FILE`` rewrites the block ``sharing-verdict`` in FILE with the verdict
(``--block NAME``: another block, one per cell). A cell counts as a positive control when some baseline beats the
reference by at least ``--margin`` points (default 1) at the lower end of its 95% paired interval on some score; the
score and round that made it one are named.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from experiments.studies.suite_runs import completed_runs
from fl_app.io.cli import add_readme_option, tool_parser
from fl_app.io.markdown import rewrite_each
from fl_app.report import csv_bytes, markdown, signed, write_files
from fl_app.run.stats import PairedDifference, paired_difference

FILES = ("sharing_scores.csv", "sharing_scores.md")
VERDICT = "sharing-verdict"  # the generated block ``--readme`` rewrites
SCORES = {  # summary.json key -> what it measures
    "mean_client_accuracy": "own distribution",
    "pooled_accuracy": "pooled",
    "balanced_accuracy": "balanced over held classes",
    "global_accuracy": "global test",
}
ROUNDS = {"last": "", "best": "best_"}  # the best round is the run's own, chosen on its validation split


def read_runs(folder: Path) -> dict[str, dict[int, dict]]:
    """label -> seed -> summary.json of every completed run under ``folder`` (a suite folder or its ``runs/``)."""
    runs: dict[str, dict[int, dict]] = {}
    for run in completed_runs(folder):
        runs.setdefault(run.label, {})[run.seed] = run.summary
    if not runs:
        raise ValueError(f"{folder}: no completed run (runs/LABEL/seedN/summary.json)")
    return runs


def score_by_seed(runs: dict[int, dict], key: str) -> dict[int, float]:
    """seed -> the score (nan where the run did not record it, e.g. no validation split: no best round)."""
    out = {}
    for seed, summary in runs.items():
        value = summary.get(key)
        out[seed] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    return out


def comparisons(runs: dict[str, dict[int, dict]], reference: str, method: str) -> list[dict]:
    """One line per (label, other, score, round): every label against ``reference``, ``method`` against every
    other label."""
    if reference not in runs:
        raise ValueError(f"--reference {reference!r}: no completed run; allowed: {', '.join(sorted(runs))}")
    pairs = [(label, reference) for label in sorted(runs) if label != reference]
    if method in runs:
        pairs += [(method, label) for label in sorted(runs) if label not in (method, reference)]
    lines = []
    for label, other in pairs:
        for score in SCORES:
            for at, prefix in ROUNDS.items():
                key = prefix + score
                paired = paired_difference(score_by_seed(runs[label], key), score_by_seed(runs[other], key))
                lines.append({"method": label, "vs": other, "score": score, "round": at, **columns(paired)})
    return lines


def columns(paired: PairedDifference) -> dict:
    d = paired.difference
    return {
        "difference": d.mean,
        "difference_ci95": d.half_width,
        "low": d.low,
        "n": d.n,
        "wins": paired.wins,
        "verdict": paired.verdict,
    }


def cell_text(line: dict) -> str:
    if not line["n"]:
        return "–"
    return f"{signed(line['difference'], line['difference_ci95'])} ({line['wins']}/{line['n']})"


def comparison_table(lines: list[dict], keep) -> str:
    """Rows: comparisons kept by ``keep``; columns: each score at the last and at the best round."""
    heads = [(score, at) for score in SCORES for at in ROUNDS]
    header = ["method", "vs"] + [f"{SCORES[score]}, {at} round" for score, at in heads]
    table = {}
    for line in lines:
        if keep(line):
            table.setdefault((line["method"], line["vs"]), {})[(line["score"], line["round"])] = line
    return markdown(
        header, [[m, v] + [cell_text(row[h]) if h in row else "–" for h in heads] for (m, v), row in table.items()]
    )


def controls(lines: list[dict], reference: str, method: str, margin: float) -> list[dict]:
    """The baselines (not ``method``) that beat ``reference`` by >= ``margin`` points at their interval's low end."""
    return [
        line
        for line in lines
        if line["vs"] == reference
        and line["method"] != method
        and line["n"] >= 2
        and not math.isnan(line["low"])
        and 100 * line["low"] >= margin
    ]


def verdict(lines: list[dict], reference: str, method: str, margin: float) -> str:
    """The cell in a few sentences: is it a control (which baseline, score, round), and where ``method`` stands."""
    seeds = max((line["n"] for line in lines), default=0)
    found = controls(lines, reference, method, margin)
    if found:
        named = "; ".join(
            f"{line['method']} on {SCORES[line['score']]} at the {line['round']} round "
            f"{signed(line['difference'], line['difference_ci95'])}"
            for line in found
        )
        head = (
            f"A positive control at {seeds} seeds: some baseline beats {reference} by >= {margin:g} point at the "
            f"low end of its 95% paired interval ({named})."
        )
    else:
        best = max(
            (line for line in lines if line["vs"] == reference and line["method"] != method and line["n"] >= 2),
            key=lambda line: line["low"],
            default=None,
        )
        head = (
            f"Not a positive control at {seeds} seeds: no baseline beats {reference} by >= {margin:g} point at the "
            "low end of its 95% paired interval"
        )
        head += (
            f" (the closest: {best['method']} on {SCORES[best['score']]} at the {best['round']} round "
            f"{signed(best['difference'], best['difference_ci95'])})."
            if best
            else "."
        )
    own = [line for line in lines if line["method"] == method and line["n"] >= 2]
    ahead = sorted({line["vs"] for line in own if line["verdict"] == "better"})
    behind = sorted({line["vs"] for line in own if line["verdict"] == "worse"})
    others = sorted({line["vs"] for line in own})
    level = [label for label in others if label not in ahead and label not in behind]
    if not own:
        return head + f" {method}: fewer than 2 paired seeds."
    return (
        head
        + f" {method}, on the {len(SCORES)} scores at the last and the best round: ahead beyond the interval of "
        + (", ".join(ahead) or "none")
        + " on some score; behind "
        + (", ".join(behind) or "none")
        + " on some score; level on every score with "
        + (", ".join(level) or "none")
        + "."
    )


def report_text(lines: list[dict], reference: str, method: str, margin: float) -> str:
    return "\n\n".join(
        [
            f"Each method minus {reference}, paired by seed (points, 95% interval; seeds won):",
            comparison_table(lines, lambda line: line["vs"] == reference),
            f"{method} minus each other method:",
            comparison_table(lines, lambda line: line["method"] == method and line["vs"] != reference),
            verdict(lines, reference, method, margin),
        ]
    )


def build_parser():
    parser = tool_parser("experiments.studies.sharing_scores", __doc__)
    parser.add_argument("folder", type=Path, help="a FedTopo-family suite folder (or its runs/)")
    parser.add_argument("--reference", default="local", help="the label every method is paired with (default local)")
    parser.add_argument("--method", default="fedtopo", help="the label paired with every other (default fedtopo)")
    parser.add_argument("--margin", type=float, default=1.0, help="points a control must clear at its low end")
    parser.add_argument("--out", type=Path, help="write sharing_scores.csv and .md here (unset: print only)")
    add_readme_option(parser, "--block block")
    parser.add_argument(
        "--block",
        default=VERDICT,
        help=f"the generated block --readme rewrites (default {VERDICT})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lines = comparisons(read_runs(args.folder), args.reference, args.method)
        text = report_text(lines, args.reference, args.method, args.margin)
        print(text)
        if args.out:
            write_files(args.out, dict(zip(FILES, (csv_bytes(lines), (text + "\n").encode()))))
        rewrite_each(args.readme, {args.block: verdict(lines, args.reference, args.method, args.margin)})
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
