"""Who trained, and does it show: for each run of a model-heterogeneous suite where clients are sampled, the clients
never sampled (the strategy's own seeded sampling, ``strategies.rounds.sample_partitions``, replayed from each
seed's FedTopo summary), how many clients score exactly as under FedTopo, and the mean accuracy of the sampled and
the never-sampled clients.

    python -m experiments.studies.participation experiments/results/fedtopo-100clients/runs \
        --out experiments/results/fedtopo-100clients

writes ``participation.csv`` in ``--out`` (a new file: never over an existing one or through a link) and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

from fl_app.run.outputs import write_csv
from strategies.rounds import sample_partitions


def times_sampled(summary: dict) -> list[int]:
    """How many rounds each client was sampled in, replayed from the run's seed and sampling settings."""
    times = [0] * summary["num_clients"]
    for r in range(1, summary["rounds"] + 1):
        for p in sample_partitions(range(summary["num_clients"]), summary["clients_per_round"], summary["seed"], r):
            times[p] += 1
    return times


def participation_rows(runs: Path) -> list[dict]:
    rows = []
    for reference in sorted(runs.glob("fedtopo/seed*/summary.json")):
        fedtopo = json.loads(reference.read_text())
        seed, times = fedtopo["seed"], times_sampled(fedtopo)
        topo = fedtopo["client_accuracy"]
        trained = [i for i, t in enumerate(times) if t > 0]
        for summary in sorted(runs.glob(f"*/seed{seed}/summary.json")):
            m = json.loads(summary.read_text())
            acc = m["client_accuracy"]
            rows.append(
                {
                    "seed": seed,
                    "method": m["method"],
                    "clients": len(acc),
                    "never_trained": len(acc) - len(trained),
                    "same_accuracy_as_fedtopo": sum(a == b for a, b in zip(acc, topo)),
                    "trained_same_accuracy_as_fedtopo": sum(acc[i] == topo[i] for i in trained),
                    "accuracy_trained": round(mean(acc[i] for i in trained), 4),
                    "accuracy_never_trained": round(mean(a for a, t in zip(acc, times) if t == 0), 4),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.studies.participation", description=__doc__)
    parser.add_argument("runs", type=Path, help="a suite's runs/ folder with fedtopo/seed<N> runs")
    parser.add_argument("--out", type=Path, required=True, help="folder for participation.csv")
    args = parser.parse_args(argv)
    rows = participation_rows(args.runs)
    if not rows:
        print(f"error: {args.runs}: no fedtopo/seed<N>/summary.json", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "participation.csv", rows)
    print((args.out / "participation.csv").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
