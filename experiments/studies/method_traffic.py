"""Bytes down/up per round for every supernet method, at paper scale and at CPU scale (analytic, no training).

    python -m experiments.studies.method_traffic --out experiments/results/traffic

Uses each method's own strategy to decide what every sampled client receives and returns (the same ``assign`` and
``routed_shapes`` the Flower runs use) and ``fl_app.run.payload.payload_bytes`` for the bytes a message carries.
Paper scale: paper supernet and cache, 100 clients, 10 per round, budgets Zipf(1.2) from the cache minimum to
1.5 GMAC. CPU scale: the default run (8 clients, 4 per round). Writes ``traffic.csv``, the same numbers as the
Markdown table ``traffic.md`` (pasted as is into experiments/README.md), and prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from fl_app.io.cli import print_json, tool_parser
from fl_app.run.config import SUPERNET_METHODS, validate_run_config
from fl_app.run.outputs import write_csv, write_text
from fl_app.run.payload import payload_bytes
from fl_app.run.round_log import RoundLog
from fl_app.supernet.shared_setup import SupernetSetup
from strategies.rounds import sample_partitions

SCALES = {
    "paper": {
        "supernet": "paper",
        "dataset": "cifar100",
        "data-source": "hub",
        "clients-per-round": 10,
        "budget-max-macs": 1.5e9,
        "clients": 100,
    },
    "cpu": {"clients": 8},
}


def per_round_traffic(method: str, scale: dict, rounds: int, seed: int) -> dict:
    from fl_app.supernet_app import make_supernet_strategy  # the app's own wiring of each method

    clients = scale["clients"]
    run = validate_run_config(
        {
            **{k: v for k, v in scale.items() if k != "clients"},
            "method": method,
            "seed": seed,
            "num-server-rounds": rounds,
        }
    )
    setup = SupernetSetup.build(run, clients)
    budgets = setup.client_budgets(run, {})
    strategy = make_supernet_strategy(run, setup, budgets, {p: p for p in range(clients)})
    down, up = [], []
    for rnd in range(1, rounds + 1):
        sampled = sample_partitions(range(clients), run.clients_per_round(clients), seed, rnd)
        strategy.rounds[rnd] = RoundLog(sampled=sampled)
        round_down = round_up = 0
        for pid in sampled:
            bounds, arch = strategy.assign(pid, rnd)
            sent = strategy.routed_shapes(bounds)
            returned = sent if arch is None else {k: v for k, v in strategy.routed_shapes(arch).items() if k in sent}
            round_down += payload_bytes(sent, run["payload-dtype"])
            round_up += payload_bytes(returned, run["payload-dtype"])
        down.append(round_down)
        up.append(round_up)
    return {"bytes_down_per_round": float(np.mean(down)), "bytes_up_per_round": float(np.mean(up))}


def traffic_markdown(rows: list[dict]) -> str:
    """One line per method: MB down/up per round at each scale."""
    scales = list(dict.fromkeys(r["scale"] for r in rows))
    cell = {(r["scale"], r["method"]): r for r in rows}
    lines = [
        "| method | " + " | ".join(f"{s} scale down | {s} scale up" for s in scales) + " |",
        "| --- " * (1 + 2 * len(scales)) + "|",
    ]
    for method in dict.fromkeys(r["method"] for r in rows):
        values = [v for s in scales for v in (cell[s, method]["mb_down_per_round"], cell[s, method]["mb_up_per_round"])]
        lines.append(f"| {method} | " + " | ".join(str(v) for v in values) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.studies.method_traffic", __doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for traffic.csv and traffic.md")
    parser.add_argument("--rounds", type=int, default=20, help="rounds averaged over")
    parser.add_argument("--seed", type=int, default=0, help="seed of budgets and sampling")
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    taken = [name for name in ("traffic.csv", "traffic.md") if os.path.lexists(args.out / name)]
    if taken:
        parser.error(f"--out {args.out} already holds {', '.join(taken)}; choose a new folder (nothing is overwritten)")
    rows = []
    for scale_name, scale in SCALES.items():
        for method in SUPERNET_METHODS:
            traffic = per_round_traffic(method, scale, args.rounds, args.seed)
            rows.append(
                {
                    "scale": scale_name,
                    "method": method,
                    "mb_down_per_round": round(traffic["bytes_down_per_round"] / 1e6, 2),
                    "mb_up_per_round": round(traffic["bytes_up_per_round"] / 1e6, 2),
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "traffic.csv", rows)
    write_text(args.out / "traffic.md", traffic_markdown(rows))
    print_json(rows, rows)
    return rows


if __name__ == "__main__":
    main()
