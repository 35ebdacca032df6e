"""Label skew and budgets of the reference's regime, and the CIFAR-10 split that matches it at CPU scale.

    python -m experiments.studies.label_skew --out experiments/results/reference-regime

The reference (CIFAR-100, 100 clients, Dir(α·N_k·q) at α = 0.1, γ = 1, Zipf(1.2) budgets from the paper cache's
smallest subnet to 1.5 GMAC, capped at 600 MMAC in the γ shares) is drawn with the project's own γ-allocation on
balanced CIFAR-100 labels (500 a class); CIFAR-10 at each ``--alphas`` value is the split a run of
``experiments/suites/reference-regime.toml`` draws (the real training labels, the server's held-out rows removed,
budgets Zipf(1.2) up to ``--factor`` x the CPU supernet). Each client's label entropy is divided by log2(classes)
(relative skew: 1 = every class equally, 0 = one class). The chosen α is the one whose mean and spread (std) of the
relative entropy over clients and ``--seeds`` are nearest the reference's (Euclidean in (mean, std)).

Writes ``label_skew.csv`` (one row per split: relative entropy mean / std / quantiles, classes held, partition
sizes), ``budgets.csv`` (per seed: budgets above the whole supernet / the reference cache's top),
``label_entropy.png``, ``budgets.png`` and ``label_skew.json`` (also printed) into ``--out``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from fl_app.data.partition import GammaAllocation, draw_budgets
from fl_app.io.cli import comma_list, tool_parser
from fl_app.io.files import write_new_file
from fl_app.models.supernet_space import load_supernet_config
from fl_app.report.plots import png_bytes, pyplot
from fl_app.run.config import validate_run_config
from fl_app.run.outputs import write_csv, write_json
from fl_app.supernet.subnets import SubnetCache

CLIENTS = 100
# the reference's CIFAR-100 run (03_cifar100/FEAST_cifar100.sh): its split, budgets and γ cap
REFERENCE = {"classes": 100, "per_class": 500, "alpha": 0.1, "max_budget": 1.5e9, "max_training_macs": 6e8}
ZIPF_A = 1.2


def relative_entropy(labels: np.ndarray, classes: int) -> tuple[float, int]:
    """(label entropy / log2(classes), number of classes held) of one client's labels."""
    counts = np.bincount(labels, minlength=classes)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum() / math.log2(classes)), int((counts > 0).sum())


def describe(name: str, alpha: float, clients: list[tuple[float, int, int]]) -> dict:
    """One split's row: relative entropy over clients (mean, std, quantiles), classes held and sizes."""
    rel, held, sizes = (np.array(column, dtype=float) for column in zip(*clients))
    return {
        "split": name,
        "alpha": alpha,
        "clients": len(rel),
        "rel_entropy_mean": round(float(rel.mean()), 4),
        "rel_entropy_std": round(float(rel.std()), 4),
        "rel_entropy_p10": round(float(np.quantile(rel, 0.1)), 4),
        "rel_entropy_p50": round(float(np.quantile(rel, 0.5)), 4),
        "rel_entropy_p90": round(float(np.quantile(rel, 0.9)), 4),
        "rel_entropy_size_weighted": round(float((rel * sizes).sum() / sizes.sum()), 4),
        "classes_held_mean": round(float(held.mean()), 2),
        "classes_held_p10": float(np.quantile(held, 0.1)),
        "classes_held_p90": float(np.quantile(held, 0.9)),
        "size_min": int(sizes.min()),
        "size_median": int(np.median(sizes)),
        "size_max": int(sizes.max()),
    }


def reference_clients(seed: int) -> list[tuple[float, int, int]]:
    """The reference's split with its budgets: balanced CIFAR-100 labels, Dir(α·N_k·q), γ = 1, capped at 600M."""
    cache = SubnetCache.load(load_supernet_config("paper", n_classes=REFERENCE["classes"]), "paper")
    budgets = draw_budgets(CLIENTS, cache.min_macs, REFERENCE["max_budget"], ZIPF_A, seed)
    labels = np.repeat(np.arange(REFERENCE["classes"]), REFERENCE["per_class"])
    allocation = GammaAllocation(
        budgets, 1.0, REFERENCE["alpha"], REFERENCE["max_training_macs"], seed=seed, concentration="class-size"
    )
    return [(*relative_entropy(labels[rows], REFERENCE["classes"]), len(rows)) for rows in allocation.draw(labels)]


def suite_run(alpha: float, seed: int, factor: float, data_path: str):
    return validate_run_config(
        {
            "data-source": "local",
            "data-path": data_path,
            "partitioner": "gamma-class-size",
            "gamma": 1.0,
            "dirichlet-alpha": alpha,
            "budget-max-factor": factor,
            "seed": seed,
        }
    )


def cifar10_clients(alpha: float, seed: int, factor: float, data_path: str) -> list[tuple[float, int, int]]:
    """The split a reference-regime suite run draws (the project's own partition code, real labels)."""
    from fl_app.supernet.shared_setup import SupernetSetup, dataset_for, partition_rows

    run = suite_run(alpha, seed, factor, data_path)
    labels = dataset_for(run, SupernetSetup.build(run, CLIENTS).cfg)[0].labels.numpy()
    return [(*relative_entropy(labels[rows], 10), len(rows)) for rows in partition_rows(run, CLIENTS)]


