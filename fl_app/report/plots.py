"""The report's plots: what each shows is in its title, with the setting and how many seeds its bands stand on.

- ``accuracy_per_round.png``: mean accuracy per evaluated round, band = 95 % t-interval over the seeds (clipped to
  [0, 100] %); a row with fewer than 3 seeds shows each seed as a dot instead of a band. Rows with different round
  counts get one panel per round count instead of sharing an x axis.
- ``accuracy_per_round_per_tier.png`` (supernet methods): each tier's test accuracy per evaluated round, a panel per
  method, a line per tier (darker = larger), bands or dots as above: whether larger tiers pay and each has flattened.
- ``paired_difference.png`` (with a reference): each row minus the reference of its grid cell, paired by seed (same
  partitions, budgets and sampling): the final accuracy and the difference at every round both evaluated.
- ``accuracy_vs_compute.png``: accuracy against cumulative client compute, one mean line per row (each seed faint);
  only when every run recorded a compute quantity (``fl_app.report.tables.compute_column``).
- ``accuracy_vs_macs.png``: each tier's test accuracy after the last round (supernet methods).
- ``traffic.png``: MB down / up per run.
- ``clients_<label>_seed<N>.png`` (``fl_app.report --clients``): every client's training labels and its budget
  (supernet methods) or model (model-heterogeneous methods).

matplotlib is imported here only, on first use, with the Agg backend (no display needed).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from fl_app.report.rows import rounds_text
from fl_app.report.tables import compute_column
from fl_app.report.text import ACCURACY_TITLES, compute_reference_label
from fl_app.run.stats import paired_difference

BAND_ALPHA = 0.12
MIN_SEEDS_FOR_BAND = 3  # below this the t-interval is too wide to draw (±12.7 sd at 2 seeds): each seed is a dot


def accuracy_band(points, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 95 % interval around accuracies ``y`` (in %) from ``points``' ``accuracy_ci95``, clipped to [0, 100] %."""
    half = 100 * np.nan_to_num(points["accuracy_ci95"].to_numpy())
    return np.clip(y - half, 0, 100), np.clip(y + half, 0, 100)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return buffer.getvalue()


# -- shared pieces -------------------------------------------------------------------------------------------------
def _joined(values) -> str:
    distinct = sorted(
        set(values), key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v))
    )
    return " or ".join(str(v) for v in distinct)


def setting_text(rows) -> str:
    """'cifar10 · 8 clients, 4 per round · 20 or 100 rounds' from the runs' summaries."""
    summaries = [row.first.summary for row in rows]
    parts = [_joined(s.get("dataset", "?") for s in summaries)]
    clients = _joined(s.get("num_clients", "?") for s in summaries)
    per_round = [s.get("clients_per_round") for s in summaries if s.get("clients_per_round") is not None]
    parts.append(f"{clients} clients" + (f", {_joined(per_round)} per round" if per_round else ""))
    parts.append(f"{_joined(s.get('rounds', '?') for s in summaries)} rounds")
    return " · ".join(parts)


def seeds_phrase(counts) -> str:
    counts = sorted(set(counts))
    if not counts:
        return "0 seeds"
    text = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"{text} seed" + ("" if text == "1" else "s")


def spread_text(counts, what: str = "band") -> str:
    """What the bands (or dots) of a plot are, for rows of ``counts`` seeds each."""
    banded = [n for n in counts if n >= MIN_SEEDS_FOR_BAND]
    dotted = [n for n in counts if n < MIN_SEEDS_FOR_BAND]
    if not dotted:
        return f"{what}: 95 % t-interval over {seeds_phrase(banded)}"
    if not banded:
        return f"dots: each of the {seeds_phrase(dotted)}; no {what}: fewer than 3 seeds give no useful interval"
    return f"{what}: 95 % t-interval over {seeds_phrase(banded)}; dots: each seed of rows with fewer than 3"


def row_rounds(row) -> int:
    return row.first.summary.get("rounds") or max((r for run in row.runs for r, _ in run.curve), default=0)


def display_names(rows) -> dict:
    """Row name -> legend text, which names the round count when the rows differ in it."""
    mixed = len({row_rounds(row) for row in rows}) > 1
    return {row.name: row.name + (f" ({rounds_text(row)} rounds)" if mixed else "") for row in rows}


