"""A run's output folder: metrics.csv (tiers), rounds.csv (per round), summary.json, the supernet, the plot.

Files are written through ``fl_app.io.files`` (a fresh temporary file, then linked or renamed into place), so an
interrupted run never leaves a half-written file and no symlink is ever followed; a file is replaced only when this
run wrote it (the round files rewritten after each round), and a folder that already holds results, another run's
included, is refused before training starts.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from logging import WARNING
from pathlib import Path
from typing import Iterable, Mapping

from flwr.common.logger import log

from fl_app.io.files import replace_file, write_own_file
from fl_app.run import tracker

# what a run writes into its output folder (fl_app.run.checkpoint's MODELS_DIR included): any of them there
# already means the folder holds another run
RESULT_FILES = (
    "metrics.csv",
    "rounds.csv",
    "clients.csv",
    "summary.json",
    "supernet.pt",
    "accuracy_vs_macs.png",
    "accuracy_per_round.png",
    "checkpoint.pt",
    "client-models",
)


def prepare_output_dir(requested: str, method: str, dataset: str, seed: int) -> Path:
    if requested:
        path = Path(requested).expanduser()
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path.home() / "fl_app_runs" / f"{method}-{dataset}-s{seed}-{stamp}"
    existing = [name for name in RESULT_FILES if os.path.lexists(path / name)]
    if existing:
        raise ValueError(
            f"output-dir='{path}' already holds results ({', '.join(existing)}); "
            "choose a new folder so they are not overwritten"
        )
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


def write_text(path: Path, text: str, replace: bool = False) -> None:
    """``text`` (UTF-8) into ``path``: a new file or one this run wrote (``files.write_own_file``); with ``replace``,
    any regular file there (the caller decided it is its own: ``files.replace_file``). Never through a symlink."""
    (replace_file if replace else write_own_file)(path, text.encode())


def write_json(path: Path, data: dict, replace: bool = False) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n", replace)


def write_csv(path: Path, rows: list[dict], replace: bool = False) -> None:
    text = io.StringIO(newline="")
    # every column any row has, in order of first appearance (a method's per-round extras may start mid-run)
    writer = csv.DictWriter(text, fieldnames=list(dict.fromkeys(key for row in rows for key in row)), restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, text.getvalue(), replace)


def metrics_with_round_costs(metrics_rows: list[dict], rounds: dict) -> list[dict]:
    """metrics.csv rows (one per evaluated round and tier) with their round's train loss and bytes; ``rounds`` maps
    round -> the strategy's round log."""
    out = []
    for row in metrics_rows:
        log_ = rounds.get(row["round"])
        out.append(
            {
                **row,
                "train_loss": log_.train_loss if log_ else math.nan,
                "bytes_down": log_.bytes_down if log_ else 0,
                "bytes_up": log_.bytes_up if log_ else 0,
            }
        )
    return out


def write_round_files(
    out_dir: Path, metrics_rows: list[dict], rounds: dict, clients: "ClientRecords | None" = None
) -> None:
    """metrics.csv (``metrics_rows``: evaluated rounds), rounds.csv (every round's log, with the clients' training
    FLOPs when ``clients`` records them) and clients.csv, with every round finished so far. Called after each round
    (each file replaced atomically), so a run that dies keeps every finished round; ``write_results`` writes them once
    more at the end."""
    write_csv(out_dir / "metrics.csv", metrics_rows)
    round_rows = [
        {**log_.row(r), **(clients.round_columns(r) if clients else {})} for r, log_ in sorted(rounds.items())
    ]
    write_csv(out_dir / "rounds.csv", round_rows)
    if clients is not None:
        write_csv(out_dir / "clients.csv", clients.rows())
    tracker.record_rounds(out_dir, metrics_rows, round_rows)  # the run's tracker, if any, mirrors the new rounds


def summary_head(run, error: str | None) -> dict:
    """The first keys of every run's summary.json: what ran, and whether it finished (else the error)."""
    return {
        "method": run["method"],
        "dataset": run["dataset"],
        "rounds": run["num-server-rounds"],
        "seed": run["seed"],
        "completed": error is None,
        "error": error,
    }


