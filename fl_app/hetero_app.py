"""Server and client wiring of the model-heterogeneous family: FedTopo and its baselines (local, LG-FedAvg, FD,
FedProto, FedTGP), one row each in ``HETERO_METHOD_TABLE``.

Client i trains ``family[i % 8]`` on a Dirichlet(dirichlet-alpha) share of the training set (the plain Dirichlet
partitioner, whatever ``partitioner`` says: the γ-allocation is FEAST's), split 80/20 (``test-fraction``) into local
train and local test sets that follow the same label distribution. Models never leave the clients: a client keeps
its model between rounds in its node's ``context.state`` (in simulation and in a deployment alike).
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from functools import lru_cache
from logging import INFO
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from clients.fedtopo import (
    broadcast_problem,
    class_counts,
    evaluate,
    fedtopo_loss,
    fedtopo_upload,
    local_train,
    model_is_finite,
)
from clients.fedtopo_baselines import FdLoss, class_means_upload, head_upload, load_head, plain_ce, proto_loss
from clients.local_training import LocalSettings
from fl_app.data.images import DATASETS, ImageData, load_dataset, split_train, stratified_holdout
from fl_app.data.partition import make_partitioner, partition_indices
from fl_app.models.hetero import architecture_of, client_model, forward_macs
from fl_app.run.checkpoint import (
    CHECKPOINT_FILE,
    capture_rng,
    load_run_checkpoint,
    load_verified,
    model_fingerprint,
    run_config_differences,
    same_run_earlier_round,
    save_verified,
)
from fl_app.run.config import RunConfig
from fl_app.run.device import preferred_device
from fl_app.run.outputs import (
    CLIENT_RECORDS_KEY,
    ClientRecords,
    plot_accuracy_per_round,
    prepare_output_dir,
    resume_client_records,
    summary_head,
    write_results,
    write_round_files,
)
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.run.seeds import derived_seed
from fl_app.supernet.training_costs import model_train_costs
from strategies.fedtopo import FedTopoStrategy
from strategies.fedtopo_baselines import FdStrategy, FedProtoStrategy, FedTgpStrategy, LgFedAvgStrategy, LocalStrategy
from strategies.hetero_base import HeteroStrategy
from strategies.rounds import round_options


# -- the methods: one row each ----------------------------------------------------------------------------------
def _num_classes(run: RunConfig) -> int:
    return DATASETS[run["dataset"]].num_classes


def _topology_loss(run: RunConfig, model, global_arrays: dict):
    return fedtopo_loss(global_arrays, run["topo-beta"])


def _head_loss(run: RunConfig, model, global_arrays: dict):
    load_head(model, global_arrays)  # LG-FedAvg trains on from the global head
    return plain_ce


def _distillation_loss(run: RunConfig, model, global_arrays: dict):
    return FdLoss(global_arrays, run["distill-lambda"], _num_classes(run))


def _prototype_loss(run: RunConfig, model, global_arrays: dict):
    return proto_loss(global_arrays, run["distill-lambda"])


def _plain_loss(run: RunConfig, model, global_arrays: dict):
    return plain_ce


def _topology_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    return fedtopo_upload(model, data, _num_classes(run), run["topo-source"], run["proto-max-samples"], seed)


def _head_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    return head_upload(model)


def _seen_logits_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    return loss_fn.upload(class_counts(data, _num_classes(run)))  # the mean logits seen while training


def _class_means_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    return class_means_upload(model, data, _num_classes(run), run["proto-max-samples"], seed)


def _no_upload(run: RunConfig, model, data: ImageData, seed: int, loss_fn) -> dict[str, np.ndarray]:
    return {}


def _no_options(run: RunConfig) -> dict:
    return {}


@dataclass(frozen=True)
class HeteroMethod:
    """Both sides of one model-heterogeneous method."""

    strategy: type[HeteroStrategy]
    loss: Callable  # (run, model, global arrays) -> the client's loss_fn(logits, features, labels)
    upload: Callable  # (run, model, training split, seed, loss_fn) -> the arrays the client uploads
    broadcast: Callable[[int, int], dict[str, tuple]]  # (classes, feature size) -> what the server sends, once merged
    strategy_options: Callable[[RunConfig], dict] = _no_options  # the strategy's own run-config keys


def _class_means_broadcast(c: int, d: int) -> dict[str, tuple]:
    return {"prototypes": (c, d), "has": (c,)}


HETERO_METHOD_TABLE = {
    "fedtopo": HeteroMethod(
        FedTopoStrategy,
        _topology_loss,
        _topology_upload,
        lambda c, d: {"topology": (c, c)},
        lambda run: dict(tau=run["topo-tau"], weighting=run["topo-weighting"], kappa=run["topo-kappa"]),
    ),
    "local": HeteroMethod(LocalStrategy, _plain_loss, _no_upload, lambda c, d: {}),
    "lg-fedavg": HeteroMethod(
        LgFedAvgStrategy, _head_loss, _head_upload, lambda c, d: {"head.weight": (c, d), "head.bias": (c,)}
    ),
    "fd": HeteroMethod(
        FdStrategy, _distillation_loss, _seen_logits_upload, lambda c, d: {"soft-labels": (c, c), "has": (c,)}
    ),
    "fedproto": HeteroMethod(FedProtoStrategy, _prototype_loss, _class_means_upload, _class_means_broadcast),
    "fedtgp": HeteroMethod(
        FedTgpStrategy,
        _prototype_loss,
        _class_means_upload,
        _class_means_broadcast,
        lambda run: dict(
            server_epochs=run["tgp-server-epochs"],
            margin_cap=run["tgp-margin-cap"],
            margin_rule=run["tgp-margin"],
            server_lr=run["tgp-server-lr"],
            server_batch_size=run["tgp-batch-size"],
        ),
    ),
}
HETERO_METHODS = tuple(HETERO_METHOD_TABLE)


# -- data: identical on server and clients -------------------------------------------------------------------------
@lru_cache(maxsize=2)
def _splits(
    dataset: str, source: str, path: str, seed: int, alpha: float, test_fraction: float, num_partitions: int
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    train, _ = load_dataset(dataset, source, path)
    labels = train.labels.numpy()
    pool = split_train(labels, 0, 0, seed).client_pool  # no server hold-out: evaluation is on clients
    partitioner = make_partitioner("dirichlet", num_partitions, seed, alpha)
    out = []
    for pid, idx in enumerate(partition_indices(labels[pool], partitioner)):
        rows = pool[idx]
        held = stratified_holdout(
            labels[rows], int(round(test_fraction * len(rows))), np.random.default_rng([seed, 47, pid])
        )
        test = rows[held]
        out.append((np.setdiff1d(rows, test), test))
    return tuple(out)


def client_rows(run: RunConfig, num_partitions: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(train rows, test rows) into the training set for every partition id."""
    return _splits(
        run["dataset"],
        run["data-source"],
        run["data-path"],
        run["seed"],
        run["dirichlet-alpha"],
        run["test-fraction"],
        num_partitions,
    )


