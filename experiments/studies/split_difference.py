"""What a change of data split does to the same runs: two suite folders with the same labels, cells and seeds (e.g.
the γ study under ``partitioner = "gamma"`` and under ``"gamma-class-size"``), compared run by run.

    python -m experiments.studies.split_difference experiments/results/gamma-seeds \\
        experiments/results/gamma-class-size --out experiments/results/gamma-class-size

Reads ``population_weighted_accuracy`` of every ``runs/<label>/seed<N>/summary.json`` present in both folders (the
tier-based score every supernet run records, so folders made before ``client_subnet_accuracy`` existed compare
too) and writes ``split_difference.csv`` (one row per run) and ``split_difference.md`` (one row per label: both
means and the per-seed differences, new minus old) into the ``--out`` folder. Refuses to overwrite either file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.studies.suite_runs import completed_runs
from fl_app.io.cli import tool_parser
from fl_app.run.outputs import write_csv, write_text

KEY = "population_weighted_accuracy"


def accuracies(folder: Path) -> dict[tuple[str, str], float]:
    """(label, seed folder) -> accuracy of every completed run under ``folder/runs`` (interrupted copies left out)."""
    found = {}
    for run in completed_runs(folder / "runs") if (folder / "runs").is_dir() else ():
        if run.summary.get(KEY) is not None:
            found[(run.label, run.folder.name)] = float(run.summary[KEY])
    return found


def compare(old: Path, new: Path) -> tuple[list[dict], list[dict]]:
    """(one row per run, one row per label) for the runs both folders hold."""
    before, after = accuracies(old), accuracies(new)
    shared = sorted(set(before) & set(after))
    if not shared:
        raise ValueError(f"{old} and {new} hold no run of the same label and seed (runs/<label>/seed<N>/summary.json)")
    runs = [
        {"label": label, "seed": seed, "old": before[(label, seed)], "new": after[(label, seed)]}
        for label, seed in shared
    ]
    labels = []
    for label in sorted({r["label"] for r in runs}):
        mine = [r for r in runs if r["label"] == label]
        labels.append(
            {
                "label": label,
                "old": float(np.mean([r["old"] for r in mine])),
                "new": float(np.mean([r["new"] for r in mine])),
                "differences": [r["new"] - r["old"] for r in mine],
                "seeds": [r["seed"] for r in mine],
            }
        )
    return runs, labels


def markdown(labels: list[dict], old: Path, new: Path) -> str:
    lines = [
        f"Tier-based population-weighted accuracy, `{new.name}` against `{old.name}` (same labels and seeds).",
        "",
        f"| run | {old.name} (%) | {new.name} (%) | difference per seed (points) |",
        "| --- | --- | --- | --- |",
    ]
    for row in labels:
        per_seed = " / ".join(f"{100 * d:+.1f}" for d in row["differences"])
        lines.append(f"| {row['label']} | {100 * row['old']:.1f} | {100 * row['new']:.1f} | {per_seed} |")
    return "\n".join(lines) + "\n"


def build_parser():
    parser = tool_parser("experiments.studies.split_difference", __doc__)
    parser.add_argument("old", type=Path, help="suite folder made with the old split")
    parser.add_argument("new", type=Path, help="suite folder made with the new split")
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for split_difference.csv and split_difference.md"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    targets = [args.out / "split_difference.csv", args.out / "split_difference.md"]
    taken = [str(t) for t in targets if t.exists() or t.is_symlink()]
    if taken:
        parser.error(f"--out: {', '.join(taken)} already exist (nothing is overwritten)")
    try:
        runs, labels = compare(args.old, args.new)
    except ValueError as error:
        parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(targets[0], runs)
    text = markdown(labels, args.old, args.new)
    write_text(targets[1], text)
    print(text, end="")


if __name__ == "__main__":
    main()
