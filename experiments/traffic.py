"""Download traffic of FEAST routing versus sending the full supernet to every client.

    python -m experiments.traffic --supernet ../shared/reference/feast/supernet-cifar100.json \
        --cache ../shared/reference/feast/subnet-cache-25M-600M.csv --clients 100 --num-seeds 20

For each seed: client budgets Zipf(a) over ranks from the cache minimum to --max-macs (±half-step jitter),
each client routed the sub-supernet spanned by the cached subnets under its budget. Bytes are what the arrays
occupy in a message (``fl_app.run.payload.payload_bytes``, equal to ``ArrayRecord.count_bytes``). Prints one JSON line:
``ratio_mean`` / ``ratio_per_seed`` = full-supernet float32 bytes / routed float32 bytes over all clients, and
``ratio_mean_bf16`` / ``ratio_per_seed_bf16`` = full-supernet float32 bytes / routed bfloat16 bytes; a short table of
the same on stderr.
"""

from __future__ import annotations

import argparse

import numpy as np

from fl_app.run.cli import print_json, tool_parser
from fl_app.run.payload import payload_bytes
from fl_app.supernet.slicing import subnet_shapes
from fl_app.supernet.space import load_supernet_config
from fl_app.supernet.subnets import SubnetCache, draw_budgets


def routed_traffic(cfg, cache: SubnetCache, budgets) -> dict:
    full = payload_bytes(subnet_shapes(cfg, cfg.max_subnet()))
    routed = {"float32": 0, "bfloat16": 0}
    for budget in budgets:
        shapes = subnet_shapes(cfg, cache.route_bounds(budget))
        for dtype in routed:
            routed[dtype] += payload_bytes(shapes, dtype)
    return {"full": full * len(budgets), "routed": routed["float32"], "routed_bf16": routed["bfloat16"]}


def supernet_parser(doc: str, clients: int, module: str | None = None) -> argparse.ArgumentParser:
    """The options every paper-scale script shares: supernet, subnet cache, number of clients, largest budget.
    ``module``: the script's module name for the usage line (unset: the module run as ``python -m``)."""
    parser = tool_parser(module, doc)
    parser.add_argument("--supernet", default="paper", help="cpu, paper or a JSON path")
    parser.add_argument("--cache", default=None, help="cpu, paper or a CSV path (unset: named like --supernet)")
    parser.add_argument("--clients", type=int, default=clients, help="number of clients")
    parser.add_argument("--max-macs", type=float, default=1.5e9, help="largest budget (0 = cache maximum)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = supernet_parser(__doc__, clients=100, module="experiments.traffic")
    parser.add_argument("--num-seeds", type=int, default=20, help="budget draws, seeds 0 .. N-1")
    parser.add_argument("--zipf-a", type=float, default=1.2, help="Zipf exponent of the budget ranks")
    parser.add_argument("--levels", type=int, default=0, help="budget ranks (0 = one per client)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    cfg = load_supernet_config(args.supernet)
    cache = SubnetCache.load(cfg, args.cache or args.supernet)
    max_macs = args.max_macs or cache.max_macs
    per_seed, per_seed_bf16, mean_budget = [], [], []
    for seed in range(args.num_seeds):
        budgets = draw_budgets(args.clients, cache.min_macs, max_macs, args.zipf_a, seed, args.levels)
        traffic = routed_traffic(cfg, cache, budgets)
        per_seed.append(traffic["full"] / traffic["routed"])
        per_seed_bf16.append(traffic["full"] / traffic["routed_bf16"])
        mean_budget.append(float(np.mean(budgets)))
    result = {
        "clients": args.clients,
        "seeds": args.num_seeds,
        "zipf_a": args.zipf_a,
        "max_macs": max_macs,
        "full_supernet_bytes": payload_bytes(subnet_shapes(cfg, cfg.max_subnet())),
        "mean_budget_macs": float(np.mean(mean_budget)),
        "ratio_mean": float(np.mean(per_seed)),
        "ratio_std": float(np.std(per_seed)),
        "ratio_per_seed": [round(r, 3) for r in per_seed],
        "ratio_mean_bf16": float(np.mean(per_seed_bf16)),
        "ratio_per_seed_bf16": [round(r, 3) for r in per_seed_bf16],
    }
    print_json(
        result,
        [
            {"payload": "float32", "ratio_mean": result["ratio_mean"], "ratio_std": result["ratio_std"]},
            {"payload": "bfloat16", "ratio_mean": result["ratio_mean_bf16"], "ratio_std": float(np.std(per_seed_bf16))},
        ],
    )
    return result


if __name__ == "__main__":
    main()
