"""Download traffic of FEAST routing versus sending the full supernet to every client.

    python -m experiments.studies.traffic --supernet ../shared/reference/feast/supernet-cifar100.json \
        --cache ../shared/reference/feast/subnet-cache-25M-600M.csv --clients 100 --num-seeds 20

For each seed: client budgets Zipf(a) over ranks from the cache minimum to --max-macs (±half-step jitter),
each client routed the sub-supernet spanned by the cached subnets under its budget. Bytes are what the arrays
occupy in a message (``fl_app.run.payload.payload_bytes``, equal to ``ArrayRecord.count_bytes``). Prints one JSON line:
``ratio_mean`` / ``ratio_per_seed`` = full-supernet float32 bytes / routed float32 bytes over all clients, and
``ratio_mean_bf16`` / ``ratio_per_seed_bf16`` = full-supernet float32 bytes / routed bfloat16 bytes; a short table of
the same on stderr.

``--slicing`` says which dimensions routing cuts (``SLICINGS``): ``depth-width-expansion`` is this project's routing
(depth, width and expansion ratio each cut to the envelope of the affordable cached subnets), ``depth-width`` the FEAST
repository's (depth and width cut, every block kept at full expansion, so each client receives at least as much);
``both`` (the default) reports the first under ``ratio_*`` and the second under ``depth_width``.
"""

from __future__ import annotations

import argparse

import numpy as np

from fl_app.data.partition import draw_budgets
from fl_app.io.cli import print_json, tool_parser
from fl_app.models.supernet_space import Subnet, load_supernet_config
from fl_app.run.payload import payload_bytes
from fl_app.supernet.slicing import subnet_shapes
from fl_app.supernet.subnets import SubnetCache

# --slicing value -> the sub-supernet a client receives, from its routing envelope
SLICINGS = {
    "depth-width-expansion": lambda cfg, bounds: bounds,
    "depth-width": lambda cfg, bounds: Subnet(bounds.d, cfg.max_subnet().e, bounds.w),
}


def routed_traffic(cfg, cache: SubnetCache, budgets, slicing: str = "depth-width-expansion") -> dict:
    full = payload_bytes(subnet_shapes(cfg, cfg.max_subnet()))
    routed = {"float32": 0, "bfloat16": 0}
    for budget in budgets:
        shapes = subnet_shapes(cfg, SLICINGS[slicing](cfg, cache.route_bounds(budget)))
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
    parser = supernet_parser(__doc__, clients=100, module="experiments.studies.traffic")
    parser.add_argument("--num-seeds", type=int, default=20, help="budget draws, seeds 0 .. N-1")
    parser.add_argument("--zipf-a", type=float, default=1.2, help="Zipf exponent of the budget ranks")
    parser.add_argument("--levels", type=int, default=0, help="budget ranks (0 = one per client)")
    parser.add_argument(
        "--slicing",
        choices=["both", *SLICINGS],
        default="both",
        help="dimensions routing cuts: this project's (depth-width-expansion), the FEAST repository's (depth-width)",
    )
    return parser


def ratios(cfg, cache: SubnetCache, draws: list, slicing: str) -> dict:
    """Full / routed bytes per budget draw (float32 and bfloat16 routed payloads), their mean and std."""
    per_seed, per_seed_bf16 = [], []
    for budgets in draws:
        traffic = routed_traffic(cfg, cache, budgets, slicing)
        per_seed.append(traffic["full"] / traffic["routed"])
        per_seed_bf16.append(traffic["full"] / traffic["routed_bf16"])
    return {
        "ratio_mean": float(np.mean(per_seed)),
        "ratio_std": float(np.std(per_seed)),
        "ratio_per_seed": [round(r, 3) for r in per_seed],
        "ratio_mean_bf16": float(np.mean(per_seed_bf16)),
        "ratio_std_bf16": float(np.std(per_seed_bf16)),
        "ratio_per_seed_bf16": [round(r, 3) for r in per_seed_bf16],
    }


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    cfg = load_supernet_config(args.supernet)
    cache = SubnetCache.load(cfg, args.cache or args.supernet)
    max_macs = args.max_macs or cache.max_macs
    draws = [
        draw_budgets(args.clients, cache.min_macs, max_macs, args.zipf_a, seed, args.levels)
        for seed in range(args.num_seeds)
    ]
    result = {
        "clients": args.clients,
        "seeds": args.num_seeds,
        "zipf_a": args.zipf_a,
        "max_macs": max_macs,
        "full_supernet_bytes": payload_bytes(subnet_shapes(cfg, cfg.max_subnet())),
        "mean_budget_macs": float(np.mean([np.mean(budgets) for budgets in draws])),
    }
    slicings = list(SLICINGS) if args.slicing == "both" else [args.slicing]
    table = []
    for slicing in slicings:
        measured = ratios(cfg, cache, draws, slicing)
        if slicing == "depth-width" and args.slicing == "both":  # the project's ratio keeps the top-level keys
            result["depth_width"] = {k: v for k, v in measured.items() if k != "ratio_std_bf16"}
        else:
            result.update({k: v for k, v in measured.items() if k != "ratio_std_bf16"})
            result["slicing"] = slicing
        for payload, suffix in (("float32", ""), ("bfloat16", "_bf16")):
            table.append(
                {
                    "slicing": slicing,
                    "payload": payload,
                    "ratio_mean": measured[f"ratio_mean{suffix}"],
                    "ratio_std": measured[f"ratio_std{suffix}"],
                }
            )
    print_json(result, table)
    return result


if __name__ == "__main__":
    main()