def client_data(run: RunConfig, pid: int, num_partitions: int) -> tuple[ImageData, ImageData]:
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    rows_train, rows_test = client_rows(run, num_partitions)[pid]
    return train.subset(rows_train), train.subset(rows_test)


# -- client --------------------------------------------------------------------------------------------------------
MODEL_STATE = "hetero-model"  # the ArrayRecord in context.state that holds a client's model between rounds
MODELS_DIR = "client-models"  # where clients keep model files for a resume (see ``client_model_dirs``)
# config keys: the run's token (names its model files' folder in a state-dir and is recorded in each file), and the
# token of the run a resume continues ('' for a checkpoint written before runs had one)
RUN_TOKEN, RESUME_TOKEN = "run-token", "resume-run-token"


def hetero_fingerprint(run: RunConfig, num_clients: int) -> dict:
    """What FedTopo-family checkpoints belong to: every client's architecture, the classes and the feature size."""
    return model_fingerprint(
        run,
        {
            "architectures": [architecture_of(run["model-family"], p) for p in range(num_clients)],
            "num-classes": DATASETS[run["dataset"]].num_classes,
            "feature-dim": run["feature-dim"],
            "num-clients": num_clients,
        },
    )


def run_folder(state_dir: str, token: str) -> str:
    """The folder of one run's model files in a node's ``state-dir``: every run keeps its own (named by the run
    token, which a resumed run takes over from its checkpoint), so runs sharing a node never replace each other's
    files. No token (a checkpoint written before runs had one): the ``state-dir`` itself."""
    return str(Path(state_dir) / f"run-{token}") if token else state_dir


