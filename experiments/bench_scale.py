"""FEAST with many simulated clients: seconds per round and whether the server's memory stays flat.

    python -m experiments.bench_scale                          # 1,000 clients, 10 per round, 20 rounds

A real `flwr run` (CPU-scale supernet, real CIFAR-10 from ../shared, one CPU per client) with tier evaluation every
5 rounds, so rounds 5 and 20 do the same kind of work. Reads the run's ``rounds.csv``, where the ServerApp records
each round's wall time and its own resident / peak resident memory. ``rss_mb_round5`` / ``rss_mb_round20`` are the
peak resident memory (VmHWM) of the server process at the end of those rounds; ``flat`` says whether round 20 is
within 10% of round 5. γ = 0 (plain Dirichlet sizes): the γ-allocation cannot give each of 1,000 clients its
minimum of 10 images of CIFAR-10's 48,000 at γ = 1. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

from experiments.flower_env import local_flower_env
from experiments.flower_runs import flwr_run, format_run_config

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, help="keep the run's output folder here (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.rounds < 20:
        parser.error("--rounds must be >= 20 (memory is compared at rounds 5 and 20)")
    if not args.data_path.exists():
        parser.error(f"--data-path {args.data_path}: not found (CIFAR-10 parquet files)")

    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        out_dir = args.out or Path(tmp) / "run"
        values = {"num-server-rounds": args.rounds, "clients-per-round": args.per_round, "eval-every": 5,
                  "gamma": 0.0, "data-source": "local", "data-path": str(args.data_path.resolve()),
                  "checkpoint-every": 0, "output-dir": str(out_dir.resolve())}
        started = time.perf_counter()
        log_file = Path(tmp) / "flwr.log"
        _, status = flwr_run(format_run_config(values), f"num-supernodes={args.clients} client-resources-num-cpus=1",
                             env=env, timeout=3 * 3600, log_file=log_file)
        wall = time.perf_counter() - started
        if status != "finished:completed":
            raise RuntimeError(f"the run ended {status}:\n{log_file.read_text()[-4000:]}")
        with open(out_dir / "rounds.csv") as handle:
            rows = {int(r["round"]): r for r in csv.DictReader(handle)}
    seconds = [float(rows[r]["seconds"]) for r in sorted(rows)]
    peak5, peak20 = float(rows[5]["server_peak_rss_mb"]), float(rows[20]["server_peak_rss_mb"])
    result = {
        "clients": args.clients, "per_round": args.per_round, "rounds": args.rounds,
        "s_per_round": round(sum(seconds[1:]) / len(seconds[1:]), 2), "s_round1": round(seconds[0], 2),
        "rss_mb_round5": round(peak5, 1), "rss_mb_round20": round(peak20, 1),
        "resident_mb_round5": round(float(rows[5]["server_rss_mb"]), 1),
        "resident_mb_round20": round(float(rows[20]["server_rss_mb"]), 1),
        "flat": abs(peak20 - peak5) <= 0.1 * peak5, "wall_s": round(wall, 1),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
