"""What the Flower simulation costs on top of the work itself: the same FEAST workload through `flwr run` and as a
plain PyTorch loop in one process.

    python -m experiments.benchmarks.bench_overhead         # default run config, 10 rounds, 8 clients

Both sides use the app's own functions for everything that is the method: client budgets and partitions, seeded
sampling, routing (``route_bounds`` + ``slice_state``), the client's ``train_subnets`` with the same per-round seeds
and learning rates, ``sparse_average``, and one tier evaluation at the end. The plain loop drops only what Flower adds:
SuperLink and Ray start-up, messages, serialisation, the ServerApp/ClientApp dispatch. Its final tier accuracies must
equal the Flower run's (``same_result``), so the two really did the same work.

Timing: ``flower_s`` is the wall time of ``flwr run --stream`` (FAB build, upload, Ray start-up, all rounds, outputs)
against an already running local SuperLink (started once per session, like a user's); ``plain_s`` is the wall time of
a fresh process running the loop (imports, data loading, all rounds, evaluation). By default Flower runs one client
at a time (``client-resources-num-cpus`` = all cores, so a client trains with as many threads), as the plain loop
does (same threads); ``flower_parallel_s`` is the README's federation (one CPU and one thread per client, clients
side by side; its floats differ from the plain loop's, since thread counts change reduction order).
``ratio`` = flower_s / plain_s (start-up included); ``rounds_ratio`` = flower_rounds_s / plain_rounds_s, the steady
state: the ServerApp's round loop against the plain loop's (start-up and shutdown excluded on both sides). The
reference regime's steady state (experiments/suites/reference-regime.toml's data and local work: 100 clients, 10 a
round, one local epoch of about 500 images; no augmentation, so that both sides draw the same batches):

    python -m experiments.benchmarks.bench_overhead --clients 100 --rounds 6 --no-parallel --run-config \\
      "data-source='local' data-path='../shared/data/cifar10' dirichlet-alpha=0.03 budget-max-factor=2.5 \\
       clients-per-round=10 max-local-steps=0 local-epochs=1 batch-size=64 lr=0.025"

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from experiments.benchmarks.common import add_out_option, refuse_existing_out, write_json_lines
from experiments.runner.flower_env import local_flower_env
from experiments.runner.flower_runs import flwr_run, format_run_config
from fl_app.io.cli import run_config_overrides, tool_parser
from fl_app.io.files import write_own_file


def plain_feast(run_values: dict, num_clients: int, state_out: Path | None = None) -> dict:
    """FEAST without Flower: one process, clients one after another. Returns the final tiers (and saves the final
    global model to ``state_out``)."""
    from clients.feast import LocalSettings, plan_subnets, train_subnets
    from fl_app.models.elastic_resnet import ElasticResNet
    from fl_app.run.config import validate_run_config
    from fl_app.run.lr_schedule import lr_schedule
    from fl_app.run.seeds import derived_seed
    from fl_app.supernet.evaluation import TierEvaluator
    from fl_app.supernet.shared_setup import SupernetSetup, client_data, dataset_for, server_splits
    from fl_app.supernet.slicing import slice_state, subnet_shapes
    from strategies.rounds import sample_partitions
    from strategies.sparse import sparse_average

    run = validate_run_config(run_values)
    setup = SupernetSetup.build(run, num_clients)
    budgets = setup.client_budgets(run, {})
    train, test = dataset_for(run, setup.cfg)
    splits = server_splits(run, train)
    torch.manual_seed(run["seed"])
    state = {
        k: v.numpy() for k, v in ElasticResNet(setup.cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    evaluator = TierEvaluator(
        setup.cfg,
        setup.tiers(run),
        budgets.values(),
        train.subset(splits.calibration),
        train.subset(splits.validation),
        test,
        run["eval-every"],
        run["num-server-rounds"],
        lambda s: s,
    )
    lr_of_round = lr_schedule(run)
    started, client_seconds = time.perf_counter(), 0.0
    for server_round in range(1, run["num-server-rounds"] + 1):
        updates = []
        for pid in sample_partitions(range(num_clients), run.clients_per_round(num_clients), run["seed"], server_round):
            client_started = time.perf_counter()
            bounds = setup.cache.route_bounds(budgets[pid])
            routed = slice_state(state, subnet_shapes(setup.cfg, bounds))
            model = ElasticResNet(setup.cfg, bounds)
            model.load_state_dict({k: torch.from_numpy(v) for k, v in routed.items()}, strict=False)
            data = client_data(run, pid, num_clients)
            settings = LocalSettings.from_run(
                run, lr_of_round(server_round), derived_seed(run["seed"], server_round, pid)
            )
            train_subnets(model, plan_subnets(setup.cache, budgets[pid], bounds, run.train_subnets), data, settings)
            trained = {
                k: v.numpy()
                for k, v in slice_state(model.state_dict(), {k: v.shape for k, v in routed.items()}).items()
            }
            updates.append((trained, len(data)))
            client_seconds += time.perf_counter() - client_started
        state = sparse_average(state, updates)
        evaluator(server_round, state)
    if state_out is not None:
        write_own_file(state_out, lambda out: np.savez(out, **state))
    return {
        "tiers": evaluator.last["tiers"],
        "population_weighted_accuracy": evaluator.last["population_weighted_accuracy"],
        "rounds_s": round(time.perf_counter() - started, 1),
        "client_s": round(client_seconds, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.bench_overhead", __doc__)
    parser.add_argument("--rounds", type=int, default=10, help="server rounds (default: 10)")
    parser.add_argument("--clients", type=int, default=8, help="simulated clients (default: 8)")
    parser.add_argument(
        "--run-config",
        type=run_config_overrides,
        default={},
        help='extra run-config values in flwr run\'s syntax, e.g. "local-steps=20 batch-size=64" (default: none)',
    )
    parser.add_argument(
        "--no-parallel", action="store_true", help="skip the parallel-clients Flower run (default: off)"
    )
    add_out_option(parser)
    parser.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)  # the plain side, internal
    parser.add_argument("--state-out", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_existing_out(parser, args.out)
    values = {
        "num-server-rounds": args.rounds,
        "eval-every": args.rounds,
        "checkpoint-every": 0,
        **args.run_config,
    }
    cores = os.cpu_count() or 1
    if args.plain_only:
        # as many threads as the Flower run's client: its actor trains with OMP_NUM_THREADS threads, which Ray sets to
        # the actor's CPUs (all cores here) unless the environment already sets it
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", cores)))
        print(json.dumps(plain_feast(values, args.clients, args.state_out)))
        return {}

    result = {"rounds": args.rounds, "clients": args.clients, "cores": cores}
    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        plain_state = Path(tmp) / "plain.npz"
        started = time.perf_counter()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "experiments.benchmarks.bench_overhead",
                "--plain-only",
                "--rounds",
                str(args.rounds),
                "--clients",
                str(args.clients),
                "--run-config",
                format_run_config(values),
                "--state-out",
                str(plain_state),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result["plain_s"] = round(time.perf_counter() - started, 1)
        plain = json.loads(out.stdout.strip().splitlines()[-1])
        result["plain_rounds_s"] = plain["rounds_s"]  # the round loop alone (training, aggregation, evaluation)
        result["plain_client_s"] = plain["client_s"]  # of which the clients' work

        subprocess.run(["flwr", "ls"], env=env, capture_output=True, timeout=300)  # start the local SuperLink
        federations = {"flower_s": f"num-supernodes={args.clients} client-resources-num-cpus={cores}"}
        if not args.no_parallel:
            federations["flower_parallel_s"] = f"num-supernodes={args.clients} client-resources-num-cpus=1"
        for key, federation in federations.items():
            out_dir = Path(tmp) / key
            started = time.perf_counter()
            _, status = flwr_run(format_run_config({**values, "output-dir": str(out_dir)}), federation, env=env)
            result[key] = round(time.perf_counter() - started, 1)
            if status != "finished:completed":
                raise RuntimeError(f"the Flower run ended {status}")
            summary = json.loads((out_dir / "summary.json").read_text())
            result[key.replace("_s", "_rounds_s")] = summary["wall_seconds"]  # the ServerApp's round loop
            with open(out_dir / "rounds.csv") as handle:  # the clients' own time inside their ClientApp calls
                result[key.replace("_s", "_client_s")] = round(
                    sum(float(r["client_seconds"]) for r in csv.DictReader(handle)), 1
                )
            if key == "flower_s":
                result["flower_accuracy"] = [t["accuracy"] for t in summary["tiers"]]
                result["plain_accuracy"] = [t["accuracy"] for t in plain["tiers"]]
                flower_state = torch.load(out_dir / "supernet.pt", weights_only=True)["state_dict"]
                with np.load(plain_state) as saved:
                    result["same_weights"] = all(np.array_equal(saved[k], flower_state[k].numpy()) for k in saved)
                result["same_result"] = bool(
                    summary["tiers"] == plain["tiers"]
                    and np.isclose(summary["population_weighted_accuracy"], plain["population_weighted_accuracy"])
                )
    result["ratio"] = round(result["flower_s"] / result["plain_s"], 3)
    # steady state: the round loops alone (start-up and shutdown excluded on both sides)
    result["rounds_ratio"] = round(result["flower_rounds_s"] / result["plain_rounds_s"], 3)
    if "flower_parallel_s" in result:
        result["ratio_parallel"] = round(result["flower_parallel_s"] / result["plain_s"], 3)
    print(json.dumps(result))
    print(
        "\n".join(
            f"{k:<20} {result[k]}"
            for k in ("plain_s", "flower_s", "flower_parallel_s", "ratio", "rounds_ratio")
            if k in result
        ),
        file=sys.stderr,
    )
    write_json_lines(args.out, [result])
    return result


if __name__ == "__main__":
    main()