# one hue per method, in every figure: a method keeps its colour from plot to plot and no two methods share one
# (matplotlib's tab10, then the dark shades of tab20b for the model-heterogeneous family's baselines)
METHOD_HUES = {
    "feast": "#1f77b4",
    "superfednas": "#ff7f0e",
    "deepfednas": "#2ca02c",
    "heterofl": "#d62728",
    "fedrolex": "#9467bd",
    "fedavg-min": "#8c564b",
    "scalefl": "#e377c2",
    "fiarse": "#bcbd22",
    "fedtopo": "#17becf",
    "local": "#7f7f7f",
    "lg-fedavg": "#393b79",
    "fd": "#637939",
    "fedproto": "#843c39",
    "fedtgp": "#7b4173",
}
UNLISTED_HUES = ("#000000", "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194")  # a method not in the table


def row_method(row) -> str:
    """The method a row's runs trained (a label such as 'fedavg-min-matched' or 'feast-kd0' names a setting)."""
    run = row.first
    config = run.record.get("run_config") or run.summary.get("run_config") or {}
    return str(config.get("method") or run.summary.get("method") or run.label)


def shade(hue, position: float) -> tuple:
    """``hue`` darkened (position < 0) or lightened (> 0) toward black or white by |position| (at most 1)."""
    from matplotlib.colors import to_rgb

    target = 1.0 if position > 0 else 0.0
    return tuple(c + abs(position) * (target - c) for c in to_rgb(hue))


def colours(rows) -> dict:
    """Row name -> colour: each method has its own hue (``METHOD_HUES``); where a method has several rows (matched
    compute, settings, grid cells), they are shades of that hue, dark to light in row order."""
    by_method: dict[str, list] = {}
    for row in rows:
        by_method.setdefault(row_method(row), []).append(row)
    unlisted = iter(UNLISTED_HUES * len(rows))
    out = {}
    for method, members in by_method.items():
        hue = METHOD_HUES.get(method) or next(unlisted)
        for j, row in enumerate(members):
            out[row.name] = shade(hue, -0.3 + 0.75 * j / (len(members) - 1)) if len(members) > 1 else shade(hue, 0)
    return out


def panels(rows) -> dict:
    """Panel title -> its rows: one panel per round count (runs of different lengths never share an x axis) and,
    in a grid suite, per grid cell."""
    lengths = {row_rounds(row) for row in rows}
    cells = {json.dumps(row.first.cell, sort_keys=True) for row in rows}
    out: dict[str, list] = {}
    for row in sorted(rows, key=row_rounds):
        parts = [", ".join(f"{k} = {v}" for k, v in row.first.cell.items())] if len(cells) > 1 else []
        parts += [f"runs of {rounds_text(row)} rounds"] if len(lengths) > 1 else []
        out.setdefault(" · ".join(parts), []).append(row)
    return out


