"""Server and client wiring of the model-heterogeneous methods: FedTopo and its baselines.

Client i trains ``family[i % 8]`` on a Dirichlet(dirichlet-alpha) share of the training set (the plain Dirichlet
partitioner, whatever ``partitioner`` says: the γ-allocation is FEAST's), split 80/20 (``test-fraction``) into local
train and local test sets that follow the same label distribution. Models never leave the clients: a client keeps
its model between rounds in its node's ``context.state`` (in simulation and in a deployment alike).
"""

from __future__ import annotations

import contextlib
import math
import time
from functools import lru_cache
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log

from clients.feast import LocalSettings
from clients.fedtopo import (broadcast_problem, class_counts, evaluate, fedtopo_loss, fedtopo_upload, local_train,
                             model_is_finite)
from clients.fedtopo_baselines import FdLoss, class_means_upload, head_upload, load_head, plain_ce, proto_loss
from fl_app.config import RunConfig
from fl_app.data import DATASETS, ImageData, load_dataset, split_train, stratified_holdout
from fl_app.device import preferred_device
from fl_app.models.hetero import architecture_of, client_model
from fl_app.outputs import prepare_output_dir, write_csv, write_json
from fl_app.partition import make_partitioner, partition_indices
from fl_app.payload import record_to_state, state_to_record
from strategies.fedtopo import FedTopoStrategy, LocalStrategy
from strategies.fedtopo_baselines import FdStrategy, FedProtoStrategy, FedTgpStrategy, LgFedAvgStrategy

HETERO_METHODS = ("fedtopo", "local", "lg-fedavg", "fd", "fedproto", "fedtgp")


