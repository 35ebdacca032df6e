"""Train the CPU-scale FEAST supernet that the extraction study cuts subnets from (a real `flwr run` of the app).

    python -m experiments.studies.train_supernet --out /abs/folder  # 40 rounds, 8 clients, real CIFAR-10 (~16 min)

One client at a time on one core (``init-args-num-cpus=1``), so it can run beside other work. The folder gets the
run's usual outputs, among them ``supernet.pt`` (the input of ``fl_app.extract`` and ``experiments.studies.frontier``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.runner import DEFAULT_DATA
from experiments.runner.flower_env import local_flower_env
from experiments.runner.flower_runs import flwr_run
from fl_app.io.cli import print_json, tool_parser


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.studies.train_supernet", __doc__)
    parser.add_argument("--out", type=Path, required=True, help="output folder of the run (must not hold results)")
    parser.add_argument("--rounds", type=int, default=40, help="federated rounds (num-server-rounds)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA, help="the real CIFAR-10 (parquet files)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    run_config = {
        "method": "feast",
        "data-source": "local",
        "data-path": str(args.data_path.resolve()),
        "num-server-rounds": args.rounds,
        "clients-per-round": 4,
        "seed": args.seed,
        "gamma": 1.0,
        "eval-every": 10,
        "checkpoint-every": 10,
        "output-dir": str(args.out.resolve()),
    }
    with local_flower_env() as env:
        run_id, status = flwr_run(
            run_config, "num-supernodes=8 client-resources-num-cpus=1 init-args-num-cpus=1", env=env, timeout=4 * 3600
        )
    result = {"run_id": run_id, "status": status, "out": str(args.out.resolve())}
    print_json(result, [result])
    if status != "finished:completed":
        raise SystemExit(f"training run ended {status}")
    return result


if __name__ == "__main__":
    main()