def percent_limits(values, pad: float = 3.0) -> tuple[float, float]:
    """y limits around ``values`` (in %), never outside [0, 100]."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return 0.0, 100.0
    return max(0.0, min(finite) - pad), min(100.0, max(finite) + pad)


def accuracy_label(rows) -> str:
    # ACCURACY_TITLES: the tables' names for the accuracy kinds, one list for both
    kinds = {row.first.accuracy_kind for row in rows}
    return ACCURACY_TITLES[kinds.pop()] if len(kinds) == 1 else "accuracy (%)"


def _title(fig, what: str, rows, extra: str = "") -> None:
    fig.suptitle(f"{what}\n{setting_text(rows)}" + (f"\n{extra}" if extra else ""), fontsize=10)


def _legend(fig, axes, handles=None, labels=None) -> None:
    if handles is None:
        handles, labels = [], []
        for ax in np.ravel(axes):
            for h, label in zip(*ax.get_legend_handles_labels()):
                if label not in labels:
                    handles.append(h)
                    labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8, frameon=False)


def _whole_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    # few enough that four-digit rounds do not run into each other in a narrow panel
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))


def _seed_dots(ax, xs, ys, colour) -> None:
    ax.scatter(xs, ys, s=14, color=colour, alpha=0.75, edgecolors="none", zorder=3)


def _panel_grid(plt, count: int, panel_height: float):
    """Up to four panels a line, sharing the accuracy axis."""
    ncols = min(4, count)
    nrows = math.ceil(count / ncols)
    width = 7.5 if count == 1 else 3.6 * ncols + 2.6
    return plt.subplots(
        nrows, ncols, figsize=(width, panel_height * nrows + 0.8), sharey=True, squeeze=False, layout="constrained"
    )


def _curve_with_spread(ax, points: pd.DataFrame, seeds: list[tuple], colour, label: str) -> list[float]:
    """The mean curve of ``points`` (round, accuracy, accuracy_ci95, n) with its clipped band (>= 3 seeds) or each
    seed's (round, accuracy %) as a dot; returns the y values drawn."""
    x, y = points["round"].to_numpy(), 100 * points["accuracy"].to_numpy()
    ax.plot(x, y, marker="o", markersize=3, color=colour, label=label)
    if points["n"].min() >= MIN_SEEDS_FOR_BAND:
        low, high = accuracy_band(points, y)
        ax.fill_between(x, low, high, color=colour, alpha=BAND_ALPHA, linewidth=0)
        return list(y) + list(low) + list(high)
    _seed_dots(ax, [r for r, _ in seeds], [a for _, a in seeds], colour)
    return list(y) + [a for _, a in seeds]


# -- accuracy per round --------------------------------------------------------------------------------------------
def figure_accuracy_per_round(tables: dict):
    """One panel per round count (and grid cell); mean line per row, clipped band (>= 3 seeds) or per-seed dots."""
    plt, rows = pyplot(), tables["rows"]
    names, colour = display_names(rows), colours(rows)
    points = pd.DataFrame(tables["rounds"], columns=["method", "round", "accuracy", "accuracy_ci95", "n"])
    groups = panels(rows)
    fig, axes = _panel_grid(plt, len(groups), 3.9)
    drawn = []
    for ax, (title, members) in zip(axes.flat, groups.items()):
        for row in members:
            mine = points[points["method"] == row.name]
            seeds = [(r, 100 * a) for run in row.runs for r, a in run.curve]
            drawn += _curve_with_spread(ax, mine, seeds, colour[row.name], names[row.name])
        ax.set(xlabel="round")
        _whole_ticks(ax)
        if title:
            ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(accuracy_label(rows))
    axes[0][0].set_ylim(*percent_limits(drawn))
    _title(fig, f"Accuracy per evaluated round: mean over seeds ({spread_text([row.seeds for row in rows])})", rows)
    _legend(fig, axes)
    return fig


# -- paired differences --------------------------------------------------------------------------------------------
def paired_curves(rows, pairs: list[tuple]) -> list[tuple]:
    """(row, reference row, [(round, PairedDifference)]) at every round both rows evaluated."""
    out = []
    for row, ref in pairs:
        mine = {run.seed: dict(run.curve) for run in row.runs}
        theirs = {run.seed: dict(run.curve) for run in ref.runs}
        rounds = sorted({r for c in mine.values() for r in c} & {r for c in theirs.values() for r in c})
        out.append(
            (
                row,
                ref,
                [
                    (
                        r,
                        paired_difference(
                            {s: c[r] for s, c in mine.items() if r in c}, {s: c[r] for s, c in theirs.items() if r in c}
                        ),
                    )
                    for r in rounds
                ],
            )
        )
    return out


