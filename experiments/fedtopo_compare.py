"""FedTopo vs. its baselines and ablations on CIFAR-10: same backbones, partitions and seed for every variant.

Runs in one process through the app's own strategy and client functions (``fl_app.fedtopo_app.run_in_process``:
the strategies' ``start`` loop with an in-process Grid instead of Ray), one variant after another, and writes
comparison.csv (final numbers), rounds.csv (accuracy per evaluated round), comparison.json and accuracy_per_round.png.

    python -m experiments.fedtopo_compare --out experiments/results/fedtopo
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import tomllib
from pathlib import Path

import torch

from fl_app.config import validate_run_config
from fl_app.fedtopo_app import plot_accuracy_per_round, run_in_process
from fl_app.outputs import write_csv, write_json

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "experiments" / "conf" / "fedtopo-cifar10.toml"

# label -> run-config overrides of the conf
VARIANTS = {
    "fedtopo": {"method": "fedtopo"},
    "local": {"method": "local"},
    "lg-fedavg": {"method": "lg-fedavg"},
    "fd": {"method": "fd"},
    "fedproto": {"method": "fedproto"},
    "fedtgp": {"method": "fedtgp"},
    "fedtopo-mean (no reliability weighting)": {"method": "fedtopo", "topo-weighting": "mean"},
    "fedtopo-beta0 (no topology guidance)": {"method": "fedtopo", "topo-beta": 0.0},
    "fedtopo-logits (topology from logits)": {"method": "fedtopo", "topo-source": "logits"},
}

def slug(label: str) -> str:
    return label.split(" ")[0]


def write_results(out: Path, clients: int, base: dict, rows: list, per_round: list, summaries: dict,
                  total: float) -> None:
    write_csv(out / "comparison.csv", rows)
    write_csv(out / "rounds.csv", per_round)
    write_json(out / "comparison.json", {"clients": clients, "run_config": {**base, "output-dir": "<per variant>"},
                                         "variants": VARIANTS, "table": rows, "total_seconds": round(total, 1),
                                         "summaries": {k: {kk: vv for kk, vv in v.items() if kk != "run_config"}
                                                       for k, v in summaries.items()}})
    for metric, name in (("mean_client_accuracy", "accuracy_per_round.png"),
                         ("pooled_accuracy", "pooled_accuracy_per_round.png")):
        plot_accuracy_per_round(out / name, {label: [(h["round"], h[metric]) for h in s["history"]]
                                             for label, s in summaries.items()},
                                f"CIFAR-10, {clients} clients, Dirichlet α={base['dirichlet-alpha']}",
                                ylabel=metric.replace("_", " ") + " (%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="experiments/results/fedtopo")
    parser.add_argument("--data-path", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides for every variant (TOML values, e.g. num-server-rounds=4)")
    parser.add_argument("--only", nargs="*", default=[], help="variant slugs to run (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    base = tomllib.loads(CONF.read_text())
    base["data-path"] = str(Path(args.data_path).expanduser().resolve())
    for item in args.set:
        base.update(tomllib.loads(item))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows, per_round, summaries = [], [], {}
    for label, overrides in VARIANTS.items():
        if args.only and slug(label) not in args.only:
            continue
        run_dir = out / slug(label)
        shutil.rmtree(run_dir, ignore_errors=True)  # a rerun replaces this script's own outputs
        run = validate_run_config({**base, **overrides, "output-dir": str(run_dir)})
        t0, c0 = time.time(), time.process_time()
        summary = run_in_process(run, args.clients)
        summaries[label] = summary
        rows.append({"variant": label, "method": run["method"],
                     "mean_client_accuracy": round(summary["mean_client_accuracy"], 4),
                     "pooled_accuracy": round(summary["pooled_accuracy"], 4),
                     "bytes_up_per_round": int(summary["bytes_up_per_round"]),
                     "bytes_down_per_round": int(summary["bytes_down_per_round"]),
                     "wall_seconds": round(time.time() - t0, 1),
                     "cpu_seconds": round(time.process_time() - c0, 1)})
        per_round += [{"variant": label, **h} for h in summary["history"]]
        print(json.dumps(rows[-1]), flush=True)
        # written after every variant, so an interrupted comparison still leaves what it finished
        write_results(out, args.clients, base, rows, per_round, summaries, time.time() - started)
    total = time.time() - started
    print(f"total {total:.0f}s wall, {time.process_time():.0f}s CPU", flush=True)


if __name__ == "__main__":
    main()