# -- data: identical on server and clients -------------------------------------------------------------------------
@lru_cache(maxsize=2)
def _splits(dataset: str, source: str, path: str, seed: int, alpha: float, test_fraction: float,
            num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    train, _ = load_dataset(dataset, source, path)
    labels = train.labels.numpy()
    pool = split_train(labels, 0, 0, seed).client_pool  # no server hold-out: evaluation is on clients
    partitioner = make_partitioner("dirichlet", num_partitions, seed, alpha)
    out = []
    for pid, idx in enumerate(partition_indices(labels[pool], partitioner)):
        rows = pool[idx]
        held = stratified_holdout(labels[rows], int(round(test_fraction * len(rows))),
                                  np.random.default_rng([seed, 47, pid]))
        test = rows[held]
        out.append((np.setdiff1d(rows, test), test))
    return tuple(out)


def client_rows(run: RunConfig, num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(train rows, test rows) into the training set for every partition id."""
    return _splits(run["dataset"], run["data-source"], run["data-path"], run["seed"], run["dirichlet-alpha"],
                   run["test-fraction"], num_partitions)


def client_data(run: RunConfig, pid: int, num_partitions: int) -> tuple[ImageData, ImageData]:
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    rows_train, rows_test = client_rows(run, num_partitions)[pid]
    return train.subset(rows_train), train.subset(rows_test)


# -- client --------------------------------------------------------------------------------------------------------
def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


MODEL_STATE = "hetero-model"  # the ArrayRecord in context.state that holds a client's model between rounds


def load_client_model(run: RunConfig, pid: int, state: RecordDict):
    """This client's model from its node state, or a seeded fresh one before its first round; on the node's
    preferred device."""
    num_classes = DATASETS[run["dataset"]].num_classes
    with torch.random.fork_rng():
        torch.manual_seed(_seed(run["seed"], 7, pid))
        model = client_model(run["model-family"], pid, num_classes, run["feature-dim"])
    if MODEL_STATE in state.array_records:
        model.load_state_dict(state.array_records[MODEL_STATE].to_torch_state_dict())
    return model.to(preferred_device())


def save_client_model(model, state: RecordDict) -> None:
    state[MODEL_STATE] = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


def client_loss(run: RunConfig, model, global_arrays: dict):
    method = run["method"]
    if method == "fedtopo":
        return fedtopo_loss(global_arrays, run["topo-beta"])
    if method == "lg-fedavg":
        load_head(model, global_arrays)
        return plain_ce
    if method == "fd":
        return FdLoss(global_arrays, run["distill-lambda"], DATASETS[run["dataset"]].num_classes)
    if method in ("fedproto", "fedtgp"):
        return proto_loss(global_arrays, run["distill-lambda"])
    return plain_ce


def client_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    method, num_classes, cap = run["method"], DATASETS[run["dataset"]].num_classes, run["proto-max-samples"]
    if method == "fedtopo":
        return fedtopo_upload(model, data, num_classes, run["topo-source"], cap, seed)
    if method == "lg-fedavg":
        return head_upload(model)
    if method == "fd":  # the mean logits seen while training
        return loss_fn.upload(class_counts(data, num_classes))
    if method in ("fedproto", "fedtgp"):
        return class_means_upload(model, data, num_classes, cap, seed)
    return {}


def evaluate_hetero(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """Score this client's own model on its local test split."""
    _, test = client_data(run, pid, num)
    correct, total = evaluate(load_client_model(run, pid, context.state), test)
    return Message(RecordDict({"metrics": MetricRecord({"correct": correct, "num-test": total,
                                                        "partition-id": pid})}), reply_to=msg)


def broadcast_shapes(run: RunConfig) -> dict[str, tuple]:
    """What the server of ``run``'s method broadcasts (key -> shape) once it has merged something."""
    c, d = DATASETS[run["dataset"]].num_classes, run["feature-dim"]
    return {"fedtopo": {"topology": (c, c)}, "lg-fedavg": {"head.weight": (c, d), "head.bias": (c,)},
            "fd": {"soft-labels": (c, c), "has": (c,)}, "fedproto": {"prototypes": (c, d), "has": (c,)},
            "fedtgp": {"prototypes": (c, d), "has": (c,)}, "local": {}}[run["method"]]


def train_hetero(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """One client step of a model-heterogeneous method: train the node's own model and upload what the method
    shares (never the weights, except LG-FedAvg's head). A broadcast that fails ``broadcast_problem`` is refused
    (the client raises: the server counts a failure) before the model is touched; a model that is no longer finite
    after training is not saved, so the node keeps its last good model."""
    config = msg.content.config_records["config"]
    server_round = int(config["server-round"])
    train, _ = client_data(run, pid, num)
    dtype = str(config["payload-dtype"])
    record = msg.content.array_records.get("arrays")
    global_arrays = record_to_state(record, dtype) if record is not None else {}
    problem = broadcast_problem(global_arrays, broadcast_shapes(run))
    if problem:
        raise ValueError(f"client {pid} refuses the round-{server_round} broadcast: {problem}")
    model = load_client_model(run, pid, context.state)
    seed = _seed(run["seed"], server_round, pid)
    loss_fn = client_loss(run, model, global_arrays)
    metrics = local_train(model, train, LocalSettings.from_run(run, float(config["lr"]), seed), loss_fn)
    if not model_is_finite(model):
        raise FloatingPointError(f"client {pid}: training diverged in round {server_round}; the model is not saved")
    upload = client_upload(run, model, train, seed, loss_fn)
    save_client_model(model, context.state)
    return Message(RecordDict({
        "upload": state_to_record(upload, dtype),
        "metrics": MetricRecord({"num-examples": len(train), "partition-id": pid, **metrics}),
    }), reply_to=msg)


# -- server --------------------------------------------------------------------------------------------------------
def lr_of_round(run: RunConfig):
    base, rounds = run["lr"], run["num-server-rounds"]
    if run["lr-schedule"] == "constant":
        return lambda r: base
    return lambda r: base * 0.5 * (1 + math.cos(math.pi * (r - 1) / rounds))


def build_strategy(run: RunConfig, node_of_partition: dict[int, int]):
    """The method's strategy. The server derives every client's split from the seed as the clients do, so it knows
    the size of each training and test split and holds replies to them."""
    method = run["method"]
    rows = client_rows(run, len(node_of_partition))
    common = dict(clients_per_round=run.clients_per_round(len(node_of_partition)), seed=run["seed"],
                  num_rounds=run["num-server-rounds"], eval_every=run["eval-every"],
                  payload_dtype=run["payload-dtype"], min_reply_fraction=run["min-reply-fraction"],
                  lr_of_round=lr_of_round(run), feature_dim=run["feature-dim"],
                  train_size_of_partition={pid: len(rows[pid][0]) for pid in node_of_partition},
                  test_size_of_partition={pid: len(rows[pid][1]) for pid in node_of_partition})
    num_classes = DATASETS[run["dataset"]].num_classes
    if method == "fedtopo":
        return FedTopoStrategy(node_of_partition, num_classes, tau=run["topo-tau"], weighting=run["topo-weighting"],
                               kappa=run["topo-kappa"], **common)
    if method == "fedtgp":
        return FedTgpStrategy(node_of_partition, num_classes, server_epochs=run["tgp-server-epochs"],
                              margin_cap=run["tgp-margin-cap"],
                              margin_rule=run["tgp-margin"], server_lr=run["tgp-server-lr"],
                              server_batch_size=run["tgp-batch-size"], **common)
    classes = {"local": LocalStrategy, "lg-fedavg": LgFedAvgStrategy, "fd": FdStrategy,
               "fedproto": FedProtoStrategy}
    if method not in classes:
        raise ValueError(f"method='{method}': allowed model-heterogeneous methods are {list(HETERO_METHODS)}")
    return classes[method](node_of_partition, num_classes, **common)


def plot_accuracy_per_round(path: Path, lines: dict[str, list[tuple[int, float]]], title: str,
                            ylabel: str = "mean client accuracy (%)") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in lines.items():
        ax.plot([r for r, _ in points], [100 * a for _, a in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    tmp.replace(path)


def hetero_summary(run: RunConfig, strategy, num_clients: int, seconds: float, error: str | None) -> dict:
    rounds = strategy.rounds
    last = next((h for h in reversed(strategy.history) if not math.isnan(h["mean_client_accuracy"])), {})
    return {
        "method": run["method"], "dataset": run["dataset"], "rounds": run["num-server-rounds"], "seed": run["seed"],
        "completed": error is None, "error": error, "rounds_done": max(rounds, default=0),
        "num_clients": num_clients, "clients_per_round": run.clients_per_round(num_clients),
        "model_family": run["model-family"],
        "architectures": [architecture_of(run["model-family"], pid) for pid in range(num_clients)],
        "mean_client_accuracy": last.get("mean_client_accuracy"), "pooled_accuracy": last.get("pooled_accuracy"),
        "accuracy_round": last.get("round"),
        "client_accuracy": [strategy.client_accuracy.get(p) for p in range(num_clients)],
        "bytes_up": sum(r.bytes_up for r in rounds.values()), "bytes_down": sum(r.bytes_down for r in rounds.values()),
        "bytes_up_per_round": sum(r.bytes_up for r in rounds.values()) / max(len(rounds), 1),
        "bytes_down_per_round": sum(r.bytes_down for r in rounds.values()) / max(len(rounds), 1),
        "failed_replies": sum(len(r.failed) for r in rounds.values()),
        "rejected_replies": sum(len(r.rejected) for r in rounds.values()),
        "failed_evaluations": sum(len(r.failed) for r in strategy.eval_rounds.values()),
        "rejected_evaluations": sum(len(r.rejected) for r in strategy.eval_rounds.values()),
        "history": strategy.history, "wall_seconds": round(seconds, 1), "run_config": run.to_dict(),
    }


def write_round_files(out_dir: Path, strategy) -> None:
    """metrics.csv (evaluated rounds) and rounds.csv (every training round), rewritten after each round."""
    write_csv(out_dir / "metrics.csv", strategy.history)
    write_csv(out_dir / "rounds.csv", [log_.row(r) for r, log_ in sorted(strategy.rounds.items())])


def run_hetero(grid, run: RunConfig, nodes: dict[int, dict]) -> dict:
    """Run a model-heterogeneous method end to end. metrics.csv and rounds.csv are rewritten after every round;
    summary.json and accuracy_per_round.png at the end, also when a round fails (``completed: false`` and the
    error, before the error is raised again)."""
    num_clients = len(nodes)
    node_of_partition = {pid: info["node_id"] for pid, info in nodes.items()}
    out_dir = prepare_output_dir(run["output-dir"], run["method"], run["dataset"], run["seed"])
    strategy = build_strategy(run, node_of_partition)
    log(INFO, "%s on %s: %d clients (%s family), Dirichlet α=%s, output %s", run["method"], run["dataset"],
        num_clients, run["model-family"], run["dirichlet-alpha"], out_dir)
    started, error = time.time(), None
    try:
        strategy.start(grid, state_to_record({}), num_rounds=run["num-server-rounds"], timeout=run["round-timeout"],
                       round_done=lambda r: write_round_files(out_dir, strategy))
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
        raise
    finally:
        elapsed = time.time() - started
        summary = hetero_summary(run, strategy, num_clients, elapsed, error)
        write_round_files(out_dir, strategy)
        plot_accuracy_per_round(out_dir / "accuracy_per_round.png",
                                {run["method"]: [(h["round"], h["mean_client_accuracy"]) for h in strategy.history]},
                                f"{run['method']} on {run['dataset']} ({num_clients} clients)")
        write_json(out_dir / "summary.json", summary)
        log(INFO, "Results written to %s", out_dir)
    log(INFO, "Done in %.0fs: mean client accuracy %.1f%%, pooled %.1f%%, %.0f bytes up per round", elapsed,
        100 * (summary["mean_client_accuracy"] or 0), 100 * (summary["pooled_accuracy"] or 0),
        summary["bytes_up_per_round"])
    return summary


# -- in-process driving (tests, experiments): the same strategy and client functions, without Ray -------------------
class InProcessGrid:
    """A Grid stand-in that delivers each message to ``train_hetero`` / ``evaluate_hetero`` of its partition, in
    order, with one persistent ``Context`` per node (as a SuperNode keeps one per run)."""

    def __init__(self, run: RunConfig, num_clients: int, first_node_id: int = 100):
        self.run, self.num_clients = run, num_clients
        self.node_of_partition = {pid: first_node_id + pid for pid in range(num_clients)}
        self.partition_of_node = {n: p for p, n in self.node_of_partition.items()}
        self.contexts = {pid: Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                                      node_config={"partition-id": pid, "num-partitions": num_clients})
                         for pid, node in self.node_of_partition.items()}

    def nodes(self) -> dict[int, dict]:
        return {pid: {"node_id": node} for pid, node in self.node_of_partition.items()}

    def get_node_ids(self):
        return list(self.partition_of_node)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            pid = self.partition_of_node[msg.metadata.dst_node_id]
            handler = evaluate_hetero if msg.metadata.message_type == MessageType.EVALUATE else train_hetero
            reply = handler(msg, self.run, pid, self.num_clients, self.contexts[pid])
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            replies.append(reply)
        return replies


@contextlib.contextmanager
def message_identity():
    """Messages need a task identity, which a Flower runtime normally sets (internal API)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def run_in_process(run: RunConfig, num_clients: int, grid: InProcessGrid | None = None) -> dict:
    grid = grid or InProcessGrid(run, num_clients)
    with message_identity():
        return run_hetero(grid, run, grid.nodes())