def _draw_paired_final(left, pairs: list[tuple], names: dict, colour: dict) -> list[int]:
    """Each pair's difference in final accuracy: mean with its interval, or per-seed dots; returns the pair counts."""
    counts = []
    for y, (row, ref) in enumerate(pairs):
        paired = paired_difference(row.by_seed(), ref.by_seed())
        counts.append(paired.difference.n)
        mean = 100 * paired.difference.mean
        if paired.difference.n >= MIN_SEEDS_FOR_BAND:
            half = 100 * paired.difference.half_width
            left.errorbar(mean, y, xerr=half, fmt="o", color=colour[row.name], capsize=4)
        else:
            diffs = [100 * (row.by_seed()[s] - ref.by_seed()[s]) for s in paired.seeds]
            _seed_dots(left, diffs, [y] * len(diffs), colour[row.name])
            left.plot(mean, y, marker="D", markersize=6, markerfacecolor="none", color=colour[row.name])
    left.axvline(0, color="0.3", linewidth=0.8)
    left.set_yticks(range(len(pairs)), [f"{names[row.name]}\n− {names[ref.name]}" for row, ref in pairs], fontsize=8)
    left.invert_yaxis()
    left.set(xlabel="difference in final accuracy (points)")
    left.set_title("final accuracy (each run at its last round)", fontsize=9)
    left.grid(True, axis="x", alpha=0.3)
    return counts


def _draw_paired_curves(right, rows, pairs: list[tuple], names: dict, colour: dict) -> None:
    """Each pair's difference at every round both evaluated: mean line with its band, or per-seed dots."""
    for row, ref, points in paired_curves(rows, pairs):
        if not points:
            continue
        x = [r for r, _ in points]
        y = np.array([100 * d.difference.mean for _, d in points])
        right.plot(x, y, marker="o", markersize=3, color=colour[row.name], label=names[row.name])
        if min(d.difference.n for _, d in points) >= MIN_SEEDS_FOR_BAND:
            half = np.nan_to_num(np.array([100 * d.difference.half_width for _, d in points]))
            low, high = np.clip(y - half, -100, 100), np.clip(y + half, -100, 100)
            right.fill_between(x, low, high, color=colour[row.name], alpha=BAND_ALPHA, linewidth=0)
        else:
            dots = [
                (r, 100 * (dict(a.curve)[r] - dict(b.curve)[r]))
                for r, d in points
                for a in row.runs
                for b in ref.runs
                if a.seed == b.seed and a.seed in d.seeds
            ]
            _seed_dots(right, [r for r, _ in dots], [v for _, v in dots], colour[row.name])
    right.axhline(0, color="0.3", linewidth=0.8)
    _whole_ticks(right)
    right.set(xlabel="round (rounds both evaluated)", ylabel="difference (points)")
    right.set_title("at every round both evaluated", fontsize=9)
    right.grid(True, alpha=0.3)


def figure_paired(tables: dict):
    """Left: final accuracy minus the reference's (paired by seed); right: the same at every round both evaluated.
    None without a reference or pairs."""
    if not tables.get("paired"):
        return None
    plt, rows = pyplot(), tables["rows"]
    by_name = {row.name: row for row in rows}
    pairs = [(by_name[p["method"]], by_name[p["reference"]]) for p in tables["paired"]]
    names, colour = display_names(rows), colours(rows)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12.5, 0.45 * len(pairs) + 3.6), width_ratios=[1, 1.25], layout="constrained"
    )
    counts = _draw_paired_final(left, pairs, names, colour)
    _draw_paired_curves(right, rows, pairs, names, colour)
    reference = tables.get("reference") or pairs[0][1].first.label
    cell = " of the same grid cell" if any(row.first.cell for row, _ in pairs) else ""
    _title(
        fig,
        f"Paired difference: each method minus {reference}{cell}, paired by seed "
        f"(same partitions, budgets, sampling)\n{spread_text(counts, 'bars and bands')}",
        rows,
    )
    _legend(fig, [right])
    return fig


# -- accuracy against compute --------------------------------------------------------------------------------------
def _draw_compute_budgets(ax, tables: dict, rows) -> None:
    """The equal-compute budget of compute.csv as dashed vertical lines."""
    # the budget is matched per seed; the line marks its mean, once per reference row (one per grid cell)
    reference = compute_reference_label(tables)
    budgets = [r["compute_budget"] for r, row in zip(tables["compute"], rows) if row.first.label == reference]
    budgets = sorted({b for b in budgets or [tables["compute"][0]["compute_budget"]] if b == b})
    label = (
        f"{reference}'s total (mean over seeds; each seed is read at its own)" if reference else "equal-compute budget"
    )
    for i, budget in enumerate(budgets):
        ax.axvline(budget, color="0.3", linestyle="--", linewidth=0.9, label=label if i == 0 else None)