def write_results(
    out_dir: Path, summary: dict, metrics_rows: list[dict], rounds: dict, clients: "ClientRecords | None" = None
) -> None:
    """A run's result files at its end, also when it failed (the summary says so): the round files, then
    summary.json (written last: a run folder with a summary is finished)."""
    write_round_files(out_dir, metrics_rows, rounds, clients)
    write_json(out_dir / "summary.json", summary)


# reply metric -> (clients.csv column, how successive rounds combine)
CLIENT_METRICS = {
    "train-loss": ("last_train_loss", "last"),
    "trained-macs": ("trained_macs", "last"),
    "client-seconds": ("client_seconds", "sum"),
    "train-flops": ("train_flops", "sum"),
    "peak-rss-mb": ("peak_rss_mb", "max"),
    "cuda-peak-mb": ("cuda_peak_mb", "max"),
}


# clients.csv columns counted from the replies (what a resumed run continues from its checkpoint)
COUNTED_COLUMNS = ("rounds_sampled", "rounds_answered", *(column for column, _ in CLIENT_METRICS.values()))
# the round checkpoint's key for the clients' statistics
CLIENT_RECORDS_KEY = "client_records"


def resume_client_records(clients: "ClientRecords", checkpoint: dict, location: str) -> None:
    """Restore ``clients`` from a round checkpoint; one written before checkpoints kept them resumes without
    (a warning says the statistics count only from the resumed round on)."""
    if CLIENT_RECORDS_KEY in checkpoint:
        clients.restore_state(checkpoint[CLIENT_RECORDS_KEY])
        return
    log(
        WARNING,
        "resume-from='%s': the checkpoint holds no client statistics (written by an older version): clients.csv "
        "and rounds.csv's client_train_flops count only rounds %d and later",
        location,
        checkpoint["round"] + 1,
    )


