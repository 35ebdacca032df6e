"""γ study: how coupling data volume to budget (share ∝ budget^γ) moves FEAST against a baseline.

    python -m experiments.gamma --out experiments/results/gamma --methods feast,heterofl

Runs every (method, γ) with `experiments.compare`'s runner (same seed, budgets and base config) and writes
``table.csv`` (population-weighted and per-tier accuracy per method and γ), ``gamma.png`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from experiments.compare import DEFAULT_DATA, run_variants
from fl_app.outputs import write_csv, write_json


def plot(path: Path, results: dict[str, list[tuple[float, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, points in results.items():
        ax.plot([g for g, _ in points], [100 * a for _, a in points], marker="o", label=method)
    ax.set_xlabel("γ (data share ∝ budget^γ)")
    ax.set_ylabel("population-weighted accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", default="feast,heterofl")
    parser.add_argument("--gammas", default="0,0.5,1,1.5")
    parser.add_argument("--data-path", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    base = {"data-source": "local", "data-path": str(args.data_path.resolve()), "num-server-rounds": args.rounds,
            "seed": args.seed, "eval-every": 5}
    gammas = [float(g) for g in args.gammas.split(",")]
    variants = {f"{m}-gamma{g:g}": {"method": m, "gamma": g} for m in args.methods.split(",") for g in gammas}
    started = time.time()
    results = run_variants(variants, base, args.out, f"num-supernodes={args.clients} client-resources-num-cpus=1")

    table, curves = [], {}
    for r in results:
        s = r["summary"]
        method, gamma = s["method"], s["run_config"]["gamma"]
        table.append({"method": method, "gamma": gamma,
                      "population_weighted_accuracy": round(s["population_weighted_accuracy"], 4),
                      "smallest_tier_accuracy": round(s["tiers"][0]["accuracy"], 4),
                      "largest_tier_accuracy": round(s["tiers"][-1]["accuracy"], 4)})
        curves.setdefault(method, []).append((gamma, s["population_weighted_accuracy"]))
    write_csv(args.out / "table.csv", table)
    plot(args.out / "gamma.png", curves)
    summary = {"rounds": args.rounds, "clients": args.clients, "seed": args.seed, "table": table,
               "machine_seconds": round(time.time() - started, 1)}
    write_json(args.out / "summary.json", summary)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
