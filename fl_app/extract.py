"""Cut the best cached subnet under a MAC budget out of a trained supernet, without retraining.

    python -m fl_app.extract --checkpoint RUN/supernet.pt --macs 5e6 --out subnet.pt

Recalibrates BatchNorm on the run's calibration split, measures test accuracy, saves a standalone model
(``ElasticResNet.load_standalone(path)``, or plain ``torch.load`` for the state dict) and prints JSON
``{macs, params, accuracy, arch, out}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fl_app.config import validate_run_config
from fl_app.evaluation import accuracy, extract_subnet, recalibrate_bn
from fl_app.federation import dataset_for, server_splits
from fl_app.subnets import SubnetCache
from fl_app.supernet import SupernetConfig


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, type=Path, help="supernet.pt written by a run")
    parser.add_argument("--macs", required=True, type=float, help="inference budget in MACs, e.g. 5e6")
    parser.add_argument("--out", required=True, type=Path, help="file for the standalone subnet")
    parser.add_argument("--subnet-cache", default=None, help="cache to pick from (default: the run's)")
    args = parser.parse_args(argv)

    if not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    blob = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    run = validate_run_config(blob["run_config"])
    cfg = SupernetConfig.from_dict(blob["supernet"])
    cache = SubnetCache.load(cfg, args.subnet_cache or run.subnet_cache)
    if args.macs < cache.min_macs:
        parser.error(f"--macs {args.macs:.0f}: below the smallest cached subnet ({cache.min_macs} MACs)")
    chosen = cache.local_max(args.macs)

    model = extract_subnet(cfg, blob["state_dict"], chosen.arch)
    train, test = dataset_for(run, cfg)
    recalibrate_bn(model, train.subset(server_splits(run, train).calibration).images)
    result = {"macs": chosen.macs, "params": chosen.params, "accuracy": accuracy(model, test),
              "arch": chosen.arch.to_dict(), "out": str(args.out)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save_standalone(args.out)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
