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
With ``--shared-ray`` the Flower runs join a Ray head started before the timing (``ray_head_start_s``), as the
runner's ``--shared-ray`` keeps one per lane for a whole suite: a run then skips starting and stopping its own Ray.
``ratio`` = flower_s / plain_s (start-up included); ``rounds_ratio`` = flower_rounds_s / plain_rounds_s, the steady
state: the ServerApp's round loop against the plain loop's (start-up and shutdown excluded on both sides). The
reference regime's steady state (experiments/suites/reference-regime.toml's data and local work: 100 clients, 10 a
round, one local epoch of about 500 images; no augmentation, so that both sides draw the same batches):

    python -m experiments.benchmarks.bench_overhead --clients 100 --rounds 6 --no-parallel --run-config \\
      "data-source='local' data-path='../shared/data/cifar10' dirichlet-alpha=0.03 budget-max-factor=2.5 \\
       clients-per-round=10 max-local-steps=0 local-epochs=1 batch-size=64 lr=0.025"

Where a round's time goes (``*_phases_s``, seconds summed over the run, fl_app.run.phase_times): the Flower runs log
with Flower's DEBUG level, and the server's and the clients' phase lines are summed (``server``: dispatch, clients,
screening, aggregation, evaluation, writes; ``client``: decode, model, data, steps, encode; ``lines``: how many were
read); the plain loop times the same work under the same names (``plain_phases_s``). Flower's own cost in a round is
then what its ``clients`` phase holds beyond the clients' own phases, plus its decode and encode.

