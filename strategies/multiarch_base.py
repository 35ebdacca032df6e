"""The model-heterogeneous family's base (FedTopo and its baselines) on the round skeleton
(``strategies.skeleton``): one broadcast to every sampled client, screening of what they upload, the method's merge,
client-side evaluation rounds and checkpoints.

Strategies never train client models: clients keep their own (different) architectures; the server only merges what
they upload and broadcasts the result.
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_app.run.costs import LocalTraining
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.run.records import ARRAYS_RECORD, CONFIG_RECORD, METRICS_RECORD, UPLOAD_RECORD
from fl_app.run.round_log import RoundLog
from strategies.evaluation_scores import (
    global_accuracy_of,
    held_class_balanced_accuracy,
    own_mean_accuracy,
    pooled_accuracy,
)
from strategies.screening import (
    MAX_WEIGHT,
    MetricSpec,
    counts_problem,
    examples_spec,
    magnitude_bound,
    metrics_problem,
    reply_cost_specs,
    tensor_problem,
)
from strategies.skeleton import RoundSkeleton


class MultiArchStrategy(RoundSkeleton):
    """The base of the model-heterogeneous strategies: every sampled client gets the method's ``broadcast`` in a
    TRAIN message and uploads what the method merges; ``aggregate_uploads`` is the method's merge.

    Every reply is screened before anything touches global state (``RoundSkeleton.reply_problem``): its records,
    metrics against their specs, the upload's array metadata against ``expected_upload`` (keys, dtype, shape, byte
    size: nothing decoded yet), then the decoded arrays (finite, within ``magnitude_bound``, the method's invariants
    in ``upload_problem``). Rejections are logged with their reason and counted in the round's log.

    Evaluation rounds send every client an EVALUATE message; each client scores its own model (kept in its node
    state) on its own local test split. Replies are screened too (counts consistent with the client's test split);
    a round with fewer valid replies than ``min-reply-fraction`` of the federation is recorded without accuracy,
    and the run goes on.
    """

    upload_record = UPLOAD_RECORD
    reply_records = frozenset({UPLOAD_RECORD, METRICS_RECORD})  # anything else in a reply rejects it
    name = "local"

    def __init__(
        self,
        node_of_partition: dict[int, int],
        num_classes: int,
        *,
        clients_per_round: int,
        seed: int,
        num_rounds: int,
        eval_every: int = 1,
        payload_dtype: str = "float32",
        min_reply_fraction: float = 1.0,
        lr_of_round=None,
        feature_dim: int = 64,
        train_size_of_partition: dict[int, int] | None = None,
        test_size_of_partition: dict[int, int] | None = None,
        train_counts_of_partition: dict[int, np.ndarray] | None = None,
        local_training: LocalTraining | None = None,
        macs_of_partition: dict[int, float] | None = None,
        test_counts_of_partition: dict[int, np.ndarray] | None = None,
        global_test_counts: np.ndarray | None = None,
        validation_size_of_partition: dict[int, int] | None = None,
    ):
        super().__init__(
            node_of_partition,
            len(node_of_partition),
            clients_per_round=clients_per_round,
            seed=seed,
            payload_dtype=payload_dtype,
            min_reply_fraction=min_reply_fraction,
            lr_of_round=lr_of_round,
            local_training=local_training,
        )
        # forward MACs of each client's model (its architecture is fixed by its partition), when the server knows them
        self.macs_of_partition = macs_of_partition
        self.num_classes, self.num_rounds, self.eval_every = num_classes, num_rounds, eval_every
        self.feature_dim = feature_dim
        self.client_config: dict = {}  # extra config every message carries (where clients keep their models)
        # what each client must report as its training / test split size, when the server can know it
        self.train_size_of_partition, self.test_size_of_partition = train_size_of_partition, test_size_of_partition
        # each training split's per-class counts (what clients that upload counts must report), when known
        self.train_counts_of_partition = train_counts_of_partition
        # each local test split's per-class counts, and the global test set's (None: clients score no global set)
        self.test_counts_of_partition, self.global_test_counts = test_counts_of_partition, global_test_counts
        self.validation_size_of_partition = validation_size_of_partition  # None: clients hold no validation split
        self.global_arrays: dict[str, np.ndarray] = {}
        self.eval_rounds: dict[int, RoundLog] = {}
        self.train_loss: dict[int, float] = {}
        self.history: list[dict] = []  # one row per evaluated round
        self.client_accuracy: dict[int, float] = {}  # partition id -> accuracy at the last evaluation
        self.client_global_accuracy: dict[int, float] = {}  # partition id -> its model's global test accuracy, last
        self._payload: ArrayRecord | None = None  # this round's broadcast, encoded once for every client
        self._eval_sent: dict[int, Message] = {}

    # -- what each method defines --------------------------------------------------------------------------------
    def broadcast(self, server_round: int) -> dict[str, np.ndarray]:
        """Arrays sent to every sampled client this round."""
        return dict(self.global_arrays)

    def expected_upload(self) -> dict[str, tuple]:
        """Key -> shape of exactly what a client uploads (nothing for ``local``)."""
        return {}

    def upload_problem(self, partition_id: int, upload: dict[str, np.ndarray]) -> str | None:
        """The method's invariants on a decoded, finite, magnitude-bounded upload."""
        return None

    def aggregate_uploads(self, server_round: int, uploads: list[tuple[int, dict[str, np.ndarray], float]]) -> None:
        """Merge (partition id, uploaded arrays, num-examples) into ``self.global_arrays``."""

    def magnitude_reference(self, key: str) -> np.ndarray | None:
        """The global array an uploaded array is bounded by (``screening.magnitude_bound``; None: 1e3)."""
        return None

    def partition_counts_problem(self, partition_id: int, counts: np.ndarray, seen_only: bool = False) -> str | None:
        """``screening.counts_problem`` against this partition's true counts (or its split's size, when the server
        does not know the counts)."""
        known = None if self.train_counts_of_partition is None else self.train_counts_of_partition[partition_id]
        size = None if self.train_size_of_partition is None else self.train_size_of_partition[partition_id]
        return counts_problem(counts, known, size, seen_only)

    def upload_bound(self, key: str) -> float:
        """Largest |value| of an uploaded array: counts are bounded by ``counts_problem`` (the partition's size)."""
        return float(MAX_WEIGHT) if key == "counts" else magnitude_bound(self.magnitude_reference(key))

    # -- the round skeleton's hooks ------------------------------------------------------------------------------
    def _config(self, server_round: int) -> ConfigRecord:
        return ConfigRecord(
            {
                **self.client_config,
                "server-round": server_round,
                "lr": float(self.lr_of_round(server_round)),
                "payload-dtype": self.payload_dtype,
            }
        )

    def begin_round(self, server_round: int, arrays: ArrayRecord) -> None:
        self._payload = state_to_record(self.broadcast(server_round), self.payload_dtype)

    def train_content(self, partition_id: int, server_round: int, config: ConfigRecord) -> RecordDict:
        return RecordDict({ARRAYS_RECORD: self._payload, CONFIG_RECORD: self._config(server_round)})

    def metric_specs(self, partition_id: int) -> dict[str, MetricSpec]:
        size = None if self.train_size_of_partition is None else self.train_size_of_partition[partition_id]
        return {"num-examples": examples_spec(size, exact=True), **reply_cost_specs(self.max_local_steps(size))}

    def routed_macs(self, partition_id: int) -> tuple[float, float] | None:
        """Every step trains the client's own model: its forward MACs, both per step and as the largest trained."""
        if self.macs_of_partition is None:
            return None
        macs = self.macs_of_partition[partition_id]
        return macs, macs

    def reply_shapes(self, partition_id: int) -> dict[str, tuple]:
        return self.expected_upload()

    def decode(self, record: ArrayRecord) -> dict[str, np.ndarray]:
        return record_to_state(record, self.payload_dtype)  # uploads are small and read several times: decode once

    def decoded_problem(self, server_round: int, partition_id: int, decoded: dict[str, np.ndarray]) -> str | None:
        for key, values in decoded.items():
            problem = tensor_problem(key, values, self.upload_bound(key))
            if problem:
                return problem
        return self.upload_problem(partition_id, decoded)

    def merge(self, server_round: int, accepted: list[tuple[int, dict, MetricRecord]]) -> None:
        uploads = [(pid, upload, float(metrics["num-examples"])) for pid, upload, metrics in accepted]
        before = dict(self.global_arrays)
        self.aggregate_uploads(server_round, uploads)
        broken = [k for k, v in self.global_arrays.items() if not np.all(np.isfinite(v))]
        if broken:  # screened inputs should never get here; if they do, nobody receives it
            log(WARNING, "round %d: merged %s not finite: the previous global state is kept", server_round, broken)
            self.global_arrays = before
        return None  # no global model for the loop to carry: clients keep their own

    def round_train_loss(self, losses: list[float]) -> float:
        # a client that reported no loss leaves the round's loss unknown (NaN), unlike the supernet family's mean
        return float(np.mean(losses)) if losses else math.nan

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.train_loss[server_round] = self.rounds[server_round].train_loss
        return arrays, metrics

    # -- evaluation: every client, on its own local test split ----------------------------------------------------
    def evaluates(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def configure_evaluate(self, server_round, arrays, config, grid: Grid | None):
        if not self.evaluates(server_round):
            return []
        live = self.nodes.partitions(grid, server_round)
        self.eval_rounds[server_round] = RoundLog(sampled=live)
        self._eval_sent = {
            pid: Message(
                RecordDict({CONFIG_RECORD: self._config(server_round)}),
                message_type=MessageType.EVALUATE,
                dst_node_id=self.node_of_partition[pid],
            )
            for pid in live
        }
        return list(self._eval_sent.values())

    def evaluation_problem(self, partition_id: int, reply: Message) -> str | None:
        """Why an evaluation reply cannot be counted: its counts against the client's test split, when known."""
        size = None if self.test_size_of_partition is None else self.test_size_of_partition[partition_id]
        specs = {
            "correct": MetricSpec("int", low=0, high=size if size is not None else MAX_WEIGHT),
            "num-test": MetricSpec(
                "int", low=size if size is not None else 0, high=size if size is not None else MAX_WEIGHT
            ),
        }
        metrics = reply.content.metric_records.get(METRICS_RECORD, MetricRecord())
        problem = metrics_problem(metrics, specs)
        if problem is None and metrics["correct"] > metrics["num-test"]:
            problem = f"correct={metrics['correct']} exceeds num-test={metrics['num-test']}"
        return problem or self.class_counts_problem(partition_id, metrics)

    def class_counts_problem(self, partition_id: int, metrics: MetricRecord) -> str | None:
        """The per-class counts of an evaluation reply: 'class-correct' and 'class-total' (both or neither; a reply
        without them counts for the own-distribution and pooled scores only) are C ints each, 0 <= correct <= total
        per class, summing to 'correct' and 'num-test', the totals equal to the split's true counts when known; with a
        global test set, 'global-class-correct' (required) is C ints within its per-class counts."""
        c = self.num_classes
        counts = MetricSpec("int-list", low=0, high=MAX_WEIGHT, max_length=c)
        have = [key in metrics for key in ("class-correct", "class-total")]
        if any(have) and not all(have):
            return "metrics 'class-correct' and 'class-total' must come together"
        if all(have):
            problem = counts.problem("class-correct", metrics["class-correct"]) or counts.problem(
                "class-total", metrics["class-total"]
            )
            if problem:
                return problem
            correct, total = np.array(metrics["class-correct"]), np.array(metrics["class-total"])
            if len(correct) != c or len(total) != c:
                return f"metrics 'class-correct' and 'class-total' must have {c} elements (one per class)"
            if np.any(correct > total):
                return "metric 'class-correct' exceeds 'class-total' for a class"
            if int(correct.sum()) != metrics["correct"] or int(total.sum()) != metrics["num-test"]:
                return "metrics 'class-correct'/'class-total' do not sum to 'correct'/'num-test'"
            known = None if self.test_counts_of_partition is None else self.test_counts_of_partition[partition_id]
            if known is not None and not np.array_equal(total, np.asarray(known, dtype=np.int64)):
                return "metric 'class-total' is not the client's test split's per-class counts"
        if self.validation_size_of_partition is not None:
            size = self.validation_size_of_partition[partition_id]
            problem = metrics_problem(
                metrics, {"val-correct": MetricSpec("int", low=0, high=size), "num-val": MetricSpec("int", size, size)}
            )
            if problem or metrics["val-correct"] > metrics["num-val"]:
                return problem or f"val-correct={metrics['val-correct']} exceeds num-val={metrics['num-val']}"
        if self.global_test_counts is not None:
            if "global-class-correct" not in metrics:
                return "metric 'global-class-correct' is missing"
            problem = counts.problem("global-class-correct", metrics["global-class-correct"])
            if problem:
                return problem
            correct = np.array(metrics["global-class-correct"])
            if len(correct) != c or np.any(correct > self.global_test_counts):
                return f"metric 'global-class-correct' must be {c} ints within the global test set's class counts"
        return None

    def aggregate_evaluate(self, server_round, replies):
        if not self.evaluates(server_round):
            return None
        log_ = self.eval_rounds.setdefault(server_round, RoundLog(sampled=sorted(self.node_of_partition)))
        accepted = log_.accept(
            server_round,
            replies,
            self._eval_sent,
            lambda pid, reply: (self.evaluation_problem(pid, reply), None),
            "evaluation reply",
        )
        per_client, per_class, global_correct, validation = {}, {}, {}, {}
        for pid, reply, _ in accepted:
            metrics = reply.content.metric_records[METRICS_RECORD]
            per_client[pid] = (int(metrics["correct"]), int(metrics["num-test"]))
            if "class-correct" in metrics:
                per_class[pid] = (np.array(metrics["class-correct"]), np.array(metrics["class-total"]))
            if self.global_test_counts is not None:
                global_correct[pid] = np.array(metrics["global-class-correct"])
            if self.validation_size_of_partition is not None:
                validation[pid] = (int(metrics["val-correct"]), int(metrics["num-val"]))
        try:
            log_.close(server_round, len(per_client), self.min_reply_fraction)
            complete = True
        except RuntimeError as error:  # too few valid evaluations: no accuracy this round, the run goes on
            log(WARNING, "evaluation: %s", error)
            complete = False
        row = self._evaluation_row(server_round, log_, per_client, complete)
        row.update(self._sharing_scores(per_client, per_class, global_correct, validation, complete))
        self.history.append(row)
        if complete:
            self.client_accuracy = {p: (c / n if n else math.nan) for p, (c, n) in sorted(per_client.items())}
            self.client_global_accuracy = {
                p: global_accuracy_of(g, self.global_test_counts) for p, g in sorted(global_correct.items())
            }
        self._eval_sent = {}
        return MetricRecord({k: v for k, v in row.items() if k != "round" and v is not None})

    def _evaluation_row(self, server_round: int, log_: RoundLog, per_client: dict, complete: bool) -> dict:
        """The round's line of the evaluation history; accuracies only from a complete evaluation."""
        train_log = self.rounds.get(server_round, RoundLog())
        return {
            "round": server_round,
            "mean_client_accuracy": own_mean_accuracy(per_client) if complete else math.nan,
            "pooled_accuracy": pooled_accuracy(per_client) if complete else math.nan,
            "train_loss": self.train_loss.get(server_round, math.nan),
            "bytes_up": train_log.bytes_up,
            "bytes_down": train_log.bytes_down,
            "evaluated": len(per_client),
            "eval_failed": len(log_.failed),
            "eval_rejected": len(log_.rejected),
        }

    def _sharing_scores(
        self, per_client: dict, per_class: dict, global_correct: dict, validation: dict, complete: bool
    ) -> dict:
        """The scores that see what sharing changes (``strategies.evaluation_scores``): balanced over each client's
        held classes, on the global test set and the own-distribution mean on the validation splits. NaN when the
        evaluation is incomplete (as the other scores); None when not measured: the global set or the validation
        splits are off, or a counted client sent no per-class counts (None, unlike NaN, equals itself, so a resumed
        run's history equals the uninterrupted one's)."""
        balanced = glob = valid = math.nan
        if len(per_class) < len(per_client) or not per_client:
            balanced = None
        elif complete:
            held = {
                p: (self.train_counts_of_partition[p] > 0 if self.train_counts_of_partition else total > 0)
                for p, (_, total) in per_class.items()
            }
            balanced = held_class_balanced_accuracy(
                {p: c for p, (c, _) in per_class.items()}, {p: t for p, (_, t) in per_class.items()}, held
            )
        if self.global_test_counts is None:
            glob = None
        elif complete and global_correct:
            glob = float(np.mean([global_accuracy_of(g, self.global_test_counts) for g in global_correct.values()]))
        if self.validation_size_of_partition is None:
            valid = None
        elif complete and validation:
            valid = own_mean_accuracy(validation)
        return {"balanced_accuracy": balanced, "global_accuracy": glob, "validation_accuracy": valid}

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs from the server (plain containers and tensors): the global arrays, the
        round and evaluation logs, the losses and accuracies so far."""
        return {
            "global_arrays": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.global_arrays.items()},
            **super().checkpoint_state(),
            "eval_rounds": {r: log_.to_dict() for r, log_ in self.eval_rounds.items()},
            "train_loss": dict(self.train_loss),
            "history": [dict(row) for row in self.history],
            "client_accuracy": dict(self.client_accuracy),
            "client_global_accuracy": dict(self.client_global_accuracy),
        }

    def restore_state(self, saved: dict) -> None:
        super().restore_state(saved)
        self.global_arrays = {k: v.numpy() for k, v in saved["global_arrays"].items()}
        self.eval_rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in saved["eval_rounds"].items()}
        self.train_loss = {int(r): v for r, v in saved["train_loss"].items()}
        self.history = [dict(row) for row in saved["history"]]
        self.client_accuracy = {int(p): v for p, v in saved["client_accuracy"].items()}
        self.client_global_accuracy = {int(p): v for p, v in saved.get("client_global_accuracy", {}).items()}

    def summary(self) -> None:
        log(
            INFO,
            "%s: %d clients, %d per round, payload=%s",
            self.name,
            len(self.node_of_partition),
            self.clients_per_round,
            self.payload_dtype,
        )
