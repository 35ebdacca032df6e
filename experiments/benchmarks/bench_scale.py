"""FEAST with many simulated clients: seconds per round and whether the server's memory stays flat.

    python -m experiments.benchmarks.bench_scale                          # 1,000 clients, 10 per round, 20 rounds
    python -m experiments.benchmarks.bench_scale --clients 1000,5000 --partitioner iid   # both sizes, one by one

A real `flwr run` (CPU-scale supernet, real CIFAR-10 from ../shared, one CPU per client) with tier evaluation every
5 rounds, so rounds 5 and 20 do the same kind of work. Reads the run's ``rounds.csv``, where the ServerApp records
each round's wall time and its own resident / peak resident memory. ``rss_mb_round5`` / ``rss_mb_round20`` are the
peak resident memory (VmHWM) of the server process at the end of those rounds; ``flat`` says whether round 20 is
within 10% of round 5. γ = 0 (plain Dirichlet sizes): the γ-allocation cannot give each of 1,000 clients its
minimum of 10 images of CIFAR-10's 48,000 at γ = 1. ``--partitioner iid`` gives every client data at any count
(5,000 clients hold 9-10 images each; checked in-process before the run: ``min_partition``).

Per-round server costs that do not depend on training are measured in this process on the same code the ServerApp
runs: ``discovery_ms_per_round`` is ``LiveNodes.refresh`` over the federation's node ids (the SuperLink's
``get_node_ids`` answer stubbed with the real count; the RPC itself is not included) and ``sampling_ms_per_round``
is ``sample_partitions``. ``startup_s`` is the run's wall time outside its rounds: FAB upload, Ray start-up and the
one-time partition query to every node. With several ``--clients`` one JSON line per count, then one comparing them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import time
from pathlib import Path

from experiments.runner.flower_env import local_flower_env
from experiments.runner.flower_runs import flwr_run, format_run_config
from fl_app.io.cli import comma_list, tool_parser

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar10"


def server_round_costs(num_clients: int, per_round: int, rounds: int = 20) -> dict:
    """Median ms of the ServerApp's per-round node bookkeeping and sampling for ``num_clients`` live nodes."""
    import statistics

    from strategies.rounds import LiveNodes, sample_partitions

    class ConnectedNodes:  # the SuperLink's answer to get_node_ids: every node connected, as in a simulation
        def __init__(self, ids):
            self.ids = ids

        def get_node_ids(self):
            return list(self.ids)

    node_of_partition = {pid: 10_000_000 + pid for pid in range(num_clients)}
    live, grid = LiveNodes(dict(node_of_partition), num_clients), ConnectedNodes(node_of_partition.values())
    refresh, sampling = [], []
    for server_round in range(1, rounds + 1):
        started = time.perf_counter()
        ids = live.refresh(grid, server_round)
        refresh.append(time.perf_counter() - started)
        started = time.perf_counter()
        sample_partitions(ids, per_round, 0, server_round)
        sampling.append(time.perf_counter() - started)
    return {
        "discovery_ms_per_round": round(1e3 * statistics.median(refresh), 3),
        "sampling_ms_per_round": round(1e3 * statistics.median(sampling), 3),
    }


def smallest_partition(values: dict, num_clients: int) -> int:
    from fl_app.run.config import validate_run_config
    from fl_app.supernet.shared_setup import partition_rows

    return min(len(rows) for rows in partition_rows(validate_run_config(values), num_clients))


def run_scale(num_clients: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        out_dir = args.out / str(num_clients) if args.out else Path(tmp) / "run"
        values = {
            "num-server-rounds": args.rounds,
            "clients-per-round": args.per_round,
            "eval-every": 5,
            "gamma": 0.0,
            "partitioner": args.partitioner,
            "data-source": "local",
            "data-path": str(args.data_path.resolve()),
            "checkpoint-every": 0,
            "output-dir": str(out_dir.resolve()),
        }
        min_partition = smallest_partition({k: v for k, v in values.items() if k != "output-dir"}, num_clients)
        if min_partition < 1:
            raise RuntimeError(f"partitioner={args.partitioner} leaves a client without data at {num_clients} clients")
        started = time.perf_counter()
        log_file = Path(tmp) / "flwr.log"
        _, status = flwr_run(
            format_run_config(values),
            f"num-supernodes={num_clients} client-resources-num-cpus=1",
            env=env,
            timeout=3 * 3600,
            log_file=log_file,
        )
        wall = time.perf_counter() - started
        if status != "finished:completed":
            raise RuntimeError(f"the run ended {status}:\n{log_file.read_text()[-4000:]}")
        with open(out_dir / "rounds.csv") as handle:
            rows = {int(r["round"]): r for r in csv.DictReader(handle)}
    seconds = [float(rows[r]["seconds"]) for r in sorted(rows)]
    peak5, peak20 = float(rows[5]["server_peak_rss_mb"]), float(rows[20]["server_peak_rss_mb"])
    return {
        "clients": num_clients,
        "per_round": args.per_round,
        "rounds": args.rounds,
        "partitioner": args.partitioner,
        "min_partition": min_partition,
        "s_per_round": round(sum(seconds[1:]) / len(seconds[1:]), 2),
        "s_round1": round(seconds[0], 2),
        "rss_mb_round5": round(peak5, 1),
        "rss_mb_round20": round(peak20, 1),
        "resident_mb_round5": round(float(rows[5]["server_rss_mb"]), 1),
        "resident_mb_round20": round(float(rows[20]["server_rss_mb"]), 1),
        "flat": abs(peak20 - peak5) <= 0.1 * peak5,
        "wall_s": round(wall, 1),
        "startup_s": round(wall - sum(seconds), 1),
        **server_round_costs(num_clients, args.per_round),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_scale", __doc__)
    parser.add_argument(
        "--clients", type=comma_list(int), default=[1000], help="simulated clients, one run per size (e.g. 1000,5000)"
    )
    parser.add_argument("--per-round", type=int, default=10, help="clients sampled per round")
    parser.add_argument("--rounds", type=int, default=20, help="server rounds (at least 20)")
    parser.add_argument(
        "--partitioner",
        choices=["gamma", "dirichlet", "iid"],
        default="gamma",
        help="gamma (here with γ = 0, i.e. Dirichlet sizes), dirichlet or iid",
    )
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA, help="folder of CIFAR-10 parquet files")
    parser.add_argument("--out", type=Path, help="keep the runs' output folders here (default: temporary ones)")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 20:
        parser.error("--rounds must be >= 20 (memory is compared at rounds 5 and 20)")
    if not args.data_path.exists():
        parser.error(f"--data-path {args.data_path}: not found (CIFAR-10 parquet files)")
    results = []
    for num_clients in args.clients:
        results.append(run_scale(num_clients, args))
        print(json.dumps(results[-1]), flush=True)
    if len(results) > 1:
        base = results[0]
        print(
            json.dumps(
                {
                    "compared_with": base["clients"],
                    **{
                        f"{r['clients']}": {
                            "s_per_round_ratio": round(r["s_per_round"] / base["s_per_round"], 3),
                            "peak_rss_ratio": round(r["rss_mb_round20"] / base["rss_mb_round20"], 3),
                            "startup_s_ratio": round(r["startup_s"] / base["startup_s"], 3),
                        }
                        for r in results[1:]
                    },
                }
            )
        )
    return results


if __name__ == "__main__":
    main()
