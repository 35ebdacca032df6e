"""Accuracy-vs-MACs frontier of a trained supernet: every cached subnet beside subnets searched post hoc (no
retraining) at budgets between the run's reporting tiers.

    python -m experiments.studies.train_supernet --out /abs/run  # the supernet (or any run's)
    python -m experiments.studies.frontier --checkpoint /abs/run/supernet.pt --out experiments/results/extraction

At each budget three answers are compared: the reporting tier below it (what a tiers-only deployment serves), the
largest cached subnet under it (``fl_app.extract --from-cache``) and the search's pick (``fl_app.extract``; its first
generation holds the cached subnets under the budget). Choices use validation accuracy only; every test accuracy is
measured once per subnet, for this report. Writes ``frontier.csv`` (one row per subnet), ``budgets.csv`` (one row per
budget) and the same as the Markdown table ``budgets.md``, ``frontier.png`` and ``summary.json``; prints a line per
budget as it goes and the budgets table on stderr, and the summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from fl_app.data.provenance import file_sha256
from fl_app.extract import add_search_options, choose, load_trained
from fl_app.io.cli import print_json, tool_parser
from fl_app.io.files import write_own_file
from fl_app.models.supernet_space import count_costs
from fl_app.run.device import preferred_device
from fl_app.run.outputs import write_csv, write_json, write_text
from fl_app.supernet.evaluation import accuracy, correct_predictions, extract_subnet, recalibrate_bn
from fl_app.supernet.search import ValidationScorer
from fl_app.supernet.shared_setup import dataset_for, server_splits, server_test_set
from fl_app.supernet.subnets import SubnetCache

OUTPUTS = ("frontier.csv", "budgets.csv", "budgets.md", "frontier.png", "summary.json")  # what --out receives


def between(tier_macs: list[int], per_gap: int) -> list[float]:
    """``per_gap`` budgets log-spaced strictly inside each gap between consecutive tiers."""
    budgets = []
    for lo, hi in zip(tier_macs, tier_macs[1:]):
        inner = np.exp(np.linspace(np.log(lo), np.log(hi), per_gap + 2))[1:-1]
        budgets += [float(round(b)) for b in inner]
    return budgets


def budgets_markdown(comparison: list[dict]) -> str:
    """The per-budget comparison as a Markdown table (MMACs; accuracies in %, validation / test)."""

    def pair(row: dict, key: str) -> str:
        return f"{100 * row[key + '_val']:.1f} / {100 * row[key + '_test']:.1f}"

    lines = [
        "| budget (MMACs) | tier below: MMACs | val / test | largest cached: MMACs | val / test "
        "| searched: MMACs | val / test | searched is |",
        "| --- " * 8 + "|",
    ]
    for c in comparison:
        lines.append(
            f"| {c['budget_macs'] / 1e6:.2f} | {c['tier_macs'] / 1e6:.2f} | {pair(c, 'tier')} "
            f"| {c['cache_macs'] / 1e6:.2f} | {pair(c, 'cache')} | {c['search_macs'] / 1e6:.2f} "
            f"| {pair(c, 'search')} | {'new' if c['search_source'] == 'search' else 'a cached subnet'} |"
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, cached: list[dict], tiers: list[dict], searched: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(
        [r["macs"] / 1e6 for r in cached],
        [100 * r["test_accuracy"] for r in cached],
        c="0.6",
        s=18,
        label="cached subnets",
    )
    ax.plot(
        [r["macs"] / 1e6 for r in tiers],
        [100 * r["test_accuracy"] for r in tiers],
        "o-",
        c="tab:blue",
        label="reporting tiers",
    )
    ax.scatter(
        [r["macs"] / 1e6 for r in searched],
        [100 * r["test_accuracy"] for r in searched],
        marker="*",
        s=90,
        c="tab:red",
        label="searched (best on validation)",
        zorder=3,
    )
    ax.set_xscale("log")
    ax.set_xlabel("MMACs")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_own_file(path, image.getvalue())


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("experiments.studies.frontier", __doc__)
    parser.add_argument("--checkpoint", type=Path, required=True, help="supernet.pt of a run")
    parser.add_argument("--out", type=Path, required=True, help="folder for the tables, the plot and summary.json")
    parser.add_argument("--per-gap", type=int, default=2, help="budgets inside each gap between reporting tiers")
    add_search_options(parser, population=12, generations=5)
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out.resolve() == args.checkpoint.resolve().parent:
        parser.error("--out must not be the run's own folder")
    taken = [name for name in OUTPUTS if os.path.lexists(args.out / name)]
    if taken:
        parser.error(f"--out {args.out} already holds {', '.join(taken)}; choose a new folder (nothing is overwritten)")

    started = time.time()
    blob, run, cfg = load_trained(args.checkpoint)
    state = blob["state_dict"]
    cache = SubnetCache.load(cfg, run.subnet_cache)
    train, whole_test = dataset_for(run, cfg)
    test = server_test_set(run, whole_test)  # the images the run's tiers were scored on
    splits = server_splits(run, train)
    calibration, validation = train.subset(splits.calibration), train.subset(splits.validation)
    scorer = ValidationScorer(cfg, state, calibration, validation)

    def measured(arch, kind: str, budget: float | None = None, **extra) -> dict:
        model = extract_subnet(cfg, state, arch).to(preferred_device())
        recalibrate_bn(model, calibration.images)
        if arch not in scorer.correct:  # the search reuses it instead of scoring again
            scorer.correct[arch] = correct_predictions(model, validation)
        val_acc, test_acc = scorer(arch), accuracy(model, test)
        macs, params = count_costs(cfg, arch)
        return {
            "kind": kind,
            "budget": budget,
            "macs": macs,
            "params": params,
            "val_accuracy": val_acc,
            "test_accuracy": test_acc,
            "arch": json.dumps(arch.to_dict()),
            "source": "cache",
            "candidates": 1,
            **extra,
        }

    cached = [measured(c.arch, "cached") for c in cache.entries]
    by_arch = {c.arch: row for c, row in zip(cache.entries, cached)}
    tier_entries = cache.tiers(run.tier_targets)
    tiers = [{**by_arch[t.arch], "kind": "tier"} for t in tier_entries]
    budgets = between([t.macs for t in tier_entries], args.per_gap)

    searched, comparison = [], []
    for budget in budgets:
        t0 = time.time()
        found = choose(
            cfg,
            cache,
            budget,
            scorer,
            seed=args.seed,
            population=args.population,
            generations=args.generations,
            margin=args.margin,
        )
        row = measured(found["arch"], "searched", budget, source=found["source"], candidates=found["candidates"])
        searched.append(row)
        tier_below = max((t for t in tiers if t["macs"] <= budget), key=lambda t: t["macs"])
        local_max = by_arch[cache.local_max(budget).arch]
        comparison.append(
            {
                "budget_macs": budget,
                "tier_macs": tier_below["macs"],
                "tier_val": tier_below["val_accuracy"],
                "tier_test": tier_below["test_accuracy"],
                "cache_macs": local_max["macs"],
                "cache_val": local_max["val_accuracy"],
                "cache_test": local_max["test_accuracy"],
                "search_macs": row["macs"],
                "search_val": row["val_accuracy"],
                "search_test": row["test_accuracy"],
                "search_source": found["source"],
                "search_candidates": found["candidates"],
                "search_minus_cache_test": round(row["test_accuracy"] - local_max["test_accuracy"], 4),
                "search_minus_tier_test": round(row["test_accuracy"] - tier_below["test_accuracy"], 4),
                "seconds": round(time.time() - t0, 1),
            }
        )
        print(json.dumps(comparison[-1]), file=sys.stderr, flush=True)  # progress: one budget at a time

    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "frontier.csv", cached + tiers + searched)
    write_csv(args.out / "budgets.csv", comparison)
    write_text(args.out / "budgets.md", budgets_markdown(comparison))
    plot(
        args.out / "frontier.png",
        cached,
        tiers,
        searched,
        f"{run['method']}, {run['num-server-rounds']} rounds: post-hoc extraction",
    )
    diffs = [c["search_minus_cache_test"] for c in comparison]
    summary = {
        # no machine's absolute path in a committed summary: the file's last folders and its content hash
        "checkpoint": str(Path(*args.checkpoint.resolve().parts[-4:])),
        "checkpoint_sha256": file_sha256(args.checkpoint),
        "run_rounds": run["num-server-rounds"],
        "seed": args.seed,
        "population": args.population,
        "generations": args.generations,
        "margin": args.margin,
        "budgets": budgets,
        # a larger budget whose extracted subnet scores below a smaller budget's on test
        "larger_budget_worse_on_test": sum(
            later["search_test"] < earlier["search_test"] for earlier, later in zip(comparison, comparison[1:])
        ),
        "search_beats_cache_on_test": sum(d > 0 for d in diffs),
        "search_ties_cache_on_test": sum(d == 0 for d in diffs),
        "search_loses_to_cache_on_test": sum(d < 0 for d in diffs),
        "mean_search_minus_cache_test": float(np.mean(diffs)) if diffs else None,
        "mean_search_minus_tier_test": float(np.mean([c["search_minus_tier_test"] for c in comparison]))
        if comparison
        else None,
        "search_picked_a_cached_subnet": sum(c["search_source"] != "search" for c in comparison),
        "machine_seconds": round(time.time() - started, 1),
    }
    write_json(args.out / "summary.json", summary)
    print(budgets_markdown(comparison), file=sys.stderr)
    print_json(summary)
    return summary


if __name__ == "__main__":
    main()
