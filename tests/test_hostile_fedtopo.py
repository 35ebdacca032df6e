"""Hostile clients against FedTopo and its five baselines (Local, LG-FedAvg, FD, FedProto, FedTGP).

Strategy level (tests/hostile.py): one of three clients answers every training round with each kind of bad reply
(every standard corruption plus the methods' own: poisoned counts, broken topology invariants, statistics for classes
the client does not hold) or times out; the run completes under min-reply-fraction and the global state stays finite
and equal to the run in which that client never answers. Evaluation replies are screened the same way.
Client level: a client refuses a poisoned broadcast and its saved model never changes. End to end (in-process, real
client training): one client's uploads are poisoned every round; every honest client's model and the global state
are equal to the run in which that client times out.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Error
from flwr.common.constant import ErrorCode

from clients.fedtopo import relation_scores
from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from fl_app.multiarch_app import MODEL_STATE, MULTIARCH_METHODS, train_multiarch
from fl_app.run.config import validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from strategies.fedtopo import FedTopoStrategy
from strategies.fedtopo_baselines import FdStrategy, FedProtoStrategy, FedTgpStrategy, LgFedAvgStrategy, LocalStrategy
from tests.harness.in_process import TINY_RUN
from tests.hostile import NEVER, Corruption, check_hostile, node_of, run_rounds, standard_corruptions

C, D = 4, 3  # classes, feature dimension
TRAIN = {0: 60, 1: 80, 2: 100}
TEST = {0: 15, 1: 20, 2: 25}
COUNTS = {0: [30, 30, 0, 0], 1: [20, 0, 40, 20], 2: [25, 25, 25, 25]}  # sum to TRAIN
STRATEGIES = {
    "fedtopo": (FedTopoStrategy, {"tau": 0.5, "kappa": 5.0}),
    "local": (LocalStrategy, {}),
    "lg-fedavg": (LgFedAvgStrategy, {}),
    "fd": (FdStrategy, {}),
    "fedproto": (FedProtoStrategy, {}),
    "fedtgp": (FedTgpStrategy, {"server_epochs": 1, "server_batch_size": 4}),
}


def test_the_matrix_covers_the_six_multiarch_methods():
    assert sorted(STRATEGIES) == sorted(MULTIARCH_METHODS)


def make_strategy_of(method: str):
    cls, kwargs = STRATEGIES[method]

    def make_strategy(min_reply_fraction: float):
        return cls(
            {p: node_of(p) for p in TRAIN},
            C,
            clients_per_round=3,
            seed=0,
            num_rounds=2,
            min_reply_fraction=min_reply_fraction,
            feature_dim=D,
            train_size_of_partition=TRAIN,
            test_size_of_partition=TEST,
            train_counts_of_partition={p: np.array(c, np.float32) for p, c in COUNTS.items()},
            **kwargs,
        )

    return make_strategy


def honest_upload(method: str, msg: Message, pid: int) -> dict[str, np.ndarray]:
    """Deterministic stand-in for a client's local training and upload."""
    server_round = msg.content.config_records["config"]["server-round"]
    counts = np.array(COUNTS[pid], dtype=np.float32)
    rng = np.random.default_rng([pid, server_round])
    held = (counts > 0)[:, None]
    if method == "fedtopo":
        protos = torch.tensor(rng.normal(size=(C, D)), dtype=torch.float32)
        return {"relations": relation_scores(protos, torch.from_numpy(counts)).numpy(), "counts": counts}
    if method == "lg-fedavg":
        received = record_to_state(msg.content.array_records["arrays"])
        weight = received.get("head.weight", np.zeros((C, D), np.float32))
        return {
            "head.weight": 0.5 * weight + rng.normal(size=(C, D)).astype(np.float32),
            "head.bias": rng.normal(size=C).astype(np.float32),
        }
    if method == "fd":
        return {"means": (rng.normal(size=(C, C)) * held).astype(np.float32), "counts": counts}
    if method in ("fedproto", "fedtgp"):
        return {"means": (rng.normal(size=(C, D)) * held).astype(np.float32), "counts": counts}
    return {}