def client_model_dirs(config, node_config) -> tuple[str, str]:
    """(folder to save this client's model files in, folder to resume them from); '' = none. A node's own
    ``state-dir`` (node config: a deployment, where only the node can reach its disk) wins over the folders the
    server names (``client-models-dir`` / ``resume-models-dir``: simulation, one filesystem, inside the run's own
    output folder); in a ``state-dir`` each run has its own folder (``run_folder``)."""
    own = str(node_config.get("state-dir", ""))
    if own:
        return run_folder(own, str(config.get(RUN_TOKEN, ""))), run_folder(own, str(config.get(RESUME_TOKEN, "")))
    return str(config.get("client-models-dir", "")), str(config.get("resume-models-dir", ""))


def _model_file(folder: str, pid: int, server_round: int) -> Path:
    return Path(folder) / f"partition-{pid}-round-{server_round}.pt"


def _saved_rounds(folder: str, pid: int) -> list[int]:
    return sorted(
        int(f.stem.rsplit("-", 1)[1])
        for f in Path(folder).glob(f"partition-{pid}-round-*.pt")
        if f.stem.rsplit("-", 1)[1].isdigit()
    )


def save_model_file(run: RunConfig, pid: int, num: int, model, folder: str, server_round: int, token: str = "") -> None:
    """The client's model after ``server_round`` as a verified file recording the run ``token``; files no checkpoint
    can need any more are removed (the newest one at or before the last checkpoint round before this one is kept,
    and all later). A file there for the same round is replaced only when it is this run's (its token; a resumed
    run training that round again), never another run's."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    if Path(folder).is_symlink():
        raise ValueError(f"{folder}: a symlink where this run keeps its model files; nothing is written through it")
    save_verified(
        _model_file(folder, pid, server_round),
        {
            "round": server_round,
            "run_config": run.to_dict(),
            "run_token": token,
            "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        },
        hetero_fingerprint(run, num),
        replace_if=lambda old: old.get("round") == server_round and old.get("run_token", "") == token,
    )
    every = run["checkpoint-every"]
    last_checkpoint = (server_round - 1) // every * every if every else server_round - 1
    kept = [r for r in _saved_rounds(folder, pid) if r <= last_checkpoint][-1:]
    for r in _saved_rounds(folder, pid):
        if r < server_round and r <= last_checkpoint and r not in kept:
            _model_file(folder, pid, r).unlink(missing_ok=True)


def restore_model_file(
    run: RunConfig, pid: int, num: int, model, folder: str, resume_round: int, token: str = ""
) -> bool:
    """Load this client's newest model file from a round <= ``resume_round`` (the checkpoint being resumed);
    False when there is none (the client never trained before it). A damaged file or one of another run (run
    config, or run ``token`` when the checkpoint has one) or model raises (``ValueError`` naming it): a resume never
    silently continues from the wrong model."""
    rounds = [r for r in _saved_rounds(folder, pid) if r <= resume_round] if folder else []
    if not rounds:
        return False
    path = _model_file(folder, pid, rounds[-1])
    blob = load_verified(path, hetero_fingerprint(run, num))
    differing = run_config_differences(blob["run_config"], run.to_dict())
    if differing:
        raise ValueError(f"{path}: saved by a run with other {differing}")
    if token and blob.get("run_token") != token:
        raise ValueError(f"{path}: saved by another run (run token {blob.get('run_token')!r}, resuming {token!r})")
    model.load_state_dict(blob["model"])
    return True


def load_client_model(run: RunConfig, pid: int, state: RecordDict, num: int = 0, config=None, node_config=None):
    """This client's model from its node state; after a resume, from its newest model file at or before the
    resumed round; else a seeded fresh one (before its first round). On the node's preferred device."""
    num_classes = DATASETS[run["dataset"]].num_classes
    with torch.random.fork_rng():
        torch.manual_seed(derived_seed(run["seed"], 7, pid))
        model = client_model(run["model-family"], pid, num_classes, run["feature-dim"])
    if MODEL_STATE in state.array_records:
        model.load_state_dict(state.array_records[MODEL_STATE].to_torch_state_dict())
    elif config is not None and "resume-round" in config:
        _, resume_dir = client_model_dirs(config, node_config or {})
        token = str(config.get(RESUME_TOKEN, ""))
        if restore_model_file(run, pid, num, model, resume_dir, int(config["resume-round"]), token):
            save_client_model(model, state)
    return model.to(preferred_device())


