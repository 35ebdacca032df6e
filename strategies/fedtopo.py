"""Server side of FedTopo (reliability-aware merge of relation topologies) and the shared model-heterogeneous
strategy skeleton: seeded sampling, per-client messages, byte accounting, and client-side evaluation rounds.

Strategies never train client models: clients keep their own (different) architectures; the server only merges what
they upload and broadcasts the result.
"""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_app.config import TOPO_WEIGHTINGS
from fl_app.payload import record_bytes, record_to_state, state_to_record
from strategies.rounds import RoundLog, sample_partitions


# -- FedTopo merge -------------------------------------------------------------------------------------------------
def uniform_topology(num_classes: int) -> np.ndarray:
    """U[j, k] = 1/(C−1) for k != j, 0 on the diagonal: 'no class is more similar to j than another'."""
    u = np.full((num_classes, num_classes), 1.0 / (num_classes - 1))
    np.fill_diagonal(u, 0.0)
    return u


def merge_relations(relations: np.ndarray, counts: np.ndarray, tau: float, weighting: str = "support",
                    kappa: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge client relation scores [M, C, C] (cosines, see ``clients.fedtopo.relation_scores``) into the topology
    R̄ [C, C]; returns (R̄, merged scores S̃ [C, C], total support W [C, C]).

    A client holding classes j and k (true counts n_j, n_k > 0) reports S[j, k]; ``support`` weighs it
    w = sqrt(n_j·n_k), ``mean`` weighs it 1. S̄ = Σ w·S / Σ w over the reporting clients. With ``support`` each pair is
    then shrunk toward the typical score s₀ (the support-weighted mean of all reported pairs):
    S̃ = W/(W+κ)·S̄ + κ/(W+κ)·s₀, so a weakly supported pair neither stands out as similar nor as dissimilar; a pair
    nobody reports gets s₀. Only then is each row normalised over all classes: R̄[j, k] = softmax_{k≠j}(S̃[j, k]/τ).
    Because the softmax comes after the merge, which classes happen to share a client does not shape R̄.
    """
    if weighting not in TOPO_WEIGHTINGS:
        raise ValueError(f"topo-weighting='{weighting}': allowed values are {list(TOPO_WEIGHTINGS)}")
    relations, counts = np.asarray(relations, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    c = relations.shape[-1]
    off = ~np.eye(c, dtype=bool)
    held = counts > 0
    valid = held[:, :, None] & held[:, None, :] & off
    w = np.sqrt(counts[:, :, None] * counts[:, None, :]) * valid if weighting == "support" else valid * 1.0
    total = w.sum(axis=0)
    summed = (w * np.where(valid, relations, 0.0)).sum(axis=0)
    mean = np.divide(summed, total, out=np.zeros((c, c)), where=total > 0)
    typical = float(summed.sum() / total.sum()) if total.sum() > 0 else 0.0
    shrink = total / (total + kappa) if weighting == "support" and kappa > 0 else (total > 0) * 1.0
    scores = shrink * mean + (1 - shrink) * typical
    logits = np.where(off, scores / tau, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    merged = np.exp(logits)
    return merged / merged.sum(axis=1, keepdims=True), np.where(off, scores, 0.0), total


# -- the shared skeleton -------------------------------------------------------------------------------------------
class HeteroStrategy(Strategy):
    """Per-client TRAIN messages carrying the method's broadcast; ``aggregate_uploads`` is the method's merge.

    Evaluation rounds send every client an EVALUATE message; each client scores its own model (kept in its node
    state) on its own local test split.
    """

    name = "local"

    def __init__(self, node_of_partition: dict[int, int], num_classes: int, *, clients_per_round: int, seed: int,
                 num_rounds: int, eval_every: int = 1, payload_dtype: str = "float32",
                 min_reply_fraction: float = 1.0, lr_of_round=None):
        self.node_of_partition, self.num_classes = node_of_partition, num_classes
        self.clients_per_round, self.seed = clients_per_round, seed
        self.num_rounds, self.eval_every = num_rounds, eval_every
        self.payload_dtype, self.min_reply_fraction = payload_dtype, min_reply_fraction
        self.lr_of_round = lr_of_round or (lambda r: 0.0)
        self.global_arrays: dict[str, np.ndarray] = {}
        self.rounds: dict[int, RoundLog] = {}
        self.train_loss: dict[int, float] = {}
        self.history: list[dict] = []  # one row per evaluated round
        self.client_accuracy: dict[int, float] = {}  # partition id -> accuracy at the last evaluation
        self.sampled: set[int] = set()

    # -- what each method defines --------------------------------------------------------------------------------
    def broadcast(self, server_round: int) -> dict[str, np.ndarray]:
        """Arrays sent to every sampled client this round."""
        return dict(self.global_arrays)

    def aggregate_uploads(self, server_round: int, uploads: list[tuple[int, dict[str, np.ndarray], float]]) -> None:
        """Merge (partition id, uploaded arrays, num-examples) into ``self.global_arrays``."""

    # -- training rounds -----------------------------------------------------------------------------------------
    def _config(self, server_round: int) -> ConfigRecord:
        return ConfigRecord({"server-round": server_round, "lr": float(self.lr_of_round(server_round)),
                             "payload-dtype": self.payload_dtype})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        log_ = self.rounds.setdefault(server_round, RoundLog())
        log_.sampled = sample_partitions(self.node_of_partition, self.clients_per_round, self.seed, server_round)
        self.sampled = set(log_.sampled)
        payload = state_to_record(self.broadcast(server_round), self.payload_dtype)
        messages = []
        for pid in log_.sampled:
            log_.bytes_down += record_bytes(payload)
            content = RecordDict({"arrays": payload, "config": self._config(server_round)})
            messages.append(Message(content, message_type=MessageType.TRAIN, dst_node_id=self.node_of_partition[pid]))
        return messages

    def _partition_of(self, reply: Message) -> int:
        return {n: p for p, n in self.node_of_partition.items()}.get(reply.metadata.src_node_id, -1)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        log_ = self.rounds.setdefault(server_round, RoundLog())
        uploads, losses = [], []
        for pid, reply in log_.screen(server_round, replies, self.node_of_partition):
            record = reply.content.array_records.get("upload")
            if record is None or pid not in self.sampled:
                log(WARNING, "round %d: reply from client %d rejected: no upload or not sampled", server_round, pid)
                log_.rejected.append(pid)
                continue
            metrics = reply.content.metric_records.get("metrics", MetricRecord())
            log_.bytes_up += record_bytes(record)
            uploads.append((pid, record_to_state(record, self.payload_dtype), float(metrics.get("num-examples", 0))))
            losses.append(float(metrics.get("train-loss", math.nan)))
        log_.close(server_round, len(uploads), self.min_reply_fraction)
        self.aggregate_uploads(server_round, uploads)
        self.train_loss[server_round] = float(np.nanmean(losses)) if losses else math.nan
        return None, MetricRecord({"train-loss": self.train_loss[server_round], "replies": len(uploads),
                                   "bytes-down": log_.bytes_down, "bytes-up": log_.bytes_up})

    # -- evaluation: every client, on its own local test split ----------------------------------------------------
    def evaluates(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def configure_evaluate(self, server_round, arrays, config, grid):
        if not self.evaluates(server_round):
            return []
        return [Message(RecordDict({"config": self._config(server_round)}),
                        message_type=MessageType.EVALUATE, dst_node_id=node)
                for _, node in sorted(self.node_of_partition.items())]

    def aggregate_evaluate(self, server_round, replies):
        if not self.evaluates(server_round):
            return None
        per_client = {}
        for reply in replies:
            pid = self._partition_of(reply)
            if reply.has_error():
                raise RuntimeError(f"round {server_round}: evaluation on client {pid} failed: {reply.error.reason}")
            m = reply.content.metric_records["metrics"]
            per_client[pid] = (int(m["correct"]), int(m["num-test"]))
        missing = sorted(set(self.node_of_partition) - set(per_client))
        if missing:
            raise RuntimeError(f"round {server_round}: no evaluation reply from clients {missing}")
        scored = [c / n for c, n in per_client.values() if n > 0]
        total = sum(n for _, n in per_client.values())
        log_ = self.rounds.get(server_round, RoundLog())
        row = {
            "round": server_round,
            "mean_client_accuracy": float(np.mean(scored)) if scored else math.nan,
            "pooled_accuracy": sum(c for c, _ in per_client.values()) / total if total else math.nan,
            "train_loss": self.train_loss.get(server_round, math.nan),
            "bytes_up": log_.bytes_up, "bytes_down": log_.bytes_down,
        }
        self.history.append(row)
        self.client_accuracy = {p: (c / n if n else math.nan) for p, (c, n) in sorted(per_client.items())}
        return MetricRecord({k: v for k, v in row.items() if k != "round"})

    def summary(self) -> None:
        log(INFO, "%s: %d clients, %d per round, payload=%s", self.name, len(self.node_of_partition),
            self.clients_per_round, self.payload_dtype)


class LocalStrategy(HeteroStrategy):
    """No communication: clients train alone (the broadcast is empty and uploads are ignored)."""

    name = "local"


class FedTopoStrategy(HeteroStrategy):
    """Broadcast R̄ (uniform before the first merge); merge uploaded relation scores with reliability weighting."""

    name = "fedtopo"

    def __init__(self, *args, tau: float, weighting: str = "support", kappa: float = 0.0, **kw):
        super().__init__(*args, **kw)
        if weighting not in TOPO_WEIGHTINGS:
            raise ValueError(f"topo-weighting='{weighting}': allowed values are {list(TOPO_WEIGHTINGS)}")
        self.tau, self.weighting, self.kappa = tau, weighting, kappa
        self.global_arrays = {"topology": uniform_topology(self.num_classes).astype(np.float32)}
        self.support = np.zeros((self.num_classes, self.num_classes))

    def aggregate_uploads(self, server_round, uploads):
        if not uploads:
            return
        relations = np.stack([u["relations"] for _, u, _ in uploads])
        counts = np.stack([u["counts"] for _, u, _ in uploads])
        merged, _, self.support = merge_relations(relations, counts, self.tau, self.weighting, self.kappa)
        self.global_arrays = {"topology": merged.astype(np.float32)}
