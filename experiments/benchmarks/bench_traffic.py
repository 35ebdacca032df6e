"""Download bytes per round at paper scale: FEAST routing, the full supernet to everyone, routing with bfloat16.

    python -m experiments.benchmarks.bench_traffic              # 100 clients, 10 per round, 100 rounds

Budgets come from the Zipf draw of the run (``draw_budgets``), clients per round from the strategy's seeded sampler
(``sample_partitions``), each sampled client is sent the sub-supernet its budget routes (``route_bounds``); bytes are
what the arrays occupy in the message (``payload_bytes`` = ``ArrayRecord.count_bytes``). Uploads equal downloads
(FEAST clients return what they were sent). Prints one JSON line with the mean bytes per round.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from experiments.studies.traffic import routed_traffic, supernet_parser
from fl_app.data.partition import draw_budgets
from fl_app.models.supernet_space import load_supernet_config
from fl_app.supernet.subnets import SubnetCache
from strategies.rounds import sample_partitions


def build_parser() -> argparse.ArgumentParser:
    parser = supernet_parser(__doc__, clients=100, module="experiments.benchmarks.bench_traffic")
    parser.add_argument("--per-round", type=int, default=10, help="clients sampled per round")
    parser.add_argument("--rounds", type=int, default=100, help="server rounds averaged over")
    parser.add_argument("--seed", type=int, default=0, help="seed of the budget draw and the client sampler")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    cfg = load_supernet_config(args.supernet)
    cache = SubnetCache.load(cfg, args.cache or args.supernet)
    budgets = draw_budgets(args.clients, cache.min_macs, args.max_macs or cache.max_macs, 1.2, args.seed)
    per_round = {"full": [], "routed": [], "routed_bf16": []}
    for server_round in range(1, args.rounds + 1):
        sampled = sample_partitions(range(args.clients), args.per_round, args.seed, server_round)
        traffic = routed_traffic(cfg, cache, budgets[sampled])
        for key in per_round:
            per_round[key].append(traffic[key])
    mean = {key: float(np.mean(values)) for key, values in per_round.items()}
    result = {
        "supernet": args.supernet,
        "clients": args.clients,
        "per_round": args.per_round,
        "rounds": args.rounds,
        "bytes_routed": round(mean["routed"]),
        "bytes_full": round(mean["full"]),
        "bytes_routed_bf16": round(mean["routed_bf16"]),
        "ratio_full_to_routed": round(mean["full"] / mean["routed"], 3),
        "ratio_full_to_routed_bf16": round(mean["full"] / mean["routed_bf16"], 3),
        "bytes_routed_min_round": int(min(per_round["routed"])),
        "bytes_routed_max_round": int(max(per_round["routed"])),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