def figure_accuracy_vs_compute(tables: dict):
    """One mean line per row (mean compute and mean accuracy over the seeds at each round all of them evaluated),
    each seed faint; the equal-compute budget of compute.csv dashed. None when no compute was recorded."""
    if not tables.get("compute"):
        return None
    plt, rows = pyplot(), tables["rows"]
    column, text = compute_column([run for row in rows for run in row.runs])
    names, colour = display_names(rows), colours(rows)
    fig, ax = plt.subplots(figsize=(9.5, 4.8), layout="constrained")
    drawn, xs = [], []
    for row in rows:
        frame = pd.DataFrame(
            [
                {"seed": run.seed, "round": r, "compute": c, "accuracy": 100 * a}
                for run in row.runs
                for r, c, a in run.compute_points(column)
            ],
            columns=["seed", "round", "compute", "accuracy"],
        )
        for _, seed in frame.groupby("seed"):
            ax.plot(seed["compute"], seed["accuracy"], color=colour[row.name], alpha=0.25, linewidth=0.8)
        # the mean at each round every seed evaluated; seeds of a matched-compute row train and evaluate at rounds
        # of their own, so theirs is the mean of each seed's k-th evaluation
        frame["evaluation"] = frame.groupby("seed").cumcount()
        aligned = frame.groupby("seed")["round"].apply(tuple).nunique() <= 1
        key = "round" if aligned else "evaluation"
        complete = frame[frame.groupby(key)["seed"].transform("size") == row.seeds]
        mean = complete.groupby(key)[["compute", "accuracy"]].mean()
        ax.plot(
            mean["compute"],
            mean["accuracy"],
            marker="o",
            markersize=3.5,
            linewidth=2,
            color=colour[row.name],
            label=names[row.name],
        )
        drawn += list(frame["accuracy"])
        xs += list(frame["compute"])
    _draw_compute_budgets(ax, tables, rows)
    positive = [x for x in xs if x > 0]
    logarithmic = bool(positive) and max(positive) / min(positive) > 30
    if logarithmic:
        ax.set_xscale("log")
    ax.set(xlabel=f"cumulative {text}" + (" (log scale)" if logarithmic else ""), ylabel=accuracy_label(rows))
    ax.set_ylim(*percent_limits(drawn))
    ax.grid(True, alpha=0.3)
    _title(
        fig,
        f"Accuracy against cumulative {text}: thick = mean over {seeds_phrase([r.seeds for r in rows])} at each "
        "round all evaluated (seeds of unequal length: at each one's k-th evaluation), faint = each seed",
        rows,
    )
    _legend(fig, [ax])
    return fig


# -- accuracy per tier ---------------------------------------------------------------------------------------------
def figure_accuracy_vs_macs(tables: dict):
    """Each tier's test accuracy after the last round: mean with its clipped interval, or per-seed dots."""
    if not tables.get("tiers"):
        return None
    plt, rows = pyplot(), tables["rows"]
    names, colour = display_names(rows), colours(rows)
    points = pd.DataFrame(tables["tiers"])
    fig, ax = plt.subplots(figsize=(9.5, 4.8), layout="constrained")
    drawn, counts = [], []
    for row in rows:
        mine = points[points["method"] == row.name]
        if mine.empty:
            continue
        counts.append(row.seeds)
        x, y = mine["tier_mmacs"].to_numpy(), 100 * mine["accuracy"].to_numpy()
        ax.plot(x, y, marker="o", markersize=4, color=colour[row.name], label=names[row.name])
        drawn += list(y)
        if mine["n"].min() >= MIN_SEEDS_FOR_BAND:
            low, high = accuracy_band(mine, y)
            ax.errorbar(x, y, yerr=[y - low, high - y], fmt="none", ecolor=colour[row.name], capsize=3)
            drawn += list(low) + list(high)
        else:
            for run in row.runs:
                tiers = run.summary["tiers"][: len(mine)]
                values = [100 * t["accuracy"] for t in tiers]
                _seed_dots(ax, x[: len(values)], values, colour[row.name])
                drawn += values
    ax.set_xscale("log")
    ax.set(xlabel="tier (MMACs, log scale)", ylabel="test accuracy (%)")
    ax.set_ylim(*percent_limits(drawn))
    ax.grid(True, alpha=0.3)
    _title(
        fig,
        f"Test accuracy of each tier after the last round: mean ({spread_text(counts, 'bars')})",
        rows,
    )
    _legend(fig, [ax])
    return fig