def budget_rows(seeds: list[int], factor: float, data_path: str) -> tuple[list[dict], dict]:
    """Per seed: the share of clients above the whole CPU supernet (suite) and above the reference cache's top."""
    from fl_app.supernet.shared_setup import SupernetSetup

    paper = SubnetCache.load(load_supernet_config("paper", n_classes=REFERENCE["classes"]), "paper")
    rows, drawn = [], {}
    for seed in seeds:
        setup = SupernetSetup.build(suite_run(1.0, seed, factor, data_path), CLIENTS)
        reference = draw_budgets(CLIENTS, paper.min_macs, REFERENCE["max_budget"], ZIPF_A, seed)
        drawn[seed] = setup.budgets / setup.supernet_macs
        rows.append(
            {
                "seed": seed,
                "supernet_macs": setup.supernet_macs,
                "max_budget_macs": round(float(setup.budgets.max())),
                "share_above_supernet": float(np.mean(setup.budgets > setup.supernet_macs)),
                "share_at_cache_min": float(np.mean(setup.budgets < 1.01 * setup.cache.min_macs)),
                "reference_share_above_cache_top": float(np.mean(reference > paper.max_macs)),
            }
        )
    return rows, drawn


def plot_entropies(path: Path, splits: dict[str, list[float]], chosen: str) -> None:
    """Histogram of every split's per-client relative label entropy (the first split is the reference)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.linspace(0, 1, 41)
    for i, (name, values) in enumerate(splits.items()):
        if i == 0:  # the reference, filled; the CIFAR-10 candidates as outlines over it
            ax.hist(values, bins=bins, color="0.75", label=name)
        else:
            ax.hist(values, bins=bins, histtype="step", linewidth=2.5 if name == chosen else 1.0, label=name)
    ax.set_xlabel("label entropy / log2(classes) per client")
    ax.set_ylabel("clients (all seeds)")
    ax.legend(fontsize=8)
    write_new_file(path, png_bytes(fig))


def plot_budgets(path: Path, drawn: dict[int, np.ndarray], factor: float) -> None:
    """Histogram of the drawn budgets (all seeds) in units of the whole supernet."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(np.concatenate(list(drawn.values())), bins=np.linspace(0, factor, 51), color="tab:blue")
    ax.axvline(1.0, color="black", linestyle="--", label="whole supernet")
    ax.set_xlabel("client budget / whole CPU supernet MACs")
    ax.set_ylabel(f"clients ({len(drawn)} seeds x {CLIENTS})")
    ax.set_title(f"Zipf({ZIPF_A}) budgets up to {factor:g}x the supernet")
    ax.legend()
    write_new_file(path, png_bytes(fig))


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("experiments.studies.label_skew", __doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSVs, plots and JSON")
    parser.add_argument("--alphas", type=comma_list(float), default=[1.0, 0.1, 0.05, 0.03, 0.02, 0.01, 0.003])
    parser.add_argument("--seeds", type=comma_list(int), default=[0, 1, 2])
    parser.add_argument("--factor", type=float, default=2.5, help="budget-max-factor of the suite")
    parser.add_argument("--data-path", default="../shared/data/cifar10", help="CIFAR-10 parquet folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    pooled = {"reference cifar100 α=0.1": [c for s in args.seeds for c in reference_clients(s)]}
    alphas, refused = [REFERENCE["alpha"]], {}
    for alpha in args.alphas:
        try:
            drawn_splits = [cifar10_clients(alpha, s, args.factor, args.data_path) for s in args.seeds]
        except ValueError as err:  # the γ-allocation found no draw giving every client >= 10 samples
            refused[f"{alpha:g}"] = str(err)
            continue
        pooled[f"cifar10 α={alpha:g}"] = [c for clients in drawn_splits for c in clients]
        alphas.append(alpha)
    rows = [describe(name, alpha, clients) for (name, clients), alpha in zip(pooled.items(), alphas)]
    reference, candidates = rows[0], rows[1:]
    for row in candidates:
        row["distance_to_reference"] = round(
            math.hypot(
                row["rel_entropy_mean"] - reference["rel_entropy_mean"],
                row["rel_entropy_std"] - reference["rel_entropy_std"],
            ),
            4,
        )
    reference["distance_to_reference"] = 0.0
    chosen = min(candidates, key=lambda r: r["distance_to_reference"])
    budgets, drawn = budget_rows(args.seeds, args.factor, args.data_path)

    result = {
        "seeds": args.seeds,
        "clients": CLIENTS,
        "splits": rows,
        "chosen_alpha": chosen["alpha"],
        "alphas_without_a_split": refused,
        "budgets": budgets,
        "share_above_supernet_mean": round(float(np.mean([b["share_above_supernet"] for b in budgets])), 4),
        "reference_share_above_cache_top_mean": round(
            float(np.mean([b["reference_share_above_cache_top"] for b in budgets])), 4
        ),
    }
    write_csv(args.out / "label_skew.csv", rows)
    write_csv(args.out / "budgets.csv", budgets)
    write_json(args.out / "label_skew.json", result)
    shown = {name: [c[0] for c in clients] for name, clients in pooled.items()}
    plot_entropies(args.out / "label_entropy.png", shown, chosen["split"])
    plot_budgets(args.out / "budgets.png", drawn, args.factor)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
