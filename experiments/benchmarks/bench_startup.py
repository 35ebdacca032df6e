"""Where a Flower run's time goes beyond the work itself: a timeline of one `flwr run` and the cost of each start-up
part measured on its own.

    python -m experiments.benchmarks.bench_startup                          # 10 rounds, 8 clients, one client at a time
    python -m experiments.benchmarks.bench_startup --rounds 25 --repeats 3  # the default run's 25 rounds

The committed result (one thread, as on a shared machine: OMP_NUM_THREADS=1 MKL_NUM_THREADS=1):

    python -m experiments.benchmarks.bench_startup --rounds 10 --repeats 2 --out experiments/results/bench/startup.json

Timeline: one `flwr run --stream` of the FEAST default run config (``--rounds`` rounds, evaluation at the last one, no
checkpoints) against a fresh local SuperLink, with the simulation's DEBUG log, whose lines carry the simulation
process's own timestamps. The phases between its markers:

- ``cli_submit_s``: `flwr run` until the run is accepted (CLI import, FAB build and upload).
- ``simulation_process_s``: until the simulation process logs (SuperExec starts it; it imports Flower).
- ``fab_install_s``: the simulation process unpacks the FAB.
- ``clientapp_validation_load_s``: Flower loads the ClientApp once in the simulation process to validate it (the
  project's imports; the ServerApp is imported at the same time in a thread of the same process).
- ``ray_start_s``: `ray.init` and the actor pool (Ray).
- ``first_round_wait_s``: from the actor pool to round 1: each actor imports the ClientApp, the nodes answer the
  partition query, the server builds its federation and evaluator.
- ``rounds_s`` (per round, the ServerApp's own log), ``evaluation_s`` (the last round's tier evaluation), and
  ``shutdown_s`` (results written until `flwr run` returns: Ray stopped, actors terminated, outputs pushed).

Beside it the same rounds as a plain loop (``experiments.benchmarks.bench_overhead --plain-only``, in the ``--app``
tree) and ``extra``: what the Flower run spends beyond the plain loop, by part. Parts on their own (this tree, one
thread, fresh processes, median of ``--repeats``): importing torch, Flower's simulation, Ray and the
project's ClientApp (and how much of it is flwr-datasets), `ray.init` plus one actor, and in one process the
client's first-call work (decoded dataset from the cache, federation, partitions), building the model, encoding and
decoding the full model as a message payload, and one tier evaluation.

Prints one JSON line on stdout and a table on stderr; ``--out`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from experiments.benchmarks.common import add_out_option, refuse_existing_out, write_json_lines
from experiments.runner.flower_env import local_flower_env
from experiments.runner.flower_runs import APP_DIR, format_run_config
from fl_app.io.cli import tool_parser

# simulation DEBUG/INFO log markers, in the order they appear
MARKERS = {
    "accepted": r"Successfully started run",
    "simulation": r"Starting Flower Simulation",
    "fab_install": r"Simulation process starts FAB installation",
    "fab_installed": r"Flower will load ServerApp",
    "clientapp_load": r"Loading ClientApp",
    "ray_init": r"Initialising: RayBackend",
    "actor_pool": r"Constructed ActorPool",
    "first_round": r"\[ROUND 1/",
    "serverapp_done": r"ServerApp finished running",
}
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
ROUND = re.compile(r"round (\d+): ([0-9.]+)s, server memory")


def log_stamp(line: str) -> float | None:
    """The time a Flower log line carries (None when it has none)."""
    found = STAMP.search(line)
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if found else None


def flower_timeline(app: Path, rounds: int, clients: int, cores: int) -> dict:
    """One streamed `flwr run` with the simulation's DEBUG log; seconds per phase (see the module docstring)."""
    values = {"num-server-rounds": rounds, "eval-every": rounds, "checkpoint-every": 0}
    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        env = {**env, "FLWR_LOG_LEVEL": "DEBUG", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        subprocess.run(["flwr", "ls"], env=env, capture_output=True, timeout=300)  # start the local SuperLink
        command = [
            "flwr",
            "run",
            str(app),
            "--stream",
            "--run-config",
            format_run_config({**values, "output-dir": str(Path(tmp) / "out")}),
            "--federation-config",
            f"num-supernodes={clients} client-resources-num-cpus={cores}",
        ]
        started = time.time()
        seen: dict[str, float] = {}
        round_seconds: dict[int, float] = {}
        last_fit, evaluated, tail = None, None, []
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            tail = [*tail[-40:], line.rstrip()]
            now = log_stamp(line) or time.time()  # the simulation's own clock where the line has one
            for name, pattern in MARKERS.items():
                if name not in seen and re.search(pattern, line):
                    seen[name] = now
            if "'train-loss'" in line:
                last_fit = now
            if "evaluation:" in line and last_fit is not None:
                evaluated = now - last_fit
            found = ROUND.search(line)
            if found:
                round_seconds[int(found.group(1))] = float(found.group(2))
        proc.wait()
        ended = time.time()
    missing = [name for name in MARKERS if name not in seen]
    if missing or len(round_seconds) != rounds:
        raise RuntimeError(f"the run's log lacks {missing or 'some round lines'}:\n" + "\n".join(tail))
    order = ["start", *MARKERS, "end"]
    at = {"start": started, **seen, "end": ended}
    gap = {f"{a}->{b}": at[b] - at[a] for a, b in zip(order, order[1:])}
    phases = {
        "cli_submit_s": gap["start->accepted"],
        "simulation_process_s": gap["accepted->simulation"] + gap["simulation->fab_install"],
        "fab_install_s": gap["fab_install->fab_installed"] + gap["fab_installed->clientapp_load"],
        "clientapp_validation_load_s": gap["clientapp_load->ray_init"],
        "ray_start_s": gap["ray_init->actor_pool"],
        "first_round_wait_s": gap["actor_pool->first_round"],
        "rounds_s": at["serverapp_done"] - at["first_round"],
        "shutdown_s": gap["serverapp_done->end"],
    }
    return {
        "wall_s": round(ended - started, 2),
        **{k: round(v, 2) for k, v in phases.items()},
        "round_s": [round_seconds[r] for r in sorted(round_seconds)],
        "evaluation_s": round(evaluated, 2) if evaluated is not None else None,
    }


# -- parts on their own ------------------------------------------------------------------------------------------------
IMPORTS = {
    "import_torch_s": "import torch",
    "import_flwr_simulation_s": "import flwr.simulation",
    "import_ray_s": "import ray",
    "import_datasets_s": "import datasets",
    # flwr-datasets imports its plotting helpers (seaborn, scipy.stats, matplotlib) whatever one asks of it
    "import_flwr_datasets_s": "import flwr_datasets.partitioner",
    "import_clientapp_s": "import fl_app.client_app",
}
RAY_START = """
import ray
ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
@ray.remote
class Actor:
    def ping(self):
        return 1
ray.get(Actor.remote().ping.remote())
ray.shutdown()
"""
CLIENT_FIRST_CALL = """
import json, time
import torch
from fl_app.run.config import validate_run_config
started = time.perf_counter()
from fl_app.data.images import load_dataset
from fl_app.supernet.shared_setup import SupernetSetup, client_data, dataset_for, partition_rows, server_splits
from fl_app.supernet.evaluation import TierEvaluator
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.payload import record_to_state, state_to_record
run = validate_run_config({"num-server-rounds": 1, "eval-every": 1})
out = {}
def timed(key, fn):
    t = time.perf_counter(); value = fn(); out[key] = round(time.perf_counter() - t, 3); return value
setup = timed("federation_build_s", lambda: SupernetSetup.build(run, %(clients)d))
train, test = timed("dataset_load_s", lambda: dataset_for(run, setup.cfg))
timed("partitions_s", lambda: partition_rows(run, %(clients)d))
timed("client_data_s", lambda: client_data(run, 0, %(clients)d))
model = timed("model_build_s", lambda: ElasticResNet(setup.cfg))
state = {k: v.numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
timed("payload_roundtrip_s", lambda: record_to_state(state_to_record(state)))
splits = server_splits(run, train)
evaluator = TierEvaluator(setup.cfg, setup.tiers(run), setup.budgets, train.subset(splits.calibration),
                          train.subset(splits.validation), test, 1, 1, lambda s: s)
timed("evaluation_s", lambda: evaluator(1, state))
out["evaluation_images"] = len(splits.calibration) + len(splits.validation) + len(test)
out["evaluation_tiers"] = len(setup.tiers(run))
print(json.dumps(out))
"""


def _fresh_process(code: str, threads: int) -> tuple[float, str]:
    """Wall seconds of ``python -c code`` in a fresh process, and its last stdout line."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(APP_DIR)}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=APP_DIR)
    if out.returncode:
        raise RuntimeError(f"{code[:60]!r} failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - started, (out.stdout.strip().splitlines() or [""])[-1]


def parts_alone(repeats: int, clients: int, threads: int) -> dict:
    """Median seconds of each start-up part, each in fresh processes."""
    result = {}
    baseline = statistics.median(_fresh_process("pass", threads)[0] for _ in range(repeats))
    result["python_start_s"] = round(baseline, 3)
    for key, code in {**IMPORTS, "ray_start_s": RAY_START}.items():
        result[key] = round(statistics.median(_fresh_process(code, threads)[0] for _ in range(repeats)) - baseline, 3)
    runs = [json.loads(_fresh_process(CLIENT_FIRST_CALL % {"clients": clients}, threads)[1]) for _ in range(repeats)]
    for key in runs[0]:
        result[key] = round(statistics.median(r[key] for r in runs), 3)
    return result


def plain_loop(app: Path, rounds: int, clients: int) -> dict:
    """The same rounds as a plain loop in one fresh process (``experiments.benchmarks.bench_overhead --plain-only``: the
    app's own functions, no Flower), with as many threads as the Flower run's single client (``OMP_NUM_THREADS`` if
    set, else all cores)."""
    values = {"num-server-rounds": rounds, "eval-every": rounds, "checkpoint-every": 0}
    # the --app tree's own plain loop; a checkout from before experiments/ was grouped by kind has it in experiments/
    grouped = (app / "experiments" / "benchmarks" / "bench_overhead.py").is_file()
    module = "experiments.benchmarks.bench_overhead" if grouped else "experiments.bench_overhead"
    command = [sys.executable, "-m", module, "--plain-only", "--rounds", str(rounds)]
    command += ["--clients", str(clients), "--run-config", json.dumps(values)]
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, cwd=app, env={**os.environ, "PYTHONPATH": str(app)})
    if out.returncode:
        raise RuntimeError(f"the plain loop failed:\n{out.stderr[-2000:]}")
    plain = json.loads(out.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - started
    return {
        "wall_s": round(wall, 2),
        "startup_s": round(wall - plain["rounds_s"], 2),  # imports, data, model, evaluator: before round 1
        "rounds_s": plain["rounds_s"],
        "client_s": plain["client_s"],
    }


def _table(result: dict) -> str:
    lines = [f"{'part':<34} {'seconds':>8}"]
    for section in ("flower", "plain", "extra", "alone"):
        lines.append(f"-- {section}")
        for key, value in result[section].items():
            if isinstance(value, (int, float)):
                lines.append(f"{key:<34} {value:>8.2f}")
    lines.append(f"{'round_s':<34} {' '.join(f'{s:.1f}' for s in result['flower']['round_s'])}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_startup", __doc__)
    parser.add_argument("--rounds", type=int, default=10, help="server rounds of the timed Flower run (default: 10)")
    parser.add_argument("--clients", type=int, default=8, help="simulated SuperNodes (default: 8)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="fresh processes per part measured alone, median (default: 3)"
    )
    parser.add_argument("--skip-flower", action="store_true", help="measure only the parts alone (default: off)")
    parser.add_argument(
        "--app", type=Path, default=APP_DIR, help="the app folder whose `flwr run` is timed (default: this tree)"
    )
    add_out_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_existing_out(parser, args.out)
    cores = os.cpu_count() or 1
    result = {
        "app": str(args.app.resolve()),
        "rounds": args.rounds,
        "clients": args.clients,
        "cores": cores,
        "load_start": _load(),
    }
    # one client at a time with all cores, as bench_overhead's ``flower_s`` (its plain loop uses as many threads)
    result["flower"] = {} if args.skip_flower else flower_timeline(args.app.resolve(), args.rounds, args.clients, cores)
    print("flower:", json.dumps(result["flower"]), file=sys.stderr, flush=True)
    if not args.skip_flower:
        result["plain"] = plain_loop(args.app.resolve(), args.rounds, args.clients)
        flower, plain = result["flower"], result["plain"]
        # what the Flower run spends beyond the plain loop, by part
        result["extra"] = {
            "flower_cli_and_process_s": round(
                flower["cli_submit_s"] + flower["simulation_process_s"] + flower["fab_install_s"], 2
            ),
            "clientapp_validation_load_s": flower["clientapp_validation_load_s"],
            "ray_start_s": flower["ray_start_s"],
            "first_round_wait_minus_plain_startup_s": round(flower["first_round_wait_s"] - plain["startup_s"], 2),
            "rounds_minus_plain_rounds_s": round(flower["rounds_s"] - plain["rounds_s"], 2),
            "shutdown_s": flower["shutdown_s"],
            "total_s": round(flower["wall_s"] - plain["wall_s"], 2),
        }
        result["ratio"] = round(flower["wall_s"] / plain["wall_s"], 3)
    result["alone"] = parts_alone(args.repeats, args.clients, 1)  # one thread: the machine may be shared
    result["load_end"] = _load()
    print(json.dumps(result))
    print(_table({"plain": {}, "extra": {}, **result, "flower": result["flower"] or {"round_s": []}}), file=sys.stderr)
    write_json_lines(args.out, [result])
    return result


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    main()