# -- accuracy per round, per tier ----------------------------------------------------------------------------------
def figure_tier_curves(tables: dict):
    """One panel per row with tiers; a line per tier (colour by MACs, darker = larger): test accuracy per evaluated
    round, band = 95 % t-interval (>= 3 seeds) or each seed as a dot. Shows whether larger tiers pay and whether
    each has flattened."""
    table = pd.DataFrame(tables.get("tier_rounds") or [])
    if table.empty:
        return None
    plt, rows = pyplot(), [row for row in tables["rows"] if row.name in set(table["method"])]
    names = display_names(rows)
    fig, axes = _panel_grid(plt, len(rows), 3.6)
    cmap, drawn = plt.get_cmap("viridis"), []
    for ax, row in zip(axes.flat, rows):
        mine = table[table["method"] == row.name]
        tiers = sorted(mine["tier_mmacs"].unique())
        for k, tier in enumerate(tiers):
            colour = cmap(0.85 * (1 - k / max(1, len(tiers) - 1)))
            points = mine[mine["tier_mmacs"] == tier].sort_values("round")
            seeds = [(r, 100 * a) for run in row.runs for r, m, a in run.tier_curve if round(m / 1e6, 3) == tier]
            drawn += _curve_with_spread(ax, points, seeds, colour, f"{tier:g} MMACs")
        ax.set(xlabel="round", title=names[row.name])
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, frameon=False, title="tier", title_fontsize=7)
        _whole_ticks(ax)
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(rows) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("tier test accuracy (%)")
    axes[0][0].set_ylim(*percent_limits(drawn))
    _title(fig, f"Each tier's accuracy per evaluated round ({spread_text([row.seeds for row in rows])})", rows)
    return fig


# -- traffic -------------------------------------------------------------------------------------------------------
def figure_traffic(tables: dict):
    plt, rows = pyplot(), tables["rows"]
    names = display_names(rows)
    table = tables["accuracy"]
    fig, ax = plt.subplots(figsize=(max(7.5, 0.8 * len(table) + 4), 4.6), layout="constrained")
    x = np.arange(len(table))
    ax.bar(x - 0.2, [r["mb_down"] for r in table], width=0.4, label="down (server to clients)")
    ax.bar(x + 0.2, [r["mb_up"] for r in table], width=0.4, label="up (clients to server)")
    ax.set_xticks(x, [names.get(r["method"], r["method"]) for r in table], rotation=30, ha="right", fontsize=8)
    sizes = [r[k] for r in table for k in ("mb_down", "mb_up") if r[k] and r[k] > 0]
    logarithmic = bool(sizes) and max(sizes) / min(sizes) > 30  # FedAvg-min's bars would vanish beside FEAST's
    if logarithmic:
        ax.set_yscale("log")
    ax.set(ylabel="MB per run" + (" (log scale)" if logarithmic else ""))
    ax.grid(True, axis="y", alpha=0.3)
    _title(fig, f"Traffic of a whole run: MB down and up, mean over {seeds_phrase([r.seeds for r in rows])}", rows)
    _legend(fig, [ax])
    return fig


PLOTS = {
    "accuracy_per_round.png": figure_accuracy_per_round,
    "accuracy_per_round_per_tier.png": figure_tier_curves,
    "paired_difference.png": figure_paired,
    "accuracy_vs_compute.png": figure_accuracy_vs_compute,
    "accuracy_vs_macs.png": figure_accuracy_vs_macs,
    "traffic.png": figure_traffic,
}


def write_plots(out: Path, tables: dict, write: Callable[[Path, bytes], Path]) -> list[Path]:
    """Every plot the tables support, each written with ``write(path, png bytes)``."""
    written = []
    for name, make in PLOTS.items():
        fig = make(tables)
        if fig is not None:
            written.append(write(out / name, png_bytes(fig)))
    return written
