"""The shared skeleton of the model-heterogeneous strategies (FedTopo and its baselines): seeded sampling,
per-client messages, screening of uploads, byte accounting, client-side evaluation rounds and checkpoints.

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

from fl_app.run.payload import record_bytes, record_to_state, state_to_record
from strategies.rounds import LiveNodes, RoundLog, RoundLoop, arrays_bytes, sample_partitions
from strategies.screening import (
    CLIENT_SECONDS,
    MAX_WEIGHT,
    TRAIN_LOSS,
    MetricSpec,
    counts_problem,
    examples_spec,
    magnitude_bound,
    metrics_problem,
    raised,
    record_problem,
    tensor_problem,
)

TRAIN_METRIC_KEYS = {
    "train-loss": TRAIN_LOSS,
    "local-steps": MetricSpec("int", low=0, required=False),
    "client-seconds": CLIENT_SECONDS,
}
UPLOAD_RECORD, METRICS_RECORD = "upload", "metrics"


# -- the shared skeleton -------------------------------------------------------------------------------------------
class HeteroStrategy(RoundLoop):
    """Per-client TRAIN messages carrying the method's broadcast; ``aggregate_uploads`` is the method's merge.

    Every reply is screened before anything touches global state (``reply_problem``): metrics against their specs,
    the upload's array metadata against ``expected_upload`` (keys, dtype, shape, byte size: nothing decoded yet),
    then the decoded arrays (finite, within ``magnitude_bound``, the method's invariants in ``upload_problem``).
    Rejections are logged with their reason and counted in the round's log.

    Evaluation rounds send every client an EVALUATE message; each client scores its own model (kept in its node
    state) on its own local test split. Replies are screened too (counts consistent with the client's test split);
    a round with fewer valid replies than ``min-reply-fraction`` of the federation is recorded without accuracy,
    and the run goes on.
    """

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
    ):
        self.node_of_partition, self.num_classes = node_of_partition, num_classes
        # in a deployment nodes leave, join and rejoin: sampling and evaluation follow the connected ones
        self.nodes = LiveNodes(node_of_partition, num_partitions=len(node_of_partition))
        self.clients_per_round, self.seed = clients_per_round, seed
        self.num_rounds, self.eval_every = num_rounds, eval_every
        self.payload_dtype, self.min_reply_fraction = payload_dtype, min_reply_fraction
        self.lr_of_round = lr_of_round or (lambda r: 0.0)
        self.feature_dim = feature_dim
        self.client_config: dict = {}  # extra config every message carries (where clients keep their models)
        # what each client must report as its training / test split size, when the server can know it
        self.train_size_of_partition, self.test_size_of_partition = train_size_of_partition, test_size_of_partition
        # each training split's per-class counts (what clients that upload counts must report), when known
        self.train_counts_of_partition = train_counts_of_partition
        self.global_arrays: dict[str, np.ndarray] = {}
        self.rounds: dict[int, RoundLog] = {}
        self.eval_rounds: dict[int, RoundLog] = {}
        self.train_loss: dict[int, float] = {}
        self.history: list[dict] = []  # one row per evaluated round
        self.client_accuracy: dict[int, float] = {}  # partition id -> accuracy at the last evaluation
        self._sent: dict[int, Message] = {}
        self._sent_bytes: dict[int, int] = {}
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

    def _live(self, grid: Grid | None, server_round: int) -> list[int]:
        """Partitions with a connected node now (every partition in a simulation, where the node set is fixed)."""
        return self.nodes.refresh(grid, server_round) if grid is not None else sorted(self.node_of_partition)

    # -- training rounds -----------------------------------------------------------------------------------------
    def _config(self, server_round: int) -> ConfigRecord:
        return ConfigRecord(
            {
                **self.client_config,
                "server-round": server_round,
                "lr": float(self.lr_of_round(server_round)),
                "payload-dtype": self.payload_dtype,
            }
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        log_ = self.rounds.setdefault(server_round, RoundLog())
        log_.sampled = sample_partitions(
            self._live(grid, server_round), self.clients_per_round, self.seed, server_round
        )
        payload = state_to_record(self.broadcast(server_round), self.payload_dtype)
        self._sent, self._sent_bytes = {}, {}
        for pid in log_.sampled:
            self._sent_bytes[pid] = record_bytes(payload)
            log_.bytes_down += self._sent_bytes[pid]
            content = RecordDict({"arrays": payload, "config": self._config(server_round)})
            self._sent[pid] = Message(content, message_type=MessageType.TRAIN, dst_node_id=self.node_of_partition[pid])
        return list(self._sent.values())

    def metric_specs(self, partition_id: int) -> dict[str, MetricSpec]:
        size = None if self.train_size_of_partition is None else self.train_size_of_partition[partition_id]
        return {"num-examples": examples_spec(size, exact=True), **TRAIN_METRIC_KEYS}

    def reply_problem(self, partition_id: int, reply: Message) -> tuple[str | None, dict]:
        """(why the reply cannot be used or None, its decoded upload). Checks in order of cost (see the class);
        decoding reads only what the screened metadata allows (``payload.array_values``), and anything it or a check
        raises is the reply's rejection, never the end of the round."""
        try:
            return self._reply_problem(partition_id, reply)
        except Exception as error:  # whatever one reply makes a check raise rejects that reply only
            return raised(error), {}

    def _reply_problem(self, partition_id: int, reply: Message) -> tuple[str | None, dict]:
        if partition_id not in self._sent:
            return "not sampled this round", {}
        content = reply.content
        unknown = sorted(set(content.keys()) - {UPLOAD_RECORD, METRICS_RECORD})
        if unknown:
            return f"unknown records {unknown[:3]} in the reply", {}
        record = content.array_records.get(UPLOAD_RECORD)
        if record is None:
            return "no upload", {}
        problem = metrics_problem(
            content.metric_records.get(METRICS_RECORD, MetricRecord()), self.metric_specs(partition_id)
        ) or record_problem(record, self.expected_upload(), self.payload_dtype)
        if problem:
            return problem, {}
        upload = record_to_state(record, self.payload_dtype)
        for key, values in upload.items():
            problem = tensor_problem(key, values, self.upload_bound(key))
            if problem:
                return problem, {}
        return self.upload_problem(partition_id, upload), upload

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        log_ = self.rounds.setdefault(server_round, RoundLog())
        uploads, losses = [], []
        replies = list(replies)
        log_.bytes_up += sum(arrays_bytes(reply, UPLOAD_RECORD) for reply in replies)  # what arrived, credited or not
        for pid, reply in log_.screen(server_round, replies, self._sent):
            problem, upload = self.reply_problem(pid, reply)
            if problem:
                log(WARNING, "round %d: reply from client %d rejected: %s", server_round, pid, problem)
                log_.rejected.append(pid)
                continue
            metrics = reply.content.metric_records[METRICS_RECORD]
            uploads.append((pid, upload, float(metrics["num-examples"])))
            losses.append(float(metrics.get("train-loss", math.nan)))
            log_.client_seconds += float(metrics.get("client-seconds", 0.0))
        log_.accepted = [pid for pid, _, _ in uploads]
        log_.close(server_round, len(uploads), self.min_reply_fraction, self._sent_bytes)
        before = dict(self.global_arrays)
        self.aggregate_uploads(server_round, uploads)
        broken = [k for k, v in self.global_arrays.items() if not np.all(np.isfinite(v))]
        if broken:  # screened inputs should never get here; if they do, nobody receives it
            log(WARNING, "round %d: merged %s not finite: the previous global state is kept", server_round, broken)
            self.global_arrays = before
        log_.train_loss = self.train_loss[server_round] = float(np.mean(losses)) if losses else math.nan
        self._sent, self._sent_bytes = {}, {}
        return None, MetricRecord(
            {
                "train-loss": self.train_loss[server_round],
                "replies": len(uploads),
                "failed": len(log_.failed),
                "rejected": len(log_.rejected),
                "bytes-down": log_.bytes_down,
                "bytes-up": log_.bytes_up,
            }
        )

    # -- evaluation: every client, on its own local test split ----------------------------------------------------
    def evaluates(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def configure_evaluate(self, server_round, arrays, config, grid):
        if not self.evaluates(server_round):
            return []
        live = self._live(grid, server_round)
        self.eval_rounds[server_round] = RoundLog(sampled=live)
        self._eval_sent = {
            pid: Message(
                RecordDict({"config": self._config(server_round)}),
                message_type=MessageType.EVALUATE,
                dst_node_id=self.node_of_partition[pid],
            )
            for pid in live
        }
        return list(self._eval_sent.values())

    def evaluation_problem(self, partition_id: int, reply: Message) -> str | None:
        try:
            return self._evaluation_problem(partition_id, reply)
        except Exception as error:  # whatever one reply makes a check raise rejects that reply only
            return raised(error)

    def _evaluation_problem(self, partition_id: int, reply: Message) -> str | None:
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
        return problem

    def aggregate_evaluate(self, server_round, replies):
        if not self.evaluates(server_round):
            return None
        log_ = self.eval_rounds.setdefault(server_round, RoundLog(sampled=sorted(self.node_of_partition)))
        per_client = {}
        for pid, reply in log_.screen(server_round, replies, self._eval_sent):
            problem = self.evaluation_problem(pid, reply)
            if problem:
                log(WARNING, "round %d: evaluation reply from client %d rejected: %s", server_round, pid, problem)
                log_.rejected.append(pid)
                continue
            m = reply.content.metric_records[METRICS_RECORD]
            per_client[pid] = (int(m["correct"]), int(m["num-test"]))
        log_.accepted = sorted(per_client)
        try:
            log_.close(server_round, len(per_client), self.min_reply_fraction)
            complete = True
        except RuntimeError as error:  # too few valid evaluations: no accuracy this round, the run goes on
            log(WARNING, "evaluation: %s", error)
            complete = False
        scored = [c / n for c, n in per_client.values() if n > 0]
        total = sum(n for _, n in per_client.values())
        train_log = self.rounds.get(server_round, RoundLog())
        row = {
            "round": server_round,
            "mean_client_accuracy": float(np.mean(scored)) if scored and complete else math.nan,
            "pooled_accuracy": sum(c for c, _ in per_client.values()) / total if total and complete else math.nan,
            "train_loss": self.train_loss.get(server_round, math.nan),
            "bytes_up": train_log.bytes_up,
            "bytes_down": train_log.bytes_down,
            "evaluated": len(per_client),
            "eval_failed": len(log_.failed),
            "eval_rejected": len(log_.rejected),
        }
        self.history.append(row)
        if complete:
            self.client_accuracy = {p: (c / n if n else math.nan) for p, (c, n) in sorted(per_client.items())}
        self._eval_sent = {}
        return MetricRecord({k: v for k, v in row.items() if k != "round"})

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs from the server (plain containers and tensors): the global arrays, the
        round and evaluation logs, the losses and accuracies so far."""
        return {
            "global_arrays": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.global_arrays.items()},
            "rounds": {r: log_.to_dict() for r, log_ in self.rounds.items()},
            "eval_rounds": {r: log_.to_dict() for r, log_ in self.eval_rounds.items()},
            "train_loss": dict(self.train_loss),
            "history": [dict(row) for row in self.history],
            "client_accuracy": dict(self.client_accuracy),
        }

    def restore_state(self, saved: dict) -> None:
        self.global_arrays = {k: v.numpy() for k, v in saved["global_arrays"].items()}
        self.rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in saved["rounds"].items()}
        self.eval_rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in saved["eval_rounds"].items()}
        self.train_loss = {int(r): v for r, v in saved["train_loss"].items()}
        self.history = [dict(row) for row in saved["history"]]
        self.client_accuracy = {int(p): v for p, v in saved["client_accuracy"].items()}

    def summary(self) -> None:
        log(
            INFO,
            "%s: %d clients, %d per round, payload=%s",
            self.name,
            len(self.node_of_partition),
            self.clients_per_round,
            self.payload_dtype,
        )
