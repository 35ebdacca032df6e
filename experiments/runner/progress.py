"""The console line of each round of a training run (``Progress``): the round, the last evaluation's accuracy and
the ETAs of the run and of the suite, read from the rounds.csv and metrics.csv the app rewrites."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Callable

from experiments.runner.planning import PlannedRun
from experiments.runner.records import read_rows

# the columns a run's accuracy is read from while it trains (supernet methods, model-heterogeneous methods)
ACCURACY_COLUMNS = ("population_weighted_accuracy", "mean_client_accuracy", "test_accuracy")


def last_row(path: Path) -> dict:
    """The last row of a CSV the app rewrites after each round ({} while it is missing or unreadable)."""
    rows = read_rows(path) or []
    return rows[-1] if rows else {}


def accuracy_of(path: Path) -> tuple[float, int] | None:
    """(accuracy, round) of the last evaluation in a run's metrics.csv, from the first of ``ACCURACY_COLUMNS`` it
    has a number in."""
    for row in reversed(read_rows(path) or []):
        for column in ACCURACY_COLUMNS:
            try:
                value, number = float(row.get(column) or "nan"), int(row["round"])
            except (KeyError, TypeError, ValueError):
                continue
            if not math.isnan(value):
                return value, number
    return None


class Progress:
    """Follows a training run through the rounds.csv and metrics.csv the app rewrites after each round, and prints a
    line for each new round: the round, the last evaluation's accuracy and the ETAs of the run and of the suite.
    ``later(run_seconds)`` gives the seconds the runs after this one will take, given this one's projected length."""

    def __init__(self, run: PlannedRun, where: str, printer, later: Callable[[float], float], every: float):
        self.run, self.where, self.printer, self.later, self.every = run, where, printer, later, every
        self.total = int(run.run_config["num-server-rounds"])
        self.started, self.shown = time.time(), 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name=f"progress {run.name}", daemon=True)

    def __enter__(self) -> "Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.poll()  # rounds that ended since the last look (a short run, or a long interval) are shown too

    def _follow(self) -> None:
        while not self.stop.wait(self.every):
            self.poll()

    def poll(self) -> None:
        try:
            done = int(last_row(self.run.folder / "rounds.csv").get("round", 0))
        except ValueError:
            return
        if done <= self.shown:
            return
        self.shown = done
        elapsed, trained = time.time() - self.started, done - self.run.resumed_after_round
        left = elapsed / trained * (self.total - done) if trained > 0 else math.nan
        accuracy = accuracy_of(self.run.folder / "metrics.csv")
        scored = f"accuracy {100 * accuracy[0]:.1f}% (round {accuracy[1]})" if accuracy else "not evaluated yet"
        self.printer(
            f"{self.where}  round {done}/{self.total}, {scored}, ETA run {duration(left)}, "
            f"suite {duration(left + self.later(elapsed + left))}",
            flush=True,
        )


def duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
        if seconds >= 60
        else f"{seconds}s"
    )