def honest_of(method: str):
    def honest(msg: Message, pid: int) -> RecordDict:
        if msg.metadata.message_type == MessageType.EVALUATE:
            return RecordDict({"metrics": MetricRecord({"correct": TEST[pid] // 2 + pid, "num-test": TEST[pid]})})
        return RecordDict(
            {
                "upload": state_to_record(honest_upload(method, msg, pid)),
                "metrics": MetricRecord({"num-examples": TRAIN[pid], "train-loss": 1.0 + 0.1 * pid, "local-steps": 2}),
            }
        )

    return honest


def global_state_of(method: str):
    def global_state(strategy) -> dict[str, np.ndarray]:
        state = {k: np.asarray(v) for k, v in strategy.global_arrays.items()}
        state["train-loss"] = np.array([strategy.train_loss[r] for r in sorted(strategy.train_loss)])
        if method == "fedtgp":
            state.update({f"generator.{k}": v.numpy() for k, v in strategy.generator.state_dict().items()})
        return state

    return global_state


# -- the methods' own corruptions ----------------------------------------------------------------------------------
def _upload_change(change):
    """A corruption that edits the decoded honest upload (kept a valid float32 record: only the content lies)."""

    def corrupt(content: RecordDict, msg: Message) -> RecordDict:
        upload = record_to_state(content.array_records["upload"])
        change(upload)
        copy = RecordDict(dict(content))
        copy["upload"] = state_to_record({k: np.asarray(v, np.float32) for k, v in upload.items()})
        return copy

    return corrupt


def _set(key: str, index, value):
    def change(upload):
        upload[key] = np.array(upload[key], np.float32)
        upload[key][index] = value

    return change


def _move_count(source: int, target: int):
    """One example moved from class ``source`` to class ``target`` (both held): the total stays the split's."""

    def change(upload):
        upload["counts"] = np.array(upload["counts"], np.float32)
        upload["counts"][source] -= 1
        upload["counts"][target] += 1

    return change


def method_corruptions(method: str) -> list[Corruption]:
    cases = []
    if method in ("fedtopo", "fd", "fedproto", "fedtgp"):
        cases += [
            ("counts-nan", _set("counts", 0, np.nan)),
            ("counts-1e12", _set("counts", 0, 1e12)),
            ("counts-negative", _set("counts", 0, -30.0)),
            ("counts-fraction", _set("counts", 0, 29.5)),
            ("counts-over-partition", _set("counts", 0, 31.0)),
            ("counts-moved-between-classes", _move_count(0, 1)),  # the right total, not the partition's counts
        ]
    if method == "fedtopo":
        cases += [
            ("relations-above-one", _set("relations", (0, 1), 1.5)),
            ("relations-mixed-sign-asymmetric", _set("relations", (0, 1), -0.9)),
            ("relations-diagonal", _set("relations", (0, 0), 0.5)),
            ("relations-absent-class", _set("relations", (0, 2), 0.3)),
        ]
    if method in ("fd", "fedproto", "fedtgp"):
        cases += [("means-for-absent-class", _set("means", 2, 0.5))]
    cases = [Corruption(name, _upload_change(change)) for name, change in cases]
    cases.append(
        Corruption(
            "unknown-record",
            lambda content, msg: RecordDict(
                {**dict(content), "extra": ArrayRecord({"x": Array(np.zeros(3, np.float32))})}
            ),
        )
    )
    return cases


# corruptions of tests/hostile.py that edit the first array of the upload: the empty upload of ``local`` has none
FIRST_ARRAY = (
    "nan",
    "inf",
    "-inf",
    "1e37",
    "1e10",
    "dtype-",
    "wrong-shape",
    "scalar-array",
    "missing-key",
    "huge-under-valid-key",
    "header-disagrees-with-metadata",
    "header-claims-a-huge-shape",
)


def corruptions_of(method: str) -> list[Corruption]:
    standard = standard_corruptions(C, metric_keys=("num-examples", "train-loss", "client-seconds"))
    if method == "local":
        standard = [c for c in standard if not c.name.startswith(FIRST_ARRAY)]
    return standard + method_corruptions(method)


@pytest.mark.parametrize("method", sorted(MULTIARCH_METHODS))
def test_every_bad_training_reply_is_rejected_and_changes_nothing(flower_ids, method):
    setup = dict(
        make_strategy=make_strategy_of(method),
        initial=state_to_record({}),
        honest=honest_of(method),
        global_state=global_state_of(method),
    )
    _, reference = check_hostile(corruption=Corruption("never-answers", lambda content, msg: NEVER, "failed"), **setup)
    for corruption in corruptions_of(method):
        strategy, _ = check_hostile(corruption=corruption, reference=reference, **setup)
        assert sum(len(log_.rejected) + len(log_.failed) for log_ in strategy.rounds.values()) == 2  # counted once
        assert strategy.history and not math.isnan(strategy.history[-1]["mean_client_accuracy"])


EVALUATION_CORRUPTIONS = [
    ("correct-above-num-test", lambda m: {"correct": TEST[0] + 1, "num-test": TEST[0]}, "rejected"),
    ("huge-correct", lambda m: {"correct": 33_333, "num-test": 1}, "rejected"),
    ("negative", lambda m: {"correct": -1, "num-test": -3}, "rejected"),
    ("num-test-not-the-split", lambda m: {"correct": 1, "num-test": TEST[0] + 5}, "rejected"),
    ("list-typed", lambda m: {"correct": [1], "num-test": TEST[0]}, "rejected"),
    ("float-typed", lambda m: {"correct": 1.5, "num-test": TEST[0]}, "rejected"),
    ("missing", lambda m: {"num-test": TEST[0]}, "rejected"),
    ("client-error", lambda m: Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "raised"), "failed"),
    ("never-answers", lambda m: NEVER, "failed"),
]


@pytest.mark.parametrize("name, metrics, counted", EVALUATION_CORRUPTIONS, ids=[c[0] for c in EVALUATION_CORRUPTIONS])
def test_bad_evaluation_replies_are_rejected_and_do_not_end_the_run(flower_ids, name, metrics, counted):
    def corrupt(content, msg):
        bad = metrics(msg)
        return bad if isinstance(bad, Error) or bad is NEVER else RecordDict({"metrics": MetricRecord(bad)})

    corruption = Corruption(name, corrupt, counted, message_types=(MessageType.EVALUATE,))
    strategy = run_rounds(
        make_strategy_of("fedtopo"),
        state_to_record({}),
        honest_of("fedtopo"),
        TRAIN,
        2,
        0.6,
        hostile=0,
        corruption=corruption,
    )
    honest = [(TEST[p] // 2 + p) / TEST[p] for p in (1, 2)]  # the accuracy of the clients that answered well
    for r in (1, 2):
        log_ = strategy.eval_rounds[r]
        assert getattr(log_, counted) == [0] and log_.accepted == [1, 2]
    row = strategy.history[-1]
    assert row["mean_client_accuracy"] == pytest.approx(np.mean(honest))
    assert row["pooled_accuracy"] == pytest.approx((TEST[1] // 2 + 1 + TEST[2] // 2 + 2) / (TEST[1] + TEST[2]))
    # below min-reply-fraction the round is recorded without accuracy, and the run still goes on
    strict = run_rounds(
        make_strategy_of("fedtopo"),
        state_to_record({}),
        honest_of("fedtopo"),
        TRAIN,
        2,
        1.0,
        hostile=0,
        corruption=corruption,
    )
    assert [math.isnan(h["mean_client_accuracy"]) for h in strict.history] == [True, True]


# -- clients refuse a poisoned broadcast ---------------------------------------------------------------------------
TINY = {**TINY_RUN, "num-server-rounds": 2, "clients-per-round": 3, "tgp-server-epochs": 2, "min-reply-fraction": 0.6}


def _train_message(pid: int, arrays: dict, server_round: int = 2) -> Message:
    config = ConfigRecord({"server-round": server_round, "lr": 0.05, "payload-dtype": "float32"})
    return Message(
        RecordDict({"arrays": state_to_record(arrays), "config": config}),
        message_type=MessageType.TRAIN,
        dst_node_id=100 + pid,
    )


def _poisoned_topology(kind: str) -> np.ndarray:
    t = np.full((10, 10), 1 / 9, np.float32)
    np.fill_diagonal(t, 0)
    if kind == "nan":
        t[0, 1] = np.nan
    elif kind == "negative":
        t[0, 1], t[0, 2] = -0.5, 1 / 9 + 0.5 + 1 / 9
    elif kind == "not-stochastic":
        t *= 3
    return t


@pytest.mark.parametrize(
    "method, arrays",
    [
        ("fedtopo", {"topology": _poisoned_topology("nan")}),
        ("fedtopo", {"topology": _poisoned_topology("negative")}),
        ("fedtopo", {"topology": _poisoned_topology("not-stochastic")}),
        ("fedtopo", {"topology": np.full((3, 3), 0.5, np.float32)}),
        ("fedproto", {"prototypes": np.full((10, 64), np.inf, np.float32), "has": np.ones(10, np.float32)}),
        ("fedtgp", {"prototypes": np.full((10, 64), 1e30, np.float32), "has": np.ones(10, np.float32)}),
        ("fd", {"soft-labels": np.zeros((10, 10), np.float32), "has": np.full(10, 0.5, np.float32)}),
        ("lg-fedavg", {"head.weight": np.full((10, 64), np.nan, np.float32), "head.bias": np.zeros(10, np.float32)}),
        ("lg-fedavg", {"head.weight": np.zeros((10, 64), np.float32)}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_a_client_refuses_a_poisoned_broadcast_and_keeps_its_model(flower_ids, tmp_path, method, arrays):
    run = validate_run_config({**TINY, "method": method, "output-dir": str(tmp_path / "out")})
    context = InProcessGrid(run, 3).contexts[1]
    train_multiarch(_train_message(1, {}, server_round=1), run, 1, 3, context)  # a first, honest round
    saved = {k: v.numpy().copy() for k, v in context.state.array_records[MODEL_STATE].items()}
    with pytest.raises(ValueError, match="refuses the round-2 broadcast"):
        train_multiarch(_train_message(1, arrays), run, 1, 3, context)
    after = context.state.array_records[MODEL_STATE]
    assert all(np.array_equal(after[k].numpy(), v) for k, v in saved.items())


# -- end to end: real client training, one client poisoned every round ---------------------------------------------
class PoisoningGrid(InProcessGrid):
    """Client 1's uploads are poisoned (NaN counts, or a NaN head for LG-FedAvg, which uploads no counts); with
    ``silent`` it never answers instead (a client that times out)."""

    def __init__(self, run, num_clients, silent: bool = False):
        super().__init__(run, num_clients)
        self.silent = silent

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        out = []
        for reply in replies:
            if (
                self.partition_of_node[reply.metadata.src_node_id] != 1
                or reply.metadata.message_type != MessageType.TRAIN
            ):
                out.append(reply)
            elif not self.silent:
                upload = record_to_state(reply.content.array_records["upload"])
                if "counts" in upload:
                    upload["counts"] = np.full_like(upload["counts"], np.nan)
                elif upload:
                    upload["head.weight"] = np.full_like(upload["head.weight"], np.nan)
                else:  # local uploads nothing: a 1e12 num-examples claim instead
                    reply.content["metrics"] = MetricRecord({**dict(reply.content["metrics"]), "num-examples": 10**12})
                reply.content["upload"] = state_to_record(upload)
                out.append(reply)
        return out


@pytest.mark.parametrize("method", sorted(MULTIARCH_METHODS))
def test_honest_models_and_global_state_equal_the_run_without_the_poisoner(flower_ids, tmp_path, method):
    def run_with(silent: bool, name: str):
        run = validate_run_config({**TINY, "method": method, "output-dir": str(tmp_path / name)})
        grid = PoisoningGrid(run, 3, silent)
        summary = run_in_process(run, 3, grid)
        return summary, grid

    poisoned, grid = run_with(False, "poisoned")
    reference, reference_grid = run_with(True, "timed-out")
    assert poisoned["rejected_replies"] == 2 and poisoned["failed_replies"] == 0
    assert reference["failed_replies"] == 2 and reference["rejected_replies"] == 0
    assert poisoned["history"][-1]["mean_client_accuracy"] == reference["history"][-1]["mean_client_accuracy"]
    for pid in (0, 2):  # honest clients: same model, finite
        mine = grid.contexts[pid].state.array_records[MODEL_STATE]
        theirs = reference_grid.contexts[pid].state.array_records[MODEL_STATE]
        for key in theirs:
            assert np.all(np.isfinite(mine[key].numpy())) or not np.issubdtype(mine[key].numpy().dtype, np.floating)
            np.testing.assert_array_equal(mine[key].numpy(), theirs[key].numpy(), err_msg=f"{method} {pid} {key}")