def save_client_model(model, state: RecordDict) -> None:
    state[MODEL_STATE] = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})


def evaluate_hetero(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """Score this client's own model on its local test split."""
    _, test = client_data(run, pid, num)
    config = msg.content.config_records["config"]
    correct, total = evaluate(load_client_model(run, pid, context.state, num, config, context.node_config), test)
    return Message(
        RecordDict({"metrics": MetricRecord({"correct": correct, "num-test": total, "partition-id": pid})}),
        reply_to=msg,
    )


def train_hetero(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """One client step of a model-heterogeneous method: train the node's own model and upload what the method
    shares (never the weights, except LG-FedAvg's head). A broadcast that fails ``broadcast_problem`` is refused
    (the client raises: the server counts a failure) before the model is touched; a model that is no longer finite
    after training is not saved, so the node keeps its last good model."""
    started = time.perf_counter()
    config = msg.content.config_records["config"]
    server_round = int(config["server-round"])
    train, _ = client_data(run, pid, num)
    dtype = str(config["payload-dtype"])
    record = msg.content.array_records.get("arrays")
    global_arrays = record_to_state(record, dtype) if record is not None else {}
    method = HETERO_METHOD_TABLE[run["method"]]
    problem = broadcast_problem(global_arrays, method.broadcast(_num_classes(run), run["feature-dim"]))
    if problem:
        raise ValueError(f"client {pid} refuses the round-{server_round} broadcast: {problem}")
    model = load_client_model(run, pid, context.state, num, config, context.node_config)
    seed = derived_seed(run["seed"], server_round, pid)
    loss_fn = method.loss(run, model, global_arrays)
    settings = LocalSettings.from_run(run, float(config["lr"]), seed)
    metrics = local_train(model, train, settings, loss_fn)
    if not model_is_finite(model):
        raise FloatingPointError(f"client {pid}: training diverged in round {server_round}; the model is not saved")
    upload = method.upload(run, model, train, seed, loss_fn)
    samples = metrics["local-steps"] * settings.batch_size
    costs = hetero_train_costs(run, pid, tuple(train.images.shape[1:]), samples)
    save_client_model(model, context.state)
    save_dir, _ = client_model_dirs(config, context.node_config)
    if save_dir:
        save_model_file(run, pid, num, model, save_dir, server_round, str(config.get(RUN_TOKEN, "")))
    return Message(
        RecordDict(
            {
                "upload": state_to_record(upload, dtype),
                "metrics": MetricRecord(
                    {
                        "num-examples": len(train),
                        "partition-id": pid,
                        **metrics,
                        **costs,
                        "client-seconds": time.perf_counter() - started,
                    }
                ),
            }
        ),
        reply_to=msg,
    )


def hetero_train_costs(run: RunConfig, pid: int, image_shape: tuple[int, ...], samples: int) -> dict:
    """Reply metrics of what this client's training cost (clients.csv): FLOPs from its model's forward MACs."""
    family = run["model-family"]
    macs = forward_macs(family, architecture_of(family, pid), _num_classes(run), run["feature-dim"], image_shape)
    return model_train_costs(macs, macs, samples)


# -- server --------------------------------------------------------------------------------------------------------
def _class_counts(run: RunConfig, rows: np.ndarray) -> np.ndarray:
    """Per-class counts of these training-set rows (what a client of that split reports as its counts)."""
    train, _ = load_dataset(run["dataset"], run["data-source"], run["data-path"])
    return np.bincount(train.labels.numpy()[rows], minlength=_num_classes(run)).astype(np.float32)


def build_strategy(run: RunConfig, node_of_partition: dict[int, int]):
    """The method's strategy. The server derives every client's split from the seed as the clients do, so it knows
    the size and per-class counts of each training split and the size of each test split, and holds replies to
    them."""
    if run["method"] not in HETERO_METHOD_TABLE:
        raise ValueError(f"method='{run['method']}': allowed model-heterogeneous methods are {list(HETERO_METHODS)}")
    method = HETERO_METHOD_TABLE[run["method"]]
    rows = client_rows(run, len(node_of_partition))
    common = dict(
        **round_options(run, len(node_of_partition)),
        num_rounds=run["num-server-rounds"],
        eval_every=run["eval-every"],
        feature_dim=run["feature-dim"],
        train_size_of_partition={pid: len(rows[pid][0]) for pid in node_of_partition},
        test_size_of_partition={pid: len(rows[pid][1]) for pid in node_of_partition},
        train_counts_of_partition={pid: _class_counts(run, rows[pid][0]) for pid in node_of_partition},
    )
    return method.strategy(node_of_partition, _num_classes(run), **method.strategy_options(run), **common)


def hetero_summary(run: RunConfig, strategy, num_clients: int, seconds: float, error: str | None) -> dict:
    rounds = strategy.rounds
    last = next((h for h in reversed(strategy.history) if not math.isnan(h["mean_client_accuracy"])), {})
    return {
        **summary_head(run, error),
        "rounds_done": max(strategy.train_loss, default=0),
        "num_clients": num_clients,
        "clients_per_round": run.clients_per_round(num_clients),
        "model_family": run["model-family"],
        "architectures": [architecture_of(run["model-family"], pid) for pid in range(num_clients)],
        "mean_client_accuracy": last.get("mean_client_accuracy"),
        "pooled_accuracy": last.get("pooled_accuracy"),
        "accuracy_round": last.get("round"),
        "client_accuracy": [strategy.client_accuracy.get(p) for p in range(num_clients)],
        "bytes_up": sum(r.bytes_up for r in rounds.values()),
        "bytes_down": sum(r.bytes_down for r in rounds.values()),
        "bytes_up_per_round": sum(r.bytes_up for r in rounds.values()) / max(len(rounds), 1),
        "bytes_down_per_round": sum(r.bytes_down for r in rounds.values()) / max(len(rounds), 1),
        "failed_replies": sum(len(r.failed) for r in rounds.values()),
        "rejected_replies": sum(len(r.rejected) for r in rounds.values()),
        "failed_evaluations": sum(len(r.failed) for r in strategy.eval_rounds.values()),
        "rejected_evaluations": sum(len(r.rejected) for r in strategy.eval_rounds.values()),
        "history": strategy.history,
        "wall_seconds": round(seconds, 1),
        "run_config": run.to_dict(),
        **(
            {"tgp_margins": {str(r): m for r, m in sorted(strategy.margins.items())}}
            if hasattr(strategy, "margins")
            else {}
        ),
    }


def write_hetero_checkpoint(
    out_dir: Path, server_round: int, run: RunConfig, strategy, num_clients: int, clients: ClientRecords
) -> Path:
    path = out_dir / CHECKPOINT_FILE
    return save_verified(
        path,
        {
            "round": server_round,
            "run_config": run.to_dict(),
            "run_token": strategy.client_config[RUN_TOKEN],
            "num_clients": num_clients,
            "strategy": strategy.checkpoint_state(),
            "rng": capture_rng(),
            CLIENT_RECORDS_KEY: clients.checkpoint_state(),
        },
        hetero_fingerprint(run, num_clients),
        replace_if=same_run_earlier_round(run, server_round, path),
    )


def run_hetero(grid, run: RunConfig, nodes: dict[int, dict]) -> dict:
    """Run a model-heterogeneous method end to end. metrics.csv, rounds.csv and clients.csv are rewritten after every
    round; summary.json and accuracy_per_round.png at the end, also when a round fails (``completed: false`` and the
    error, before the error is raised again).

    With ``checkpoint-every`` N > 0, the server writes checkpoint.pt (its whole state: global arrays, FedTGP's
    generator, round logs, metrics, the clients' statistics) every N rounds, and each client writes its own model
    after each round it trains (to ``<output-dir>/client-models`` in simulation, or to its node config's
    ``state-dir`` in a deployment). With
    ``resume-from``, the server continues from the checkpoint's round and each client, on its first message,
    reloads its newest model file at or before that round."""
    num_clients = len(nodes)
    node_of_partition = {pid: info["node_id"] for pid, info in nodes.items()}
    resumed = (
        load_run_checkpoint(run["resume-from"], run, num_clients, hetero_fingerprint(run, num_clients))
        if run["resume-from"]
        else None
    )
    out_dir = prepare_output_dir(run["output-dir"], run["method"], run["dataset"], run["seed"])
    strategy = build_strategy(run, node_of_partition)
    family, rows = run["model-family"], client_rows(run, num_clients)
    clients = ClientRecords(
        node_of_partition,
        architecture={pid: architecture_of(family, pid) for pid in node_of_partition},
        num_examples={pid: len(rows[pid][0]) for pid in node_of_partition},
    )
    first_round = 1
    # the run's identity for its clients' model files: new for a new run, the checkpoint's for a resumed one
    token = str(resumed[1].get("run_token", "")) if resumed is not None else ""
    strategy.client_config[RUN_TOKEN] = token or secrets.token_hex(8)
    if run["checkpoint-every"]:
        strategy.client_config["client-models-dir"] = str(out_dir / MODELS_DIR)
    if resumed is not None:
        path, blob = resumed
        folder = path.parent
        strategy.restore_state(blob["strategy"])
        first_round = blob["round"] + 1
        resume_client_records(clients, blob, run["resume-from"])
        strategy.client_config.update(
            {"resume-models-dir": str(folder / MODELS_DIR), "resume-round": blob["round"], RESUME_TOKEN: token}
        )
        log(INFO, "Resuming from %s at round %d", folder, first_round)
    log(
        INFO,
        "%s on %s: %d clients (%s family), Dirichlet α=%s, output %s, run token %s",
        run["method"],
        run["dataset"],
        num_clients,
        run["model-family"],
        run["dirichlet-alpha"],
        out_dir,
        strategy.client_config[RUN_TOKEN],
    )

    def round_done(server_round: int) -> None:
        write_round_files(out_dir, strategy.history, strategy.rounds, clients)
        if run["checkpoint-every"] and server_round % run["checkpoint-every"] == 0:
            write_hetero_checkpoint(out_dir, server_round, run, strategy, num_clients, clients)

    started, error = time.time(), None
    try:
        strategy.start(
            clients.wrap(grid),
            state_to_record({}),
            num_rounds=run["num-server-rounds"],
            timeout=run["round-timeout"],
            first_round=first_round,
            round_done=round_done,
        )
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
        raise
    finally:
        elapsed = time.time() - started
        summary = hetero_summary(run, strategy, num_clients, elapsed, error)
        plot_accuracy_per_round(
            out_dir / "accuracy_per_round.png",
            {run["method"]: [(h["round"], h["mean_client_accuracy"]) for h in strategy.history]},
            f"{run['method']} on {run['dataset']} ({num_clients} clients)",
        )
        write_results(out_dir, summary, strategy.history, strategy.rounds, clients)
        log(INFO, "Results written to %s", out_dir)
    log(
        INFO,
        "Done in %.0fs: mean client accuracy %.1f%%, pooled %.1f%%, %.0f bytes up per round",
        elapsed,
        100 * (summary["mean_client_accuracy"] or 0),
        100 * (summary["pooled_accuracy"] or 0),
        summary["bytes_up_per_round"],
    )
    return summary
