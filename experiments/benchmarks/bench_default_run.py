"""Wall time of the README's default run (`flwr run .`, 8 SuperNodes with one CPU each, the default run config) on
an older checkout and on this tree, one after the other, each against its own fresh local SuperLink, and where that
time goes.

    python -m experiments.benchmarks.bench_default_run --base /path/to/older/checkout  # old, then new
    python -m experiments.benchmarks.bench_default_run --base /path/to/older/checkout --order new,old,old,new

Each run is `experiments.runner.flower_runs.flwr_run` from the tree's own folder (its code is the FAB that runs).
Reports per tree the wall time, the ServerApp's round loop, the sum of the clients' own seconds, the final tier
accuracies and the load average before and after (on a shared machine wall times follow the load: alternate the
order).

``--timeline`` runs with Flower's DEBUG log and splits each run's wall time by the log's own timestamps:
start-up (`flwr run` until the simulation logs, the ClientApp's validation load, Ray and its actors, from the actors
to round 1), the rounds, shut-down; and within the rounds: clients training (from the first client's start to the
last one's end, per round), the server's tier evaluation, the rest of the server's round (sending, collecting,
screening and aggregating replies, writing results and checkpoints), and the core-seconds that the actors sat idle
while a round's clients trained (stragglers). ``clients_schedule_bound_s`` is the least time any order of each
round's clients on these cores could take (per round the larger of its busiest client and its client-seconds
shared over the cores): clients training close to it means the idle cores are the largest client's own length,
which no dispatch order removes. Per-client spans come from the clients' ``client timeline`` DEBUG line,
which older trees may lack (then those figures are null).

Prints one JSON line per run on stdout and a table on stderr; ``--out`` also writes the JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from experiments.benchmarks.bench_startup import MARKERS, ROUND, log_stamp
from experiments.benchmarks.common import add_out_option, refuse_existing_out, write_json_lines
from fl_app.io.cli import tool_parser

ROOT = Path(__file__).resolve().parents[2]
ONE_RUN = r"""
import csv, json, os, sys, tempfile, time
from pathlib import Path
if Path("experiments/runner/flower_env.py").is_file():
    from experiments.runner.flower_env import local_flower_env
    from experiments.runner.flower_runs import flwr_run
else:  # a checkout from before experiments/ was grouped by kind
    from experiments.flower_env import local_flower_env
    from experiments.flower_runs import flwr_run
log_file = Path(sys.argv[1]) if len(sys.argv) > 1 else None
with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
    if log_file is not None:
        env = {**env, "FLWR_LOG_LEVEL": "DEBUG", "RAY_DEDUP_LOGS": "0"}  # Ray folds similar lines of the actors
    out = Path(tmp) / "out"
    started = time.time()
    _, status = flwr_run({"output-dir": str(out)}, "num-supernodes=8 client-resources-num-cpus=1", env=env,
                         timeout=3600, log_file=log_file)
    ended = time.time()
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "rounds.csv") as handle:
        rows = list(csv.DictReader(handle))
    print(json.dumps({"status": status, "wall_s": round(ended - started, 1), "started": started, "ended": ended,
                      "server_rounds_s": summary["wall_seconds"],
                      "client_s": round(sum(float(r["client_seconds"]) for r in rows), 1),
                      "tiers": [t["accuracy"] for t in summary["tiers"]],
                      "population_weighted_accuracy": summary.get("population_weighted_accuracy")}))
