"""Server and client wiring of the model-heterogeneous family: FedTopo and its baselines (local, LG-FedAvg, FD,
FedProto, FedTGP), one row each in ``MULTIARCH_METHOD_TABLE``.

Client i trains ``family[i % backbones]`` on its own local training split and is scored on its local test split
(``fl_app.data.local_splits``). Models never leave the clients: a client keeps its model between rounds in its node's
``context.state`` (in simulation and in a deployment alike), and in model files for a resume
(``fl_app.run.checkpoint.save_model_file``). The server's run is a ``FederatedRun`` told what this family does
differently by ``MultiArchFamily``.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from logging import DEBUG
from pathlib import Path
from typing import Callable

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from clients.fedtopo import (
    broadcast_problem,
    class_counts,
    evaluate_per_class,
    fedtopo_loss,
    fedtopo_upload,
    local_train,
    model_is_finite,
)
from clients.fedtopo_baselines import FdLoss, class_means_upload, head_upload, load_head, plain_ce, proto_loss
from clients.local_training import LocalSettings
from fl_app.data.images import DATASETS, load_dataset
from fl_app.data.local_splits import (
    client_data,
    client_rows,
    client_validation_data,
    client_validation_rows,
    global_test_class_counts,
    global_test_data,
    split_description,
    train_class_counts,
)
from fl_app.models.multiarch import architecture_of, client_model, forward_macs
from fl_app.run.checkpoint import (
    MODELS_DIR,
    RESUME_TOKEN,
    RUN_TOKEN,
    client_model_dirs,
    multiarch_fingerprint,
    restore_model_file,
    save_model_file,
)
from fl_app.run.config import RunConfig
from fl_app.run.costs import model_train_costs
from fl_app.run.device import preferred_device
from fl_app.run.lifecycle import FederatedRun, MethodFamily
from fl_app.run.node_query import NODE_ID
from fl_app.run.outputs import plot_accuracy_per_round
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.run.phase_times import PhaseTimer
from fl_app.run.records import ARRAYS_RECORD, CONFIG_RECORD, METRICS_RECORD, UPLOAD_RECORD
from fl_app.run.seeds import derived_seed
from strategies.evaluation_scores import best_round_scores
from strategies.fedtopo import FedTopoStrategy
from strategies.fedtopo_baselines import FdStrategy, FedProtoStrategy, FedTgpStrategy, LgFedAvgStrategy, LocalStrategy
from strategies.multiarch_base import MultiArchStrategy
from strategies.rounds import round_options

# the values of a client's training step a ``ClientCall`` can pass (any other argument name is a run-config key)
STEP_VALUES = ("global_arrays", "model", "train", "round_seed", "num_classes", "class_counts", "loss_fn")


# -- the methods: one row each ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientCall:
    """A client function and where its arguments come from, in order: a value of the training step (``STEP_VALUES``:
    the global arrays received, the client's model, its training split, the round's seed for this client, the
    number of classes, the split's per-class counts, the loss built for the round) or, any other name, that
    run-config key."""

    function: Callable
    arguments: tuple[str, ...] = ()

    def __call__(self, run: RunConfig, step: dict):
        return self.function(*(step[name] if name in STEP_VALUES else run[name] for name in self.arguments))


@dataclass(frozen=True)
class MultiArchMethod:
    """Both sides of one model-heterogeneous method."""

    strategy: type[MultiArchStrategy]
    broadcast: Callable[[int, int], dict[str, tuple]]  # (classes, feature size) -> what the server sends, once merged
    loss: ClientCall | None = None  # the client's loss_fn(logits, features, labels); None: plain cross-entropy
    upload: ClientCall | None = None  # the arrays the client uploads after training; None: nothing
    before_training: ClientCall | None = None  # what the client does to its model with the broadcast first
    strategy_options: dict[str, str] = field(default_factory=dict)  # the strategy's keyword -> its run-config key


def _class_means_broadcast(c: int, d: int) -> dict[str, tuple]:
    return {"prototypes": (c, d), "has": (c,)}


_PROTOTYPE_LOSS = ClientCall(proto_loss, ("global_arrays", "distill-lambda"))
_CLASS_MEANS_UPLOAD = ClientCall(
    class_means_upload, ("model", "train", "num_classes", "proto-max-samples", "round_seed")
)
MULTIARCH_METHOD_TABLE = {
    "fedtopo": MultiArchMethod(
        FedTopoStrategy,
        lambda c, d: {"topology": (c, c)},
        loss=ClientCall(fedtopo_loss, ("global_arrays", "topo-beta")),
        upload=ClientCall(
            fedtopo_upload, ("model", "train", "num_classes", "topo-source", "proto-max-samples", "round_seed")
        ),
        strategy_options={
            "tau": "topo-tau",
            "weighting": "topo-weighting",
            "kappa": "topo-kappa",
            "kappa_quantile": "topo-kappa-quantile",
        },
    ),
    "local": MultiArchMethod(LocalStrategy, lambda c, d: {}),
    "lg-fedavg": MultiArchMethod(
        LgFedAvgStrategy,
        lambda c, d: {"head.weight": (c, d), "head.bias": (c,)},
        upload=ClientCall(head_upload, ("model",)),
        before_training=ClientCall(load_head, ("model", "global_arrays")),  # LG-FedAvg trains on from the global head
    ),
    "fd": MultiArchMethod(
        FdStrategy,
        lambda c, d: {"soft-labels": (c, c), "has": (c,)},
        loss=ClientCall(FdLoss, ("global_arrays", "distill-lambda", "num_classes")),
        upload=ClientCall(FdLoss.upload, ("loss_fn", "class_counts")),  # the mean logits seen while training
    ),
    "fedproto": MultiArchMethod(
        FedProtoStrategy, _class_means_broadcast, loss=_PROTOTYPE_LOSS, upload=_CLASS_MEANS_UPLOAD
    ),
    "fedtgp": MultiArchMethod(
        FedTgpStrategy,
        _class_means_broadcast,
        loss=_PROTOTYPE_LOSS,
        upload=_CLASS_MEANS_UPLOAD,
        strategy_options={
            "server_epochs": "tgp-server-epochs",
            "margin_cap": "tgp-margin-cap",
            "margin_rule": "tgp-margin",
            "server_lr": "tgp-server-lr",
            "server_batch_size": "tgp-batch-size",
        },
    ),
}
MULTIARCH_METHODS = tuple(MULTIARCH_METHOD_TABLE)


# -- client --------------------------------------------------------------------------------------------------------
MODEL_STATE = "multiarch-model"  # the ArrayRecord in context.state that holds a client's model between rounds


def load_client_model(run: RunConfig, pid: int, state: RecordDict, num: int = 0, config=None, node_config=None):
    """This client's model from its node state; after a resume, from its newest model file at or before the
    resumed round; else a seeded fresh one (before its first round). On the node's preferred device."""
    num_classes = DATASETS[run["dataset"]].num_classes
    with torch.random.fork_rng():
        torch.manual_seed(derived_seed(run["seed"], 7, pid))
        model = client_model(run["model-family"], pid, num_classes, run["feature-dim"], run["backbones"])
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


def evaluate_multiarch(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """Score this client's own model on its local test split, per class, and with ``global-test-per-class`` > 0 on
    the global test set too (per class: the server knows its totals)."""
    _, test = client_data(run, pid, num)
    config = msg.content.config_records[CONFIG_RECORD]
    num_classes = DATASETS[run["dataset"]].num_classes
    model = load_client_model(run, pid, context.state, num, config, context.node_config)
    class_correct, class_total = evaluate_per_class(model, test, num_classes)
    metrics = {
        "correct": int(class_correct.sum()),
        "num-test": len(test),
        "partition-id": pid,
        "class-correct": class_correct.tolist(),
        "class-total": class_total.tolist(),
    }
    if run["validation-fraction"] > 0:
        validation = client_validation_data(run, pid, num)
        metrics["val-correct"] = int(evaluate_per_class(model, validation, num_classes)[0].sum())
        metrics["num-val"] = len(validation)
    if run["global-test-per-class"] > 0:
        metrics["global-class-correct"] = evaluate_per_class(model, global_test_data(run), num_classes)[0].tolist()
    return Message(RecordDict({METRICS_RECORD: MetricRecord(metrics)}), reply_to=msg)


def train_multiarch(msg: Message, run: RunConfig, pid: int, num: int, context: Context) -> Message:
    """One client step of a model-heterogeneous method: train the node's own model and upload what the method
    shares (never the weights, except LG-FedAvg's head). A broadcast that fails ``broadcast_problem`` is refused
    (the client raises: the server counts a failure) before the model is touched; a model that is no longer finite
    after training is not saved, so the node keeps its last good model."""
    started, timer = time.perf_counter(), PhaseTimer()
    config = msg.content.config_records[CONFIG_RECORD]
    server_round, num_classes = int(config["server-round"]), DATASETS[run["dataset"]].num_classes
    train, _ = client_data(run, pid, num)
    timer.lap("data")
    dtype = str(config["payload-dtype"])
    record = msg.content.array_records.get(ARRAYS_RECORD)
    global_arrays = record_to_state(record, dtype) if record is not None else {}
    method = MULTIARCH_METHOD_TABLE[run["method"]]
    problem = broadcast_problem(global_arrays, method.broadcast(num_classes, run["feature-dim"]))
    if problem:
        raise ValueError(f"client {pid} refuses the round-{server_round} broadcast: {problem}")
    timer.lap("decode")
    model = load_client_model(run, pid, context.state, num, config, context.node_config)
    timer.lap("model")
    seed = derived_seed(run["seed"], server_round, pid)
    step = dict(global_arrays=global_arrays, model=model, train=train, round_seed=seed, num_classes=num_classes)
    if method.before_training is not None:
        method.before_training(run, step)
    step["loss_fn"] = method.loss(run, step) if method.loss is not None else plain_ce
    settings = LocalSettings.from_run(run, float(config["lr"]), seed)
    metrics = local_train(model, train, settings, step["loss_fn"])
    if not model_is_finite(model):
        raise FloatingPointError(f"client {pid}: training diverged in round {server_round}; the model is not saved")
    step["class_counts"] = class_counts(train, num_classes)
    upload = method.upload(run, step) if method.upload is not None else {}
    timer.lap("steps")  # with what the method computes for its upload (prototypes, class means): work, not messaging
    costs = multiarch_train_costs(run, pid, tuple(train.images.shape[1:]), metrics["local-steps"] * settings.batch_size)
    save_client_model(model, context.state)
    save_dir, _ = client_model_dirs(config, context.node_config)
    if save_dir:
        save_model_file(run, pid, num, model, save_dir, server_round, str(config.get(RUN_TOKEN, "")))
    reply = {"num-examples": len(train), "partition-id": pid, **metrics, **costs}
    reply["client-seconds"] = time.perf_counter() - started
    content = RecordDict({UPLOAD_RECORD: state_to_record(upload, dtype), METRICS_RECORD: MetricRecord(reply)})
    timer.lap("encode")  # the reply, its costs and the model saved for the next round
    log(DEBUG, timer.line("client", server_round, pid))
    return Message(content, reply_to=msg)


def multiarch_train_costs(run: RunConfig, pid: int, image_shape: tuple[int, ...], samples: int) -> dict:
    """Reply metrics of what this client's training cost: FLOPs from its model's forward MACs."""
    macs = client_forward_macs(run, pid, image_shape)
    return model_train_costs(macs, macs, samples)


def client_forward_macs(run: RunConfig, pid: int, image_shape: tuple[int, ...]) -> float:
    """Forward MACs of partition ``pid``'s model on one image (the server costs a client's training with it too)."""
    family = run["model-family"]
    return forward_macs(
        family,
        architecture_of(family, pid, run["backbones"]),
        DATASETS[run["dataset"]].num_classes,
        run["feature-dim"],
        image_shape,
    )


# -- server --------------------------------------------------------------------------------------------------------
def build_strategy(run: RunConfig, node_of_partition: dict[int, int]):
    """The method's strategy. The server derives every client's split from the seed as the clients do, so it knows
    the size and per-class counts of each training split and the size of each test split, and holds replies to
    them, and the forward MACs of each client's model (what its training is costed by)."""
    if run["method"] not in MULTIARCH_METHOD_TABLE:
        raise ValueError(f"method='{run['method']}': allowed model-heterogeneous methods are {list(MULTIARCH_METHODS)}")
    method = MULTIARCH_METHOD_TABLE[run["method"]]
    rows = client_rows(run, len(node_of_partition))
    image_shape = tuple(load_dataset(run["dataset"], run["data-source"], run["data-path"])[0].images.shape[1:])
    common = dict(
        **round_options(run, len(node_of_partition)),
        num_rounds=run["num-server-rounds"],
        eval_every=run["eval-every"],
        feature_dim=run["feature-dim"],
        train_size_of_partition={pid: len(rows[pid][0]) for pid in node_of_partition},
        test_size_of_partition={pid: len(rows[pid][1]) for pid in node_of_partition},
        train_counts_of_partition={pid: train_class_counts(run, rows[pid][0]) for pid in node_of_partition},
        # a local test split's rows are training-set rows too
        test_counts_of_partition={pid: train_class_counts(run, rows[pid][1]) for pid in node_of_partition},
        global_test_counts=global_test_class_counts(run) if run["global-test-per-class"] > 0 else None,
        validation_size_of_partition=(
            {pid: len(client_validation_rows(run, len(node_of_partition))[pid]) for pid in node_of_partition}
            if run["validation-fraction"] > 0
            else None
        ),
        macs_of_partition={pid: client_forward_macs(run, pid, image_shape) for pid in node_of_partition},
    )
    return method.strategy(
        node_of_partition,
        DATASETS[run["dataset"]].num_classes,
        **{key: run[name] for key, name in method.strategy_options.items()},
        **common,
    )


class MultiArchFamily(MethodFamily):
    """What the model-heterogeneous methods do in a ``FederatedRun``: clients evaluate their own models (the
    strategy's ``history`` is metrics.csv), the server has no global model to save, so the checkpoint after the last
    round is its final state; each run has a token naming its clients' model files (new, or the resumed run's), and
    with ``checkpoint-every`` N > 0 the clients write their models after each round they train (to
    ``<output-dir>/client-models`` in simulation, or to their node config's ``state-dir`` in a deployment). With
    ``resume-from``, each client, on its first message, reloads its newest model file at or before the checkpoint's
    round."""

    checkpoint_last_round = True

    def __init__(self, run: RunConfig, nodes: dict[int, dict]):
        self.run, self.num_clients = run, len(nodes)
        self.strategy = build_strategy(run, {pid: info[NODE_ID] for pid, info in nodes.items()})
        self.fingerprint = multiarch_fingerprint(run, self.num_clients)
        family, rows = run["model-family"], client_rows(run, self.num_clients)
        self.client_columns = {
            "architecture": {pid: architecture_of(family, pid, run["backbones"]) for pid in nodes},
            "num_examples": {pid: len(rows[pid][0]) for pid in nodes},
        }

    def prepare(self, out_dir: Path) -> None:
        self.strategy.client_config[RUN_TOKEN] = secrets.token_hex(8)
        if self.run["checkpoint-every"]:
            self.strategy.client_config["client-models-dir"] = str(out_dir / MODELS_DIR)

    def restore(self, blob: dict, path: Path) -> None:
        self.strategy.restore_state(blob["strategy"])
        # the run's identity for its clients' model files is the checkpoint's ('' before runs had one: a new one)
        token = str(blob.get("run_token", ""))
        if token:
            self.strategy.client_config[RUN_TOKEN] = token
        self.strategy.client_config.update(
            {"resume-models-dir": str(path.parent / MODELS_DIR), "resume-round": blob["round"], RESUME_TOKEN: token}
        )

    def describe(self) -> str:
        run, token = self.run, self.strategy.client_config[RUN_TOKEN]
        return f"{run['model-family']} family, {split_description(run)}, run token {token}"

    def initial_arrays(self):
        return state_to_record({})

    def metrics_rows(self) -> list[dict]:
        return self.strategy.history

    def checkpoint_state(self) -> dict:
        return {"run_token": self.strategy.client_config[RUN_TOKEN], "strategy": self.strategy.checkpoint_state()}

    def summary_fields(self) -> dict:
        run, strategy, rounds = self.run, self.strategy, self.strategy.rounds
        last = next((h for h in reversed(strategy.history) if not math.isnan(h["mean_client_accuracy"])), {})
        margins = getattr(strategy, "margins", None)  # FedTGP's margin per round
        return {
            "model_family": run["model-family"],
            "architectures": [
                architecture_of(run["model-family"], pid, run["backbones"]) for pid in range(self.num_clients)
            ],
            "mean_client_accuracy": last.get("mean_client_accuracy"),
            "pooled_accuracy": last.get("pooled_accuracy"),
            "balanced_accuracy": last.get("balanced_accuracy"),
            "global_accuracy": last.get("global_accuracy"),
            "accuracy_round": last.get("round"),
            **best_round_scores(strategy.history),
            "client_accuracy": [strategy.client_accuracy.get(p) for p in range(self.num_clients)],
            "client_global_accuracy": [strategy.client_global_accuracy.get(p) for p in range(self.num_clients)],
            "bytes_up_per_round": sum(r.bytes_up for r in rounds.values()) / max(len(rounds), 1),
            "bytes_down_per_round": sum(r.bytes_down for r in rounds.values()) / max(len(rounds), 1),
            "failed_evaluations": sum(len(r.failed) for r in strategy.eval_rounds.values()),
            "rejected_evaluations": sum(len(r.rejected) for r in strategy.eval_rounds.values()),
            "history": strategy.history,
            **({"tgp_margins": {str(r): m for r, m in sorted(margins.items())}} if margins is not None else {}),
        }

    def plot(self, out_dir: Path, summary: dict) -> None:
        run = self.run
        plot_accuracy_per_round(
            out_dir / "accuracy_per_round.png",
            {run["method"]: [(h["round"], h["mean_client_accuracy"]) for h in self.strategy.history]},
            f"{run['method']} on {run['dataset']} ({self.num_clients} clients)",
        )

    def outcome(self, summary: dict) -> str:
        return (
            f": mean client accuracy {100 * (summary['mean_client_accuracy'] or 0):.1f}%, pooled "
            f"{100 * (summary['pooled_accuracy'] or 0):.1f}%, {summary['bytes_up_per_round']:.0f} bytes up per round"
        )


def run_multiarch(grid, run: RunConfig, nodes: dict[int, dict]) -> dict:
    """Run a model-heterogeneous method end to end and return its summary; how these runs differ from the other
    family's is ``MultiArchFamily``."""
    return FederatedRun(run, nodes, MultiArchFamily(run, nodes)).execute(grid)
