"""Suite files and stand-in runs for the tests of experiments.runner: what a finished run writes, without Flower."""

from __future__ import annotations

from pathlib import Path

from experiments.runner import run_suite
from fl_app.run.outputs import write_json


def write_suite(folder: Path, text: str, name: str = "suite.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def run_collecting(suite: Path, out: Path, launcher, **kwargs) -> tuple:
    """(``run_suite``'s result, the console lines) of ``suite`` launched through the stand-in ``launcher``; no plots
    unless ``plots=True``."""
    lines = []
    result = run_suite(
        suite, out, launch=launcher, printer=lambda line, **_: lines.append(line), **{"plots": False, **kwargs}
    )
    return result, lines


def write_summary(
    folder: Path, method: str, rounds: int, seed: int, accuracy: float, run_config: dict, **extra
) -> None:
    """summary.json as a finished run writes it (dataset cifar10); ``extra`` keys go before the run config."""
    write_json(
        folder / "summary.json",
        {
            "method": method,
            "dataset": "cifar10",
            "rounds": rounds,
            "seed": seed,
            "population_weighted_accuracy": accuracy,
            **extra,
            "run_config": run_config,
        },
    )