"""

# start-up phases end at these log lines, in this order
START_MARKERS = {
    name: MARKERS[name]
    for name in ("simulation", "clientapp_load", "ray_init", "actor_pool", "first_round", "serverapp_done")
}
ROUND_START = re.compile(r"\[ROUND (\d+)/")
CLIENT = re.compile(r"client timeline: partition (\d+) round (\d+) from ([0-9.]+) to ([0-9.]+)")


def timeline(log_text: str, started: float, ended: float, cores: int) -> dict:
    """Seconds by phase of one DEBUG-logged run (see the module docstring)."""
    seen: dict[str, float] = {}
    rounds: dict[int, dict] = defaultdict(dict)
    current = None
    for line in log_text.splitlines():
        now = log_stamp(line)
        client = CLIENT.search(line)
        if client:
            rnd, begin, end = int(client.group(2)), float(client.group(3)), float(client.group(4))
            rounds[rnd].setdefault("clients", []).append((begin, end))
            continue
        if now is None:
            continue
        for name, pattern in START_MARKERS.items():
            if name not in seen and re.search(pattern, line):
                seen[name] = now
        if found := ROUND_START.search(line):
            current = int(found.group(1))
            rounds[current]["start"] = now
        elif current is not None and "'train-loss'" in line:
            rounds[current]["trained"] = now
        elif current is not None and "evaluation:" in line:
            rounds[current]["evaluated"] = now
        elif found := ROUND.search(line):
            rounds[int(found.group(1))]["end"] = now
    at = {"start": started, **seen, "end": ended}
    result = {
        "until_simulation_s": at["simulation"] - at["start"],  # flwr CLI, FAB, SuperLink, simulation process
        "to_clientapp_load_s": at["clientapp_load"] - at["simulation"],
        "clientapp_validation_load_s": at["ray_init"] - at["clientapp_load"],
        "ray_start_s": at["actor_pool"] - at["ray_init"],
        "until_first_round_s": at["first_round"] - at["actor_pool"],
        "rounds_s": at["serverapp_done"] - at["first_round"],
        "shutdown_s": at["end"] - at["serverapp_done"],
    }
    parts = defaultdict(float)
    with_clients = all("clients" in r for r in rounds.values())
    for r in rounds.values():
        trained = r["trained"]
        parts["evaluation_s"] += r.get("evaluated", trained) - trained
        if with_clients:
            first = min(b for b, _ in r["clients"])
            last = max(e for _, e in r["clients"])
            busy = sum(e - b for b, e in r["clients"])
            parts["clients_training_s"] += last - first
            parts["client_busy_s"] += busy
            parts["idle_core_s"] += cores * (last - first) - busy
            parts["clients_schedule_bound_s"] += max(busy / cores, max(e - b for b, e in r["clients"]))
            parts["server_rest_s"] += (r["end"] - r["start"]) - (last - first) - (r.get("evaluated", trained) - trained)
    if not with_clients:
        parts.update(
            dict.fromkeys(
                ("clients_training_s", "client_busy_s", "idle_core_s", "clients_schedule_bound_s", "server_rest_s")
            )
        )
    result.update(parts)
    return {k: None if v is None else round(v, 1) for k, v in result.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_default_run", __doc__)
    parser.add_argument("--base", type=Path, required=True, help="an older checkout of this project")
    parser.add_argument(
        "--order",
        type=lambda text: text.split(","),
        default=["old", "new"],
        help="comma-separated trees in the order they run, each old or new (default: old,new)",
    )
    parser.add_argument("--timeline", action="store_true", help="split each run's wall time by phase (default: off)")
    add_out_option(parser, "the JSON lines")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.order or any(name not in ("old", "new") for name in args.order):
        parser.error(f"--order {','.join(args.order)}: each item must be old or new")
    refuse_existing_out(parser, args.out)
    trees = {"old": args.base.resolve(), "new": ROOT}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.order):
            load = [round(x, 2) for x in os.getloadavg()]
            log_file = Path(tmp) / f"run{i}.log"
            proc = subprocess.run(
                [sys.executable, "-c", ONE_RUN, *([str(log_file)] if args.timeline else [])],
                cwd=trees[name],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(trees[name])},
            )
            if proc.returncode:
                raise RuntimeError(f"the {name} run failed:\n{proc.stderr[-3000:]}")
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            started, ended = run.pop("started"), run.pop("ended")
            row = {"tree": name, **run, "load_start": load, "load_end": [round(x, 2) for x in os.getloadavg()]}
            if args.timeline:
                row["timeline"] = timeline(log_file.read_text(errors="replace"), started, ended, os.cpu_count() or 1)
            results.append(row)
            print(json.dumps(row), flush=True)
    for row in results:
        print(
            f"{row['tree']:<4} wall {row['wall_s']:>7.1f} s  rounds {row['server_rounds_s']:>7.1f} s  "
            f"clients {row['client_s']:>7.1f} s  load {row['load_start'][0]:.1f}-{row['load_end'][0]:.1f}",
            file=sys.stderr,
        )
        for key, value in row.get("timeline", {}).items():
            print(f"     {key:<30} {value}", file=sys.stderr)
    write_json_lines(args.out, results)
    return results


if __name__ == "__main__":
    main()
