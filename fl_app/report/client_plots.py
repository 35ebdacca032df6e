"""Each client's data and budget (``python -m fl_app.report --clients``): its training labels, redrawn from the run's
recorded config with the app's own partitioning and checked against the sizes clients.csv recorded, and its budget
(supernet methods) or model (model-heterogeneous methods), as ``clients_<label>_seed<N>.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fl_app.report.plots import pyplot
from fl_app.report.read import KINDS, ReportError, read_table

if TYPE_CHECKING:
    from fl_app.run.config import RunConfig
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CLASS_NAMES = {"cifar10": CIFAR10_CLASSES, "cinic10": CIFAR10_CLASSES}


def client_partitions(run) -> tuple[pd.DataFrame, list | None, list | None]:
    """(training label counts, one line per client and a column per class; budgets in MACs or None; architectures
    or None) of a run, redrawn from its recorded run config with the app's own partitioning, and checked against the
    partition sizes its clients.csv recorded."""
    from fl_app.data.images import DATASETS

    values, config, source = _recorded_run_config(run)
    num = run.summary.get("num_clients")
    if not KINDS["count"][0](num) or not num:
        raise ReportError(f"{run.folder / 'summary.json'}: 'num_clients' is {num!r}; allowed: a whole number >= 1")
    clients = None
    if (run.folder / "clients.csv").exists():
        clients = read_table(
            run.folder / "clients.csv",
            ("partition_id", "num_examples"),
            ("num_examples", "budget_macs"),
            whole="partition_id",
        ).set_index("partition_id")
    try:
        train, rows, budgets, architectures = _redrawn_partitions(run, values, config, num, clients)
    except (OSError, ValueError) as error:
        raise ReportError(f"{source}: the run's partitions cannot be redrawn from its run config ({error})") from None
    labels = train.labels.numpy()
    classes = DATASETS[values["dataset"]].num_classes
    counts = pd.DataFrame(
        [np.bincount(labels[r], minlength=classes) for r in rows],
        columns=list(CLASS_NAMES.get(values["dataset"], [f"class {k}" for k in range(classes)]))[:classes],
    )
    if clients is not None and "num_examples" in clients.columns:
        _check_redrawn_sizes(run, counts, clients["num_examples"])
    return counts, budgets, architectures


def _recorded_run_config(run) -> tuple[dict, RunConfig, Path]:
    """(run-config values, their RunConfig, the file they were read from) of ``run``: run.json's record, else
    summary.json's; keys it did not record take their defaults, a relative data path is the repository's."""
    from fl_app.run.config import KEYS, RunConfig

    recorded = run.record.get("run_config") or run.summary.get("run_config")
    source = run.folder / ("run.json" if run.record.get("run_config") else "summary.json")
    if not recorded:
        raise ReportError(f"{run.folder}: no run config recorded (run.json or summary.json 'run_config')")
    values = {key: spec.default for key, spec in KEYS.items()} | {k: v for k, v in recorded.items() if k in KEYS}
    if values["data-path"] and not Path(values["data-path"]).expanduser().is_absolute():
        values["data-path"] = str(Path(__file__).resolve().parents[2] / values["data-path"])  # repository-relative
    return values, RunConfig(values), source


def _redrawn_partitions(run, values: dict, config: RunConfig, num: int, clients: pd.DataFrame | None) -> tuple:
    """(training data, each client's training rows, budgets or None, architectures or None), redrawn as the app
    draws them: supernet methods by budget (clients.csv's, else the summary's), the others by their local splits."""
    from fl_app.data.images import load_dataset
    from fl_app.run.config import SUPERNET_METHODS

    budgets = architectures = None
    if values["method"] in SUPERNET_METHODS:
        from fl_app.supernet.shared_setup import SupernetSetup, dataset_for, partition_rows

        recorded = clients is not None and "budget_macs" in clients.columns
        budgets = list(clients["budget_macs"]) if recorded else run.summary.get("budgets")
        if not isinstance(budgets, list) or len(budgets) != num or not all(KINDS["amount"][0](b) for b in budgets):
            raise ReportError(f"{run.folder}: no budget per client (clients.csv 'budget_macs' or summary 'budgets')")
        train, _ = dataset_for(config, SupernetSetup.build(config, num).cfg)
        rows = partition_rows(config, num, budgets)
    else:
        from fl_app.data.local_splits import client_rows

        train, _ = load_dataset(values["dataset"], values["data-source"], values["data-path"])
        rows = [train_rows for train_rows, _ in client_rows(config, num)]
        architectures = run.summary.get("architectures")
    return train, rows, budgets, architectures


def _check_redrawn_sizes(run, counts: pd.DataFrame, sizes: pd.Series) -> None:
    """Each partition's redrawn size is the one clients.csv recorded (else the data or partitioning changed)."""

    for pid, size in sizes.items():
        if pid not in counts.index or int(counts.loc[pid].sum()) != size:
            redrawn = int(counts.loc[pid].sum()) if pid in counts.index else "no"
            raise ReportError(
                f"{run.folder / 'clients.csv'}: partition {pid} held {size:g} examples in the run, the run config "
                f"redraws {redrawn}: the data or the partitioning changed since; no plot"
            )


def figure_clients(run, counts: pd.DataFrame, budgets: list | None, architectures: list | None):
    """Top: each client's training examples per class (stacked); bottom: its budget (MMACs) or model."""
    plt = pyplot()
    config = {**(run.summary.get("run_config") or {}), **(run.record.get("run_config") or {})}
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(8.5, 0.09 * len(counts) + 6), 6.4), sharex=True, height_ratios=[3, 1.3], layout="constrained"
    )
    cmap = plt.get_cmap("tab10" if counts.shape[1] <= 10 else "tab20")
    bottom_of = np.zeros(len(counts))
    for k, name in enumerate(counts.columns):
        top.bar(counts.index, counts[name], bottom=bottom_of.copy(), width=0.85, color=cmap(k % cmap.N), label=name)
        bottom_of += counts[name].to_numpy()
    # stacked bars make every layer's base a sticky edge, which would put the tallest stack against the frame
    top.set(ylabel="training examples", ylim=(0, 1.08 * max(1, bottom_of.max())))
    if len(counts) <= 30:  # the size of each client's data, readable even where its bar is a sliver
        for x, total in zip(counts.index, bottom_of):
            top.text(x, total, f"{int(total)}", ha="center", va="bottom", fontsize=7)
    top.grid(True, axis="y", alpha=0.3)
    if budgets is not None:
        bottom.bar(counts.index, [b / 1e6 for b in budgets], width=0.85, color="0.45")
        bottom.set_yscale("log")
        bottom.set(ylabel="budget (MMACs)")
    elif architectures:
        kinds = list(dict.fromkeys(architectures))
        bottom.scatter(counts.index, [kinds.index(a) for a in architectures], s=12, color="0.3")
        bottom.set_yticks(range(len(kinds)), kinds, fontsize=7)
        bottom.set(ylabel="model")
    bottom.set(xlabel="client (partition id)")
    bottom.grid(True, alpha=0.3)
    if len(counts) <= 30:
        bottom.set_xticks(counts.index)
    # the supernet methods split by the run's partitioner, the model-heterogeneous ones always by Dirichlet
    partition = config.get("partitioner", "gamma") if budgets is not None else "dirichlet"
    shape = "IID split" if partition == "iid" else f"Dirichlet α = {config.get('dirichlet-alpha', '?')}"
    if partition.startswith("gamma"):
        shape += f", γ = {config.get('gamma', '?')} (data share ∝ budget^γ)"
    if partition == "gamma-class-size":
        shape += ", concentration α·N_k·q_i"
    what = "budget" if budgets is not None else "model"
    fig.suptitle(
        f"Each client's training labels and {what}: {run.label} seed {run.seed}\n"
        f"{run.summary.get('dataset', '?')} · {len(counts)} clients · {shape}\n"
        "partitions redrawn from the run's recorded config with the app's partitioning"
        + (", sizes equal to clients.csv" if (run.folder / "clients.csv").exists() else ""),
        fontsize=10,
    )
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right center", fontsize=8, frameon=False, title="class")
    return fig
