"""FEAST against its baselines (and FEAST's ablations) at CPU scale on the real CIFAR-10, same seed, budgets and
partitions for every method; each method is a real `flwr run` of the app.

    python -m experiments.compare --out experiments/results/compare
    python -m experiments.compare --out experiments/results/ablations --ablations

Writes ``table.csv`` (one row per method: accuracy per tier, population-weighted accuracy, traffic, wall time),
``rounds.csv`` (population-weighted accuracy per evaluated round and method), ``accuracy_vs_macs.png``,
``summary.json`` and each run's own folder under ``runs/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from experiments.flower_runs import flwr_run
from fl_app.outputs import plot_accuracy_vs_macs, write_csv, write_json

METHODS = ["feast", "superfednas", "deepfednas", "heterofl", "fedrolex", "fedavg-min"]
ABLATIONS = {
    "feast": {},  # the reference the ablations are read against
    "feast-max-only": {"train-subnets": "max"},
    "feast-no-random": {"train-subnets": "max,min"},
    "feast-kd0": {"kd-ratio": 0.0},
    "feast-no-routing": {"routing": False},
}
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10"


def run_variants(variants: dict[str, dict], base: dict, out: Path, federation: str) -> list[dict]:
    results = []
    for name, overrides in variants.items():
        run_dir = (out / "runs" / name).resolve()  # the ServerApp needs an absolute output-dir
        summary_file = run_dir / "summary.json"
        if summary_file.exists():  # finished earlier: reuse instead of overwriting
            print(f"[{name}] reusing {summary_file}", flush=True)
        else:
            started = time.time()
            print(f"[{name}] running ...", flush=True)
            out.joinpath("logs").mkdir(parents=True, exist_ok=True)
            _, status = flwr_run({**base, **overrides, "output-dir": str(run_dir)}, federation,
                                 log_file=out / "logs" / f"{name}.log")
            print(f"[{name}] {status} in {time.time() - started:.0f}s", flush=True)
            if status != "finished:completed":
                raise RuntimeError(f"{name}: run ended {status}; see {out / 'logs' / (name + '.log')}")
        summary = json.loads(summary_file.read_text())
        with open(run_dir / "metrics.csv") as handle:
            rounds = {}
            for row in csv.DictReader(handle):
                rounds[int(row["round"])] = float(row["population_weighted_accuracy"])
        results.append({"name": name, "summary": summary, "rounds": rounds})
    return results


def ranking(results: list[dict], at_round: int) -> list[str]:
    return [r["name"] for r in sorted(results, key=lambda r: -r["rounds"].get(at_round, float("nan")))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--ablations", action="store_true", help="run FEAST's ablations instead of the methods")
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gamma", type=float, default=1.0)
    args = parser.parse_args(argv)

    base = {"data-source": "local", "data-path": str(args.data_path.resolve()), "num-server-rounds": args.rounds,
            "seed": args.seed, "gamma": args.gamma, "eval-every": 5}
    variants = ABLATIONS if args.ablations else {m: {"method": m} for m in args.methods.split(",")}
    federation = f"num-supernodes={args.clients} client-resources-num-cpus=1"
    started = time.time()
    results = run_variants(variants, base, args.out, federation)

    table = []
    for r in results:
        s = r["summary"]
        row = {"method": r["name"], "population_weighted_accuracy": round(s["population_weighted_accuracy"], 4)}
        for tier in s["tiers"]:
            row[f"acc@{tier['macs'] / 1e6:.2f}M"] = round(tier["accuracy"], 4)
        row.update({"bytes_down_mb": round(s["bytes_down"] / 1e6, 1), "bytes_up_mb": round(s["bytes_up"] / 1e6, 1),
                    "wall_seconds": s["wall_seconds"]})
        table.append(row)
    columns = list(dict.fromkeys(k for row in table for k in row))
    write_csv(args.out / "table.csv", [{c: row.get(c, "") for c in columns} for row in table])
    evaluated = sorted(set().union(*(r["rounds"] for r in results)))
    write_csv(args.out / "rounds.csv", [{"round": t, **{r["name"]: r["rounds"].get(t, "") for r in results}}
                                        for t in evaluated])
    plot_accuracy_vs_macs(args.out / "accuracy_vs_macs.png",
                          {r["name"]: [(t["macs"], t["accuracy"]) for t in r["summary"]["tiers"]] for r in results},
                          f"CIFAR-10, {args.clients} clients, {args.rounds} rounds, γ={args.gamma}")
    last, previous = evaluated[-1], evaluated[-2] if len(evaluated) > 1 else evaluated[-1]
    summary = {
        "rounds": args.rounds, "clients": args.clients, "seed": args.seed, "gamma": args.gamma,
        "table": table, "ranking_last_eval": ranking(results, last), "ranking_previous_eval": ranking(results, previous),
        "ranking_stable": ranking(results, last) == ranking(results, previous),
        "machine_seconds": round(time.time() - started, 1),
    }
    write_json(args.out / "summary.json", summary)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
