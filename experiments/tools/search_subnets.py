"""Search a subnet cache for a supernet under MAC targets and write it as CSV.

Fitness (no trained accuracy predictor exists before training, so a cost-only proxy): among subnets that use between
90% and 100% of a target's MACs, prefer the most parameters (capacity), ties broken by depth. The search is an
evolutionary loop: random subnets, then mutations (one d/e/w entry moved by one step) of the best per target.
The supernet's minimum and maximum subnets are always included as the cache's endpoints.

    python -m experiments.tools.search_subnets --supernet cpu --targets 20 --out fl_app/supernet_configs/cpu-cache.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fl_app.io.cli import print_json, tool_parser
from fl_app.io.files import existing_output
from fl_app.models.supernet_space import Subnet, SupernetConfig, count_costs, load_supernet_config
from fl_app.supernet.subnets import CachedSubnet, random_subnet, write_cache


def mutate(cfg: SupernetConfig, arch: Subnet, rng: np.random.Generator) -> Subnet:
    d, e, w = list(arch.d), list(arch.e), list(arch.w)
    which = rng.integers(3)
    step = int(rng.choice([-1, 1]))
    if which == 0:
        i = rng.integers(len(d))
        d[i] = int(np.clip(d[i] + step, 0, cfg.max_extra_blocks_per_stage))
    elif which == 1:
        i = rng.integers(len(e))
        choices = list(cfg.expansion_ratio_choices)
        e[i] = choices[int(np.clip(choices.index(e[i]) + step, 0, len(choices) - 1))]
    else:
        i = rng.integers(len(w))
        w[i] = int(np.clip(w[i] + step, 0, len(cfg.width_multiplier_choices) - 1))
    return Subnet(d, e, w)


def fitness(cfg: SupernetConfig, arch: Subnet, target: float) -> tuple | None:
    macs, params = count_costs(cfg, arch)
    if not 0.9 * target <= macs <= target:
        return None
    return params, sum(arch.d)


def search(cfg: SupernetConfig, num_targets: int, seed: int, population: int = 3000, generations: int = 30):
    rng = np.random.default_rng(seed)
    lo, hi = count_costs(cfg, cfg.min_subnet())[0], count_costs(cfg, cfg.max_subnet())[0]
    targets = np.exp(np.linspace(np.log(lo), np.log(hi), num_targets))[1:-1]
    pool = [random_subnet(cfg, rng) for _ in range(population)]
    best: dict[int, tuple] = {}
    for _ in range(generations):
        for arch in pool:
            for t_i, target in enumerate(targets):
                score = fitness(cfg, arch, target)
                if score is not None and (t_i not in best or score > best[t_i][0]):
                    best[t_i] = (score, arch)
        parents = [arch for _, arch in best.values()] or pool[:10]
        pool = [mutate(cfg, parents[rng.integers(len(parents))], rng) for _ in range(population // 3)]
        pool += [random_subnet(cfg, rng) for _ in range(population // 10)]
    chosen = {cfg.min_subnet(), cfg.max_subnet(), *(arch for _, arch in best.values())}
    entries = [CachedSubnet(a, *count_costs(cfg, a)) for a in chosen]
    return sorted(entries, key=lambda c: c.macs)


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.tools.search_subnets", __doc__)
    parser.add_argument("--supernet", default="cpu", help="cpu, paper or a JSON path")
    parser.add_argument("--targets", type=int, default=20, help="number of MAC targets, log-spaced min..max")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search")
    parser.add_argument("--out", required=True, type=Path, help="the cache CSV to write")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = existing_output(args.out)
    if problem:
        parser.error(problem)
    cfg = load_supernet_config(args.supernet)
    entries = search(cfg, args.targets, args.seed)
    write_cache(args.out, entries)
    print_json(
        {"subnets": len(entries), "min_macs": entries[0].macs, "max_macs": entries[-1].macs, "out": str(args.out)},
        [{"macs": e.macs, "params": e.params} for e in entries],
    )


if __name__ == "__main__":
    main()
