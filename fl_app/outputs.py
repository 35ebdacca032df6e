"""A run's output folder: metrics.csv (tiers), rounds.csv (per round), summary.json, the supernet, the plot.

Files are written to a temporary name and renamed, so an interrupted run never leaves a half-written file, and a
folder that already holds results is refused before training starts.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from pathlib import Path

import torch

RESULT_FILES = ("metrics.csv", "rounds.csv", "summary.json", "supernet.pt", "accuracy_vs_macs.png", "checkpoint.pt")


def prepare_output_dir(requested: str, method: str, dataset: str, seed: int) -> Path:
    if requested:
        path = Path(requested).expanduser()
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path.home() / "fl_app_runs" / f"{method}-{dataset}-s{seed}-{stamp}"
    existing = [name for name in RESULT_FILES if (path / name).exists()]
    if existing:
        raise ValueError(f"output-dir='{path}' already holds results ({', '.join(existing)}); "
                         "choose a new folder so they are not overwritten")
    path.mkdir(parents=True, exist_ok=True)
    return path


def memory_mb() -> tuple[float, float]:
    """(resident, peak resident) memory of this process in MiB (Linux /proc; peak only elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return math.nan, peak


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    _atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=2) + "\n"))


def write_csv(path: Path, rows: list[dict]) -> None:
    def write(p: Path):
        with open(p, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
            writer.writeheader()
            writer.writerows(rows)

    _atomic_write(path, write)


def save_checkpoint(path: Path, blob: dict) -> None:
    _atomic_write(path, lambda p: torch.save(blob, p))


def plot_accuracy_vs_macs(path: Path, lines: dict[str, list[tuple[float, float]]], title: str) -> None:
    """One line per method: (MACs, accuracy) points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in lines.items():
        points = sorted(points)
        ax.plot([m / 1e6 for m, _ in points], [100 * a for _, a in points], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("MMACs")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=120))
    plt.close(fig)
