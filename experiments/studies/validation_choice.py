"""Which setting of a tuning suite the validation split chooses, never the test set: for each grid cell (and label),
the validation accuracy each run recorded at its evaluations in the second half of its rounds, averaged over those
evaluations and then over seeds; the highest is chosen. One late evaluation on a few hundred validation images is
noisy, so the mean over the second half ranks settings by where they settle rather than by one reading.

    python -m experiments.studies.validation_choice experiments/results/fedtopo-control-scarce-tuning \\
        --out experiments/results/fedtopo-control-scarce-tuning

Writes ``validation_choice.csv`` (one line per setting) and ``validation_choice.md`` (the table and the choice) into
``--out``; ``--readme FILE`` rewrites the block ``validation-choice`` in FILE with the table and the choice. Test
accuracies are not read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.studies.suite_runs import completed_runs
from fl_app.io.cli import add_readme_option, tool_parser
from fl_app.io.markdown import rewrite_each
from fl_app.report import ReportError, csv_bytes, markdown, write_files
from fl_app.report.read import KINDS, read_json

FILES = ("validation_choice.csv", "validation_choice.md")
BLOCK = "validation-choice"


def finished_runs(folder: Path) -> list[tuple[str, int, dict, Path]]:
    """(setting, seed, summary, its path) of every completed run under ``folder`` (a suite folder or its runs/); the
    setting is the runner's label and grid cell (run.json)."""
    runs = []
    for run in completed_runs(folder):
        record = read_json(run.folder / "run.json", {"label": "text", "seed": "whole", "cell": "object"})
        missing = [key for key in ("label", "seed") if key not in record]
        if missing:
            raise ReportError(f"{run.folder / 'run.json'}: no {' or '.join(map(repr, missing))} (the runner's record)")
        cell = record.get("cell") or {}
        setting = " ".join([record["label"], *(f"{k}={v}" for k, v in sorted(cell.items()))])
        runs.append((setting, record["seed"], run.summary, run.folder / "summary.json"))
    if not runs:
        raise ReportError(f"{folder}: no completed run (a summary.json with a run.json beside it)")
    return runs


def late_validation(summary: dict, where: Path) -> float:
    """The mean validation accuracy over the run's evaluations after half of its rounds."""
    history = summary.get("history")
    rounds = summary.get("rounds")
    if not isinstance(history, list) or not isinstance(rounds, int) or rounds < 1:
        raise ReportError(f"{where}: needs 'rounds' (a whole number) and 'history' (a list of evaluations)")
    values = []
    for entry in history:
        value = entry.get("validation_accuracy") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("round"), int):
            raise ReportError(f"{where}: every 'history' entry needs a whole 'round'")
        if entry["round"] * 2 <= rounds:
            continue
        is_fraction, _ = KINDS["fraction"]  # the report's own check of an accuracy (a bool is no number)
        if value is None or not is_fraction(value):
            raise ReportError(
                f"{where}: round {entry['round']}: 'validation_accuracy' is {value!r}; allowed: a number in [0, 1]"
            )
        values.append(float(value))
    if not values:
        raise ReportError(f"{where}: no evaluation with a validation accuracy after round {rounds // 2}")
    return sum(values) / len(values)


def choose(runs: list[tuple[str, int, dict, Path]]) -> tuple[list[dict], dict]:
    """One row per setting (its seeds, per-seed and mean late validation accuracy), best first, and the chosen row.
    Settings must have run the same seeds, so that none is ranked on luckier partitions."""
    by_setting: dict[str, dict[int, float]] = {}
    for setting, seed, summary, path in runs:
        by_setting.setdefault(setting, {})[seed] = late_validation(summary, path)
    seed_sets = {name: sorted(seeds) for name, seeds in by_setting.items()}
    if len({tuple(s) for s in seed_sets.values()}) > 1:
        raise ReportError(f"the settings ran different seeds: {seed_sets}; allowed: the same seeds for every setting")
    rows = [
        {
            "setting": name,
            "seeds": " ".join(map(str, sorted(seeds))),
            "per_seed": " ".join(f"{100 * seeds[s]:.2f}" for s in sorted(seeds)),
            "late_validation": sum(seeds.values()) / len(seeds),
        }
        for name, seeds in by_setting.items()
    ]
    rows.sort(key=lambda row: (-row["late_validation"], row["setting"]))
    return rows, rows[0]


def render(rows: list[dict], chosen: dict) -> str:
    table = markdown(
        ["setting", "seeds", "validation accuracy per seed (%)", "mean (%)"],
        [[r["setting"], r["seeds"], r["per_seed"], f"{100 * r['late_validation']:.2f}"] for r in rows],
    )
    gap = ""
    if len(rows) > 1:
        gap = f", {100 * (chosen['late_validation'] - rows[1]['late_validation']):.2f} points above the next"
    return (
        "Mean validation accuracy over each run's evaluations in its second half, then over seeds (test accuracy not "
        f"read):\n\n{table}\n\nChosen on validation: **{chosen['setting']}** ({100 * chosen['late_validation']:.2f} %"
        f"{gap}).\n"
    )


def build_parser():
    parser = tool_parser("experiments.studies.validation_choice", __doc__)
    parser.add_argument("folder", type=Path, help="a tuning suite folder (or its runs/)")
    parser.add_argument("--out", type=Path, help="write validation_choice.csv and .md here (unset: print only)")
    add_readme_option(parser, f"block '{BLOCK}'")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    try:
        rows, chosen = choose(finished_runs(args.folder))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    text = render(rows, chosen)
    print(text, end="")
    try:
        if args.out:
            table = csv_bytes([{**r, "late_validation": round(r["late_validation"], 6)} for r in rows])
            write_files(args.out, dict(zip(FILES, (table, text.encode()))))
        rewrite_each(args.readme, {BLOCK: text})
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return rows


if __name__ == "__main__":
    main()
