"""The tables as markdown text: what ``python -m fl_app.report`` prints and writes to table.md, and the tables kept
in READMEs.
"""

from __future__ import annotations

import math

from fl_app.io.cells import markdown_cell
from fl_app.report.read import CLIENT_SUBNET_ACCURACY
from fl_app.report.tables import executed_apart
from fl_app.run.stats import Estimate, format_estimate


def percent(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "–"
    return format_estimate(Estimate(mean, half, 2 if not math.isnan(half) else 1, math.nan))


def markdown(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(map(markdown_cell, header)) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(markdown_cell(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


ACCURACY_TITLES = {
    "population_weighted_accuracy": "population-weighted accuracy (%)",
    "mean_client_accuracy": "mean client accuracy (%)",
    CLIENT_SUBNET_ACCURACY: "client-subnet accuracy (%)",
}


def accuracy_markdown(table: list[dict]) -> str:
    kinds = {row["accuracy_kind"] for row in table}
    acc_header = ACCURACY_TITLES[kinds.pop()] if len(kinds) == 1 else "accuracy (%)"
    return markdown(
        ["method", "dataset", "rounds", "seeds", "tiers (MMACs)", acc_header, "MB down", "MB up", "commit"],
        [
            [
                r["method"],
                r["dataset"],
                r["rounds"],
                r["seeds"],
                r["tiers"],
                percent(r["accuracy"], r["accuracy_ci95"]),
                f"{r['mb_down']:.1f}",
                f"{r['mb_up']:.1f}",
                r["commit"],
            ]
            for r in table
        ],
    )


def paired_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "vs", "difference (points)", "seeds won", "verdict"],
        [
            [
                r["method"],
                r["reference"],
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


def convergence_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "rounds", "accuracy (%) then", "accuracy (%) last", "change (points)", "verdict"],
        [
            [
                r["method"],
                "all" if math.isnan(r["tier_mmacs"]) else f"{r['tier_mmacs']:.2f}",
                r["rounds"],
                percent(r["previous"], r["previous_ci95"]),
                percent(r["last"], r["last_ci95"]),
                signed(r["change"], r["change_ci95"]),
                r["verdict"],
            ]
            for r in table
        ],
    )


def signed(mean: float, half: float) -> str:
    text = percent(mean, half)
    return text if text.startswith(("-", "–")) else "+" + text


def compute_markdown(table: list[dict], text: str) -> str:
    return markdown(
        ["method", f"total {text}", f"budget ({text})", "accuracy (%) at the budget"],
        [
            [
                r["method"],
                f"{r['total_compute']:.4g}",
                f"{r['compute_budget']:.4g}",
                percent(r["accuracy_at_budget"], r["accuracy_at_budget_ci95"])
                + ("" if r["reached_budget"] else " (final; ran out before)"),
            ]
            for r in table
        ],
    )


def matched_markdown(table: list[dict]) -> str:
    """The matched table; with an ``executed`` column where some row's executed compute ratio differs from its
    counted one (``executed_apart``)."""
    apart = executed_apart(table)
    return markdown(
        [
            "method",
            "vs",
            "rounds",
            "compute (× vs)",
            *(["executed compute (× vs)"] if apart else []),
            "accuracy (%)",
            "difference (points)",
            "seeds won",
            "verdict",
        ],
        [
            [
                r["method"],
                r["reference"],
                r["rounds"],
                f"{r['compute_ratio']:.3f}",
                *([f"{r['compute_ratio_executed']:.3f}"] if apart else []),
                percent(r["accuracy"], r["accuracy_ci95"]),
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


MATCHED_NOTE = (
    "Matched compute: each seed trained ceil(T / f) rounds, T the client training FLOPs of vs's run of that seed, f "
    "the FLOPs per round of the method's own equal-rounds run, with its learning-rate schedule over those rounds; "
    "compute is its total over vs's (mean over seeds), and the difference is to vs's final accuracy."
)
CONVERGENCE_NOTE = (
    "Converged: each seed's last two evaluations; 'flat' when each mean lies inside the other's 95% interval over "
    "seeds (the change is paired by seed)."
)


def compute_reference_label(tables: dict) -> str | None:
    """The reference label when a row carries it (the compute budgets are then its per-seed totals), else None."""
    reference = tables.get("reference")
    return reference if any(row.first.label == reference for row in tables.get("rows", [])) else None


def compute_note(reference: str | None) -> str:
    if reference:
        return (
            f"At equal compute, each seed is read after the total of {reference}'s run of the same seed (budget: "
            f"their mean), so {reference} reads its final accuracy."
        )
    return "At equal compute, every run is read after the least total of any run."


def report_text(tables: dict) -> str:
    parts = [accuracy_markdown(tables["accuracy"])]
    if tables["paired"]:
        parts.append(paired_markdown(tables["paired"]))
    if tables["compute"]:
        parts.append(compute_markdown(tables["compute"], tables["compute_text"]))
        parts.append(compute_note(compute_reference_label(tables)))
    if tables.get("matched"):
        parts.append(matched_markdown(tables["matched"]))
        parts.append(MATCHED_NOTE)
    if tables.get("convergence"):
        parts.append(convergence_markdown(tables["convergence"]))
        parts.append(CONVERGENCE_NOTE)
    parts.append("Means over seeds with 95% t-intervals (±); differences are paired by seed.")
    return "\n\n".join(parts)


def tiers_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "accuracy (%)", "seeds", "clients affording it"],
        [
            [
                r["method"],
                f"{r['tier_mmacs']:.2f}",
                percent(r["accuracy"], r["accuracy_ci95"]),
                r["n"],
                "" if math.isnan(r["clients_affording"]) else f"{round(r['clients_affording'], 1):g}",
            ]
            for r in table
        ],
    )


def passes_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "rounds", "seeds", "passes (per seed)", "passes", "images the clients hold"],
        [
            [
                r["method"],
                r["rounds"],
                r["seeds"],
                r["passes"],
                format_estimate(Estimate(r["passes_mean"], r["passes_ci95"], r["n"], math.nan), scale=1.0),
                r["images_held"],
            ]
            for r in table
        ],
    )


def machine_time_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "rounds", "seeds", "processor", "rounds trained there", "seconds a round", "hours a seed"],
        [
            [
                r["method"],
                r["rounds"],
                r["seeds"],
                r["processor"],
                f"{r['rounds_there']:,}",
                f"{r['seconds_a_round']:.1f}",
                f"{r['hours_a_seed']:.1f}",
            ]
            for r in table
        ],
    )


def tier_gains_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "tier (MMACs)", "vs tier (MMACs)", "difference (points)", "seeds won", "verdict"],
        [
            [
                r["method"],
                f"{r['tier_mmacs']:.2f}",
                f"{r['vs_tier_mmacs']:.2f}",
                signed(r["difference"], r["difference_ci95"]),
                f"{r['wins']}/{r['n']}",
                r["verdict"],
            ]
            for r in table
        ],
    )


def budget_groups_markdown(table: list[dict]) -> str:
    return markdown(
        ["method", "budgets (MMACs)", "clients", "client-subnet accuracy (%)", "vs", "difference (points)", "verdict"],
        [
            [
                r["method"],
                f"{r['budget_from_mmacs']:.2f}+"
                if math.isnan(r["budget_to_mmacs"])
                else f"{r['budget_from_mmacs']:.2f} to {r['budget_to_mmacs']:.2f}",
                f"{r['clients']:.1f}",
                percent(r["accuracy"], r["accuracy_ci95"]),
                r["reference"],
                signed(r["difference"], r["difference_ci95"]) if "difference" in r else "",
                r.get("verdict", ""),
            ]
            for r in table
        ],
    )
