"""Nearest-prototype accuracy of finished FedProto and FedTGP runs: the score HtFLlib (and so the FedTGP paper)
reports for these two methods, beside the head's accuracy this project reports for every method.

    python -m experiments.studies.prototype_accuracy RUN_FOLDER [RUN_FOLDER ...] [--out DIR]

A run folder must still hold its ``checkpoint.pt`` and ``client-models/`` (the runner keeps them; they are not
committed). Each client's model of the last round is scored on its own test split twice: by the head (which must
give the run's own recorded per-client accuracy exactly, else the folder is refused: the data or the code no longer
matches the run), and by the global prototype nearest to its feature in mean squared distance (HtFLlib's
``test_metrics`` of FedProto and FedTGP), the candidates being the classes the server's last global prototypes hold.
Those prototypes are the checkpoint's: what the server would have broadcast next, as HtFLlib evaluates with the
prototypes received at the start of a round. Prints one line per run and, with ``--out``, writes
``prototype_accuracy.csv`` there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from clients.fedtopo import embed, evaluate
from fl_app.data.images import DATASETS
from fl_app.data.local_splits import client_data
from fl_app.io.cli import tool_parser
from fl_app.models.multiarch import client_model
from fl_app.report import csv_bytes, write_file
from fl_app.run.checkpoint import CHECKPOINT_FILE, load_verified, restore_model_file
from fl_app.run.config import RunConfig

METHODS = ("fedproto", "fedtgp")  # the methods whose server holds global prototypes
REPOSITORY = Path(__file__).resolve().parents[2]


def nearest_prototype(features: torch.Tensor, prototypes: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """The class whose prototype is nearest each feature in mean squared distance, among the ``held`` classes."""
    distances = ((features.unsqueeze(1) - prototypes.unsqueeze(0)) ** 2).mean(2)
    return distances.masked_fill(~held.unsqueeze(0), float("inf")).argmin(1)


def run_setting(folder: Path) -> tuple[RunConfig, dict, dict]:
    """(the run's config as its checkpoint recorded it, its summary, the checkpoint's server state)."""
    summary = json.loads((folder / "summary.json").read_text())
    if summary.get("method") not in METHODS:
        raise ValueError(f"{folder}: method {summary.get('method')!r}; allowed: {', '.join(METHODS)}")
    if not summary.get("completed"):
        raise ValueError(f"{folder}: the run did not complete (summary.json 'completed')")
    blob = load_verified(folder / CHECKPOINT_FILE, what=str(folder / CHECKPOINT_FILE))
    if blob["round"] != summary["rounds"]:
        raise ValueError(f"{folder}: the checkpoint is of round {blob['round']}, the run ended at {summary['rounds']}")
    return RunConfig(dict(blob["run_config"])), summary, blob["strategy"]


def data_setting(run: RunConfig) -> RunConfig:
    """``run`` with a relative data path read from the repository root (as the runner reads it)."""
    values = dict(run.values)
    if values["data-path"] and not Path(values["data-path"]).expanduser().is_absolute():
        values["data-path"] = str(REPOSITORY / values["data-path"])
    return RunConfig(values)


def score_run(folder: Path) -> dict:
    """Head and nearest-prototype accuracy of every client of a finished run (means over clients, and pooled)."""
    folder = Path(folder)
    run, summary, server = run_setting(folder)
    num = int(summary["num_clients"])
    prototypes = server["global_arrays"]["prototypes"].float()
    held = server["global_arrays"]["has"] > 0
    num_classes = DATASETS[run["dataset"]].num_classes
    head, proto, sizes = [], [], []
    data_run = data_setting(run)
    for pid in range(num):
        _, test = client_data(data_run, pid, num)
        model = client_model(run["model-family"], pid, num_classes, run["feature-dim"], run["backbones"])
        if not restore_model_file(run, pid, num, model, str(folder / "client-models"), int(summary["rounds"])):
            raise ValueError(f"{folder}: no saved model of client {pid}")
        correct, total = evaluate(model, test)
        recorded = summary["client_accuracy"][pid]
        if correct / total != recorded:
            raise ValueError(
                f"{folder}: client {pid}'s head scores {correct / total!r} here, the run recorded {recorded!r}; "
                "the data or the code no longer matches the run"
            )
        _, features, labels = embed(model, test)
        head.append(correct)
        proto.append(int((nearest_prototype(features, prototypes, held) == labels).sum()))
        sizes.append(total)
    sizes_a = np.array(sizes)
    record = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
    return {
        "label": record.get("label", summary["method"]),
        "cell": json.dumps(record.get("cell", {}), sort_keys=True),
        "seed": int(summary["seed"]),
        "rounds": int(summary["rounds"]),
        "head_accuracy": float(np.mean(np.array(head) / sizes_a)),
        "prototype_accuracy": float(np.mean(np.array(proto) / sizes_a)),
        "head_pooled": sum(head) / sizes_a.sum(),
        "prototype_pooled": sum(proto) / sizes_a.sum(),
    }


def build_parser():
    parser = tool_parser("experiments.studies.prototype_accuracy", __doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="finished FedProto or FedTGP run folders")
    parser.add_argument("--out", type=Path, help="write prototype_accuracy.csv here (unset: print only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lines = []
        for folder in args.folders:
            line = score_run(folder)
            lines.append(line)
            print(
                f"{line['label']} {line['cell']} seed {line['seed']}: head {100 * line['head_accuracy']:.2f} %, "
                f"nearest prototype {100 * line['prototype_accuracy']:.2f} % (mean over clients)",
                flush=True,
            )
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            print(f"wrote {write_file(args.out / 'prototype_accuracy.csv', csv_bytes(lines))}")
    except (ValueError, OSError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
