"""Two FEAST rounds of the paper config (experiments/conf/feast-cifar100.toml) through `flwr run`, on synthetic
CIFAR-100-shaped data, with a GPU fraction per client when the machine has CUDA. Part of
experiments/benchmarks/gpu_check.sh.

    python -m experiments.benchmarks.gpu_check_feast         # CUDA: paper supernet, 4 clients, num-gpus=0.25 each
    python -m experiments.benchmarks.gpu_check_feast --tiny  # CPU: CPU-scale supernet, small data, no GPU fraction

Synthetic data (random 32x32 images, 100 classes) written as parquet files and read with ``data-source='local'``:
the check is about the run completing on the device (placement, GPU fractions, memory), not about accuracy.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path

from experiments.runner.flower_env import local_flower_env
from experiments.runner.flower_runs import flwr_run
from fl_app.io.cli import tool_parser

PAPER_CONFIG = Path(__file__).resolve().parents[1] / "conf" / "feast-cifar100.toml"


def write_synthetic_cifar100(folder: Path, train: int, test: int, seed: int = 0) -> None:
    """train.parquet / test.parquet with CIFAR-100's columns (``img`` PNG, ``fine_label``)."""
    import datasets
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    features = datasets.Features({"img": datasets.Image(), "fine_label": datasets.Value("int64")})
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        images = [Image.fromarray(a) for a in rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)]
        labels = (np.arange(n) % 100).tolist()  # every class present, so stratified splits work at any size
        datasets.Dataset.from_dict({"img": images, "fine_label": labels}, features=features).to_parquet(
            str(folder / f"{split}.parquet")
        )


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.benchmarks.gpu_check_feast", __doc__)
    parser.add_argument("--tiny", action="store_true", help="CPU sizes: CPU supernet, 200 images per client")
    parser.add_argument("--clients", type=int, default=4, help="simulated clients")
    parser.add_argument("--num-gpus", type=float, default=0.25, help="client-resources-num-gpus (0 on CPU)")
    parser.add_argument("--num-cpus", type=int, default=1, help="client-resources-num-cpus")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    values = tomllib.loads(PAPER_CONFIG.read_text())
    sizes = (
        {"train": 600, "test": 200, "val": 100, "calib": 100}
        if args.tiny
        else {"train": 8000, "test": 1000, "val": 500, "calib": 500}
    )
    values.update(
        {
            "num-server-rounds": 2,
            "clients-per-round": args.clients,
            "eval-every": 2,
            "checkpoint-every": 0,
            "max-local-steps": 2 if args.tiny else 10,
            "data-source": "local",
            "val-size": sizes["val"],
            "calib-size": sizes["calib"],
        }
    )
    if args.tiny:  # the paper supernet's budgets and tiers do not exist in the CPU-scale cache
        values.update(
            {
                "supernet": "cpu",
                "subnet-cache": "cpu",
                "budget-max-macs": 0.0,
                "tiers": "",
                "batch-size": 8,
                "randaugment": False,
            }
        )
    federation = f"num-supernodes={args.clients} client-resources-num-cpus={args.num_cpus}"
    if args.num_gpus > 0:
        federation += f" client-resources-num-gpus={args.num_gpus}"
    with tempfile.TemporaryDirectory() as tmp, local_flower_env() as env:
        data = Path(tmp) / "data"
        write_synthetic_cifar100(data, sizes["train"], sizes["test"])
        out_dir = Path(tmp) / "run"
        values.update({"data-path": str(data), "output-dir": str(out_dir)})
        started = time.perf_counter()
        log_file = Path(tmp) / "flwr.log"
        _, status = flwr_run(
            values, federation, env={**env, "FL_APP_CACHE": str(Path(tmp) / "cache")}, timeout=600, log_file=log_file
        )
        wall = time.perf_counter() - started
        result = {
            "part": "feast_rounds",
            "status": status,
            "rounds": 2,
            "clients": args.clients,
            "federation": federation,
            "supernet": values["supernet"],
            "batch": values["batch-size"],
            "wall_s": round(wall, 1),
        }
        if status == "finished:completed":
            summary = json.loads((out_dir / "summary.json").read_text())
            result["tiers"] = [{"macs": t["macs"], "accuracy": t["accuracy"]} for t in summary["tiers"]]
            result["server_round_s"] = summary["wall_seconds"]
        else:
            result["log_tail"] = log_file.read_text()[-2000:]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
