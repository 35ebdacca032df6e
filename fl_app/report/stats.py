"""The statistics only the report uses: per-group means with 95% t-intervals (``fl_app.run.stats``) over a frame of
runs, seeds aligned at shared rounds, and the test of a flattened curve.
"""

from __future__ import annotations

import pandas as pd

from fl_app.report.rows import Row
from fl_app.run.stats import mean_ci


def run_frame(rows: list[Row], **values) -> pd.DataFrame:
    """One line per run: its row's index and, per keyword, ``value(run)`` (runs in row order, each row's by seed)."""
    return pd.DataFrame(
        [
            {"row": i, "seed": run.seed, **{name: value(run) for name, value in values.items()}}
            for i, row in enumerate(rows)
            for run in row.runs
        ],
        columns=["row", "seed", *values],
    )


def estimates(frame: pd.DataFrame, by: list[str], column: str, prefix: str = "") -> pd.DataFrame:
    """Mean, 95% half-width and count of ``column`` per group (the t-interval of ``fl_app.run.stats``; values in
    the frame's order, so each mean is summed in seed order as every earlier table was)."""
    grouped = frame.groupby(by, sort=True)[column].agg(lambda values: mean_ci(values.tolist()))
    return pd.DataFrame(
        {
            f"{prefix}{column}": [e.mean for e in grouped],
            f"{prefix}{column}_ci95": [e.half_width for e in grouped],
            "n": [e.n for e in grouped],
        },
        index=grouped.index,
    )


def records(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict("records")


def curve_frame(rows: list[Row]) -> pd.DataFrame:
    """One line per run and evaluated round: row index, seed, round, accuracy."""
    return pd.DataFrame(
        [
            {"row": i, "seed": run.seed, "round": rnd, "accuracy": acc}
            for i, row in enumerate(rows)
            for run in row.runs
            for rnd, acc in run.curve
        ],
        columns=["row", "seed", "round", "accuracy"],
    )


def on_shared_rounds(frame: pd.DataFrame) -> pd.DataFrame:
    """Where a row's runs evaluated at different rounds but equally often, put each run's k-th evaluation at the mean
    of the runs' k-th rounds. A match-compute row's seeds have their own horizons and the runner evaluates each at the
    same fractions of its horizon, so this averages seeds at the same point of their runs instead of dropping them."""
    frame = frame.copy()
    for row, mine in frame.groupby("row"):
        by_seed = {seed: sorted(r["round"].unique()) for seed, r in mine.groupby("seed")}
        schedules = list(by_seed.values())
        if all(s == schedules[0] for s in schedules) or len({len(s) for s in schedules}) > 1:
            continue
        shared = [int(round(sum(rounds) / len(rounds))) for rounds in zip(*schedules)]
        for seed, rounds in by_seed.items():
            at = (frame["row"] == row) & (frame["seed"] == seed)
            frame.loc[at, "round"] = frame.loc[at, "round"].map(dict(zip(rounds, shared)))
    return frame


def last_two(curve) -> tuple | None:
    """The last two evaluations ((round, accuracy), (round, accuracy)) of a curve sorted by round; None if fewer."""
    points = sorted(curve)
    return (points[-2], points[-1]) if len(points) >= 2 else None


def convergence_verdict(previous, last, change) -> str:
    """'flat' when each of the last two evaluations' means lies inside the other's seed interval (the test of a
    converged curve the studies use), else the direction the mean moved; no verdict without an interval."""
    if last.n < 2 or previous.n < 2:
        return f"no interval at {min(last.n, previous.n)} seed"
    if abs(last.mean - previous.mean) <= min(last.half_width, previous.half_width):
        return "flat"
    return "still rising" if change.mean > 0 else "still falling"