class ClientRecords:
    """clients.csv (one row per partition) and the clients' training FLOPs per round, built only from the replies a
    strategy credited: screened, and attributed to this round's message to that partition (the strategy tells
    ``credit`` after each round, keyed by partition id, so a node that rejoins under a new id counts for its
    partition and a refused, replayed or misattributed reply counts for nothing). ``train-flops`` and
    ``trained-macs`` are the server's, computed from what it routed; the other values are the reply's screened
    metrics. Values are still taken only when finite and non-negative; they are statistics, never used for training
    or aggregation.

    ``columns`` are what the server knows of each partition before training, column -> partition id -> value
    (e.g. ``budget_macs``, ``num_examples``), in the order they appear after ``partition_id``."""

    def __init__(self, partitions: Iterable[int], **columns: dict):
        self.clients = {
            pid: {
                "partition_id": pid,
                **{column: values.get(pid) for column, values in columns.items()},
                "rounds_sampled": 0,
                "rounds_answered": 0,
                **{column: math.nan if how != "sum" else 0.0 for column, how in CLIENT_METRICS.values()},
            }
            for pid in sorted(partitions)
        }
        self.flops_of_round: dict[int, float] = {}
        # the executed FLOPs of rounds whose replies count them apart (``train-flops-dense``: FIARSE's dense tensors)
        self.dense_flops_of_round: dict[int, float] = {}

    def round_columns(self, server_round: int) -> dict:
        """rounds.csv's compute columns; ``client_train_flops_dense`` only in a run whose replies counted it (a
        reply without it executed what it counted: its ``train-flops``)."""
        columns = {"client_train_flops": self.flops_of_round.get(server_round, 0.0)}
        if self.dense_flops_of_round:
            columns["client_train_flops_dense"] = self.dense_flops_of_round.get(server_round, 0.0)
        return columns

    def rows(self) -> list[dict]:
        return [dict(row) for _, row in sorted(self.clients.items())]

    def checkpoint_state(self) -> dict:
        """What a round checkpoint keeps of the statistics (plain containers and numbers)."""
        dense = {"dense_flops_of_round": dict(self.dense_flops_of_round)} if self.dense_flops_of_round else {}
        return {"clients": self.rows(), "flops_of_round": dict(self.flops_of_round), **dense}

    def restore_state(self, state: dict) -> None:
        """Continue the statistics of ``checkpoint_state``: the counted columns of each partition and the FLOPs of
        every round so far (the columns the server knows before training are its own, recomputed)."""
        saved = {row["partition_id"]: row for row in state["clients"]}
        if set(saved) != set(self.clients):
            raise ValueError(
                f"the checkpoint's client statistics are of partitions {sorted(saved)}, this run has "
                f"{sorted(self.clients)}"
            )
        for pid, row in self.clients.items():
            row.update({column: saved[pid][column] for column in COUNTED_COLUMNS})
        self.flops_of_round = {int(r): float(flops) for r, flops in state["flops_of_round"].items()}
        self.dense_flops_of_round = {int(r): float(flops) for r, flops in state.get("dense_flops_of_round", {}).items()}

    def credit(self, server_round: int, sampled: Iterable[int], credited: Iterable[tuple[int, Mapping]]) -> None:
        """One round: the partitions sampled, and (partition id, values) of each credited reply (values keyed as
        ``CLIENT_METRICS``). A partition credited twice in a round counts once (the first)."""
        for pid in sampled:
            if pid in self.clients:
                self.clients[pid]["rounds_sampled"] += 1
        seen = set()
        for pid, values in credited:
            if pid not in self.clients or pid in seen:
                continue
            seen.add(pid)
            row = self.clients[pid]
            row["rounds_answered"] += 1
            self.observe_dense(server_round, values)
            for key, (column, how) in CLIENT_METRICS.items():
                value = values.get(key)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if not math.isfinite(value) or value < 0:
                    continue
                old = row[column]
                row[column] = (
                    value if how == "last" or math.isnan(old) else old + value if how == "sum" else max(old, value)
                )
                if key == "train-flops":
                    self.flops_of_round[server_round] = self.flops_of_round.get(server_round, 0.0) + value

    def observe_dense(self, server_round: int, metrics) -> None:
        """Add a reply's executed FLOPs to its round: its ``train-flops-dense`` when it counted them apart, else
        its ``train-flops`` (once any reply of the run counted them apart; earlier rounds are added then)."""

        def valid(value) -> bool:
            return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0

        dense, counted = metrics.get("train-flops-dense"), metrics.get("train-flops")
        if valid(dense):
            executed = dense
        elif dense is None and self.dense_flops_of_round and valid(counted):
            executed = counted
        else:
            return
        if not self.dense_flops_of_round:  # the first reply that counts them apart: the rounds so far executed
            self.dense_flops_of_round = dict(self.flops_of_round)
        self.dense_flops_of_round[server_round] = self.dense_flops_of_round.get(server_round, 0.0) + executed


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish_plot(plt, fig, ax, path: Path, title: str, ylabel: str, legend_size=None) -> None:
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_own_file(path, image.getvalue())


def plot_accuracy_vs_macs(path: Path, lines: dict[str, list[tuple[float, float]]], title: str) -> None:
    """One line per method: (MACs, accuracy) points (the supernet family's tiers)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in lines.items():
        points = sorted(points)
        ax.plot([m / 1e6 for m, _ in points], [100 * a for _, a in points], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("MMACs")
    _finish_plot(plt, fig, ax, path, title, "test accuracy (%)")


def plot_accuracy_per_round(
    path: Path, lines: dict[str, list[tuple[int, float]]], title: str, ylabel: str = "mean client accuracy (%)"
) -> None:
    """One line per method: (round, accuracy) points (the model-heterogeneous family's client accuracy)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in lines.items():
        ax.plot([r for r, _ in points], [100 * a for _, a in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("round")
    _finish_plot(plt, fig, ax, path, title, ylabel, legend_size=8)
