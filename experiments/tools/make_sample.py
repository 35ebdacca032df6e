"""Make the bundled offline CIFAR-10 sample: a stratified subset of ../shared/data/cifar10 in the same parquet schema.

python -m experiments.tools.make_sample --source ../shared/data/cifar10 --train-per-class 2000 --test-per-class 400
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from fl_app.data.images import SAMPLE_DIR
from fl_app.io.cli import print_json, tool_parser


def stratified_rows(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    picked = []
    for k in np.unique(labels):
        rows = np.flatnonzero(labels == k)
        if len(rows) < per_class:
            raise ValueError(f"class {k} has {len(rows)} rows, fewer than --*-per-class={per_class}")
        picked.append(rng.choice(rows, per_class, replace=False))
    return np.sort(np.concatenate(picked))


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.tools.make_sample", __doc__)
    parser.add_argument(
        "--source", type=Path, default=Path("../shared/data/cifar10"), help="CIFAR-10 folder with train/test.parquet"
    )
    parser.add_argument("--out", type=Path, default=SAMPLE_DIR, help="folder of the sample (the bundled one)")
    parser.add_argument("--train-per-class", type=int, default=2000, help="training images per class")
    parser.add_argument("--test-per-class", type=int, default=400, help="test images per class")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stratified draw")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    for split, per_class in (("train", args.train_per_class), ("test", args.test_per_class)):
        table = pq.read_table(args.source / f"{split}.parquet")
        rows = stratified_rows(np.asarray(table.column("label")), per_class, rng)
        subset = table.take(rows)
        pq.write_table(subset, args.out / f"{split}.parquet")  # keeps the HF feature metadata
        report[split] = {"rows": subset.num_rows, "bytes": (args.out / f"{split}.parquet").stat().st_size}
    print_json(report, [{"split": split, **values} for split, values in report.items()])


if __name__ == "__main__":
    main()