A scarce-data FedTopo-family setting (or any suite's method) has no plain loop here; ``--suite FILE --method LABEL``
runs that method through Flower alone and reports ``work_ratio``: the round loop's time over the work its phase lines
measure (server dispatch, aggregation, evaluation; clients' model, data, steps), which the FEAST comparison also
reports beside its true ``rounds_ratio`` (``flower_work_ratio``) so the two can be checked against each other:

    python -m experiments.benchmarks.bench_overhead --suite experiments/suites/fedtopo-control-scarce.toml \
      --method fedtopo --rounds 6

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
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
from experiments.runner.ray_head import ray_head
from fl_app.io.cli import run_config_overrides, tool_parser
from fl_app.io.files import write_own_file
from fl_app.run.phase_times import PhaseTimer, read_phases


def plain_feast(run_values: dict, num_clients: int, state_out: Path | None = None) -> dict:
    """FEAST without Flower: one process, clients one after another. Returns the final tiers (and saves the final
    global model to ``state_out``)."""
    from clients.feast import LocalSettings, plan_subnets, train_subnets
    from fl_app.models.elastic_resnet import ElasticResNet
    from fl_app.run.config import validate_run_config
    from fl_app.run.lr_schedule import lr_schedule
    from fl_app.run.seeds import derived_seed
    from fl_app.supernet.evaluation import TierEvaluator
    from fl_app.supernet.shared_setup import SupernetSetup, client_data, dataset_for, server_splits, server_test_set
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
        server_test_set(run, test),
        run["eval-every"],
        run["num-server-rounds"],
        lambda s: s,
        population_tier=run["population-tier"],
        # as the app's FEAST run: each client's largest affordable cached subnet scored too (evaluation is work)
        client_subnets=[setup.cache.local_max(budgets[p]) for p in sorted(budgets)],
    )
    lr_of_round = lr_schedule(run)
    started, client_seconds, timer = time.perf_counter(), 0.0, PhaseTimer()
    for server_round in range(1, run["num-server-rounds"] + 1):
        updates = []
        for pid in sample_partitions(range(num_clients), run.clients_per_round(num_clients), run["seed"], server_round):
            client_started = time.perf_counter()
            bounds = setup.cache.route_bounds(budgets[pid])
            routed = slice_state(state, subnet_shapes(setup.cfg, bounds))
            timer.lap("dispatch")
            model = ElasticResNet(setup.cfg, bounds)
            model.load_state_dict({k: torch.from_numpy(v) for k, v in routed.items()}, strict=False)
            plan = plan_subnets(setup.cache, budgets[pid], bounds, run.train_subnets)
            timer.lap("model")
            data = client_data(run, pid, num_clients)
            settings = LocalSettings.from_run(
                run, lr_of_round(server_round), derived_seed(run["seed"], server_round, pid)
            )
            timer.lap("data")
            train_subnets(model, plan, data, settings)
            timer.lap("steps")
            trained = {
                k: v.numpy()
                for k, v in slice_state(model.state_dict(), {k: v.shape for k, v in routed.items()}).items()
            }
            updates.append((trained, len(data)))
            timer.lap("encode")
            client_seconds += time.perf_counter() - client_started
        state = sparse_average(state, updates)
        timer.lap("aggregation")
        evaluator(server_round, state)
        timer.lap("evaluation")
    if state_out is not None:
        write_own_file(state_out, lambda out: np.savez(out, **state))
    return {
        "tiers": evaluator.last["tiers"],
        "population_weighted_accuracy": evaluator.last["population_weighted_accuracy"],
        "client_subnet_accuracy": evaluator.last["client_subnet_accuracy"],
        "rounds_s": round(time.perf_counter() - started, 1),
        "client_s": round(client_seconds, 1),
        "phases_s": {name: round(seconds, 2) for name, seconds in timer.seconds.items()},
    }


# DEBUG: the server's and the clients' phase lines reach the run's log (Ray folds similar lines unless told not to)
PHASE_LOG_ENV = {"FLWR_LOG_LEVEL": "DEBUG", "RAY_DEDUP_LOGS": "0"}
# the phases a plain loop also has (the work); the rest of a Flower round is what Flower and the app's bookkeeping add
WORK_PHASES = {"server": ("dispatch", "aggregation", "evaluation"), "client": ("model", "data", "steps")}


def logged_phases(log_file: Path) -> dict:
    """The run's phase lines summed per side, in seconds (fl_app.run.phase_times.read_phases)."""
    found = read_phases(log_file.read_text(errors="replace"))
    return {side: {name: round(v, 2) for name, v in totals.items()} for side, totals in found.items()}


def work_ratio(rounds_s: float, phases: dict) -> float | None:
    """The round loop's wall time over the work inside it (WORK_PHASES): how far the rounds are from a plain loop
    doing the same work, where no plain loop exists (the model-heterogeneous methods). Exact only when clients train
    one at a time (their phases then add up in wall time); None without phase lines."""
    if not phases["server"]["lines"]:
        return None
    work = sum(phases[side].get(name, 0.0) for side, names in WORK_PHASES.items() for name in names)
    return round(rounds_s / work, 3) if work > 0 else None


def phased_flower_run(run_config: str | dict, federation: str, env: dict, out_dir: Path) -> dict:
    """One `flwr run` with its phases logged (``env`` holds PHASE_LOG_ENV) into ``out_dir``: its wall seconds, the
    ServerApp's round loop, the summed phase lines, the work ratio, and its summary (an error unless completed)."""
    log_file = out_dir.with_suffix(".log")
    started = time.perf_counter()
    _, status = flwr_run(run_config, federation, env=env, log_file=log_file)
    seconds = round(time.perf_counter() - started, 1)
    if status != "finished:completed":
        raise RuntimeError(f"the Flower run ended {status}")
    summary = json.loads((out_dir / "summary.json").read_text())
    phases = logged_phases(log_file)
    return {
        "s": seconds,
        "rounds_s": summary["wall_seconds"],  # the ServerApp's round loop
        "phases_s": phases,
        "work_ratio": work_ratio(summary["wall_seconds"], phases),
        "summary": summary,
    }


def suite_steady_state(suite_file: Path, label: str, rounds: int) -> dict:
    """One Flower run of a suite's method (seed 0, ``rounds`` rounds, its [base] and [federation] otherwise) with its
    phases logged: the round loop's seconds, the split, and ``work_ratio``."""
    from experiments.runner.planning import expand, federation_text
    from experiments.runner.suite import load_suite

    suite = load_suite(suite_file, seeds=[0], methods=[label], overrides={"num-server-rounds": rounds})
    run = next(r for r in expand(suite) if r.label == label)
    result = {"suite": str(suite_file), "method": label, "rounds": rounds, "federation": run.federation}
    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        env = {**env, **PHASE_LOG_ENV}
        subprocess.run(["flwr", "ls"], env=env, capture_output=True, timeout=300)  # start the local SuperLink
        run.folder = Path(tmp) / "run"
        flower = phased_flower_run(run.launch_config(), federation_text(run.federation), env, run.folder)
        result.update(
            flower_s=flower["s"],
            flower_rounds_s=flower["rounds_s"],
            flower_phases_s=flower["phases_s"],
            work_ratio=flower["work_ratio"],
        )
    return result


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
    parser.add_argument(
        "--suite",
        type=Path,
        help="instead of the FEAST comparison: one Flower run of this suite file's --method (its [base], method and "
        "[federation], seed 0, --rounds rounds), its steady state split by phase and its work_ratio (default: off)",
    )
    parser.add_argument("--method", help="the suite's method label for --suite, e.g. fedtopo")
    parser.add_argument(
        "--shared-ray",
        action="store_true",
        help="the Flower runs join a Ray head started before the timing, as the runner's --shared-ray does once per "
        "lane for a suite (default: each run starts its own Ray)",
    )
    add_out_option(parser)
    parser.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)  # the plain side, internal
    parser.add_argument("--state-out", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_existing_out(parser, args.out)
    if (args.suite is None) != (args.method is None):
        parser.error("--suite and --method go together (a suite file and one of its method labels)")
    if args.suite is not None:
        result = suite_steady_state(args.suite, args.method, args.rounds)
        print(json.dumps(result))
        write_json_lines(args.out, [result])
        return result
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

    result = {"rounds": args.rounds, "clients": args.clients, "cores": cores, "ray": "own Ray per run"}
    with contextlib.ExitStack() as stack:
        flower_extra = {}
        if args.shared_ray:  # started (and its start timed) before either side, so that it loads neither
            started = time.perf_counter()
            head = stack.enter_context(ray_head(cores, env=PHASE_LOG_ENV))  # the actors log their phases
            result.update(ray="one Ray head for the runs", ray_head_start_s=round(time.perf_counter() - started, 1))
            flower_extra["RAY_ADDRESS"] = head.address
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        env = stack.enter_context(local_flower_env(**flower_extra))
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
        result["plain_phases_s"] = plain["phases_s"]  # the same phases as the Flower run's (fl_app.run.phase_times)

        env = {**env, **PHASE_LOG_ENV}

        subprocess.run(["flwr", "ls"], env=env, capture_output=True, timeout=300)  # start the local SuperLink
        federations = {"flower_s": f"num-supernodes={args.clients} client-resources-num-cpus={cores}"}
        if not args.no_parallel:
            federations["flower_parallel_s"] = f"num-supernodes={args.clients} client-resources-num-cpus=1"
        for key, federation in federations.items():
            out_dir = Path(tmp) / key
            flower = phased_flower_run({**values, "output-dir": str(out_dir)}, federation, env, out_dir)
            summary = flower["summary"]
            result[key] = flower["s"]
            result[key.replace("_s", "_rounds_s")] = flower["rounds_s"]
            with open(out_dir / "rounds.csv") as handle:  # the clients' own time inside their ClientApp calls
                result[key.replace("_s", "_client_s")] = round(
                    sum(float(r["client_seconds"]) for r in csv.DictReader(handle)), 1
                )
            result[key.replace("_s", "_phases_s")] = flower["phases_s"]
            result[key.replace("_s", "_work_ratio")] = flower["work_ratio"]
            if key == "flower_s":
                result["flower_accuracy"] = [t["accuracy"] for t in summary["tiers"]]
                result["plain_accuracy"] = [t["accuracy"] for t in plain["tiers"]]
                flower_state = torch.load(out_dir / "supernet.pt", weights_only=True)["state_dict"]
                with np.load(plain_state) as saved:
                    result["same_weights"] = all(np.array_equal(saved[k], flower_state[k].numpy()) for k in saved)
                result["same_result"] = bool(
                    summary["tiers"] == plain["tiers"]
                    and np.isclose(summary["population_weighted_accuracy"], plain["population_weighted_accuracy"])
                    and np.isclose(summary["client_subnet_accuracy"], plain["client_subnet_accuracy"])
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
