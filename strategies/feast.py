"""FEAST server: per-client routing of budget-tailored sub-supernets and sparse aggregation of what comes back."""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.payload import RecordState, record_bytes, record_to_state, state_to_record
from fl_app.supernet.slicing import slice_state, state_numel, subnet_shapes
from fl_app.supernet.space import Subnet, SupernetConfig
from fl_app.supernet.subnets import SubnetCache
from strategies.rounds import LiveNodes, RoundLog, RoundLoop, arrays_bytes, sample_partitions
from strategies.screening import (
    CLIENT_SECONDS,
    TRAIN_LOSS,
    MetricSpec,
    examples_spec,
    labels_spec,
    magnitude_bound,
    metrics_problem,
    raised,
    record_problem,
)
from strategies.sparse import sparse_average, update_problem


class FeastStrategy(RoundLoop):
    def __init__(
        self,
        cfg: SupernetConfig,
        cache: SubnetCache,
        budgets: dict[int, float],
        node_of_partition: dict[int, int],
        *,
        clients_per_round: int,
        seed: int,
        routing: bool = True,
        payload_dtype: str = "float32",
        weighting: str = "num-examples",
        min_reply_fraction: float = 1.0,
        lr_of_round=None,
        examples_of_partition: dict[int, int] | None = None,
        labels_of_partition: dict[int, list[int]] | None = None,
    ):
        self.cfg, self.cache, self.budgets = cfg, cache, budgets
        self.node_of_partition = node_of_partition
        self.nodes = LiveNodes(node_of_partition, num_partitions=len(budgets))
        self.clients_per_round, self.seed, self.routing = clients_per_round, seed, routing
        self.payload_dtype, self.weighting, self.min_reply_fraction = payload_dtype, weighting, min_reply_fraction
        self.lr_of_round = lr_of_round or (lambda r: 0.0)
        # what each client must report as num-examples (its partition size), when the server can know it
        self.examples_of_partition = examples_of_partition
        # the labels each client's partition holds (what it must report as labels), when the server can know them
        self.labels_of_partition = labels_of_partition
        self.global_state: dict[str, np.ndarray] = {}
        self.routed: dict[int, tuple[Subnet, Subnet | None]] = {}  # partition id -> (bounds, arch) this round
        self.rounds: dict[int, RoundLog] = {}
        self._returned: ArrayRecord | None = None  # the record aggregate_train handed back (decoded: global_state)
        self._view: tuple[int, dict] | None = None  # (round, wire view of global_state) built by configure_train
        self._bounds: tuple[int, dict] | None = None  # (round, magnitude bound per tensor of that view)
        self._sent: dict[int, Message] = {}  # partition id -> this round's message (the grid sets its id on push)
        self._sent_bytes: dict[int, int] = {}  # partition id -> payload bytes of that message

    # -- what each client gets ------------------------------------------------------------------------------------
    @property
    def model_cfg(self) -> SupernetConfig:
        """The config of the global model (baselines on width-sliced models override it)."""
        return self.cfg

    def global_model(self) -> ElasticResNet:
        """A freshly initialised global model (ScaleFL's also holds its exit heads)."""
        return ElasticResNet(self.model_cfg)

    def assign(self, partition_id: int, server_round: int) -> tuple[Subnet, Subnet | None]:
        """(bounds routed to the client, the single subnet it must train or None to let it plan FEAST's step)."""
        bounds = self.cache.route_bounds(self.budgets[partition_id]) if self.routing else self.cfg.max_subnet()
        return bounds, None

    def routed_shapes(self, arch: Subnet) -> dict[str, tuple]:
        return subnet_shapes(self.model_cfg, arch)

    def client_config(self, partition_id: int, bounds: Subnet) -> dict:
        return {}

    def to_wire_view(self, state: dict, server_round: int) -> dict:
        """The global state in the coordinates clients slice from (FedRolex rolls it); identity here."""
        return state

    def from_wire_view(self, state: dict, server_round: int) -> dict:
        return state

    def client_view(self, view: dict, partition_id: int) -> dict:
        """What one client's slice is cut from (FIARSE zeroes the elements outside the client's mask); the view."""
        return view

    def reply_weights(self, server_round: int, entries: list[tuple[int, MetricRecord]]) -> list[float]:
        if self.weighting == "uniform":
            return [1.0] * len(entries)
        return [float(metrics.get("num-examples", 0)) for _, metrics in entries]

    def reply_mask(self, partition_id: int, metrics: MetricRecord) -> dict | None:
        return None

    def metric_specs(self, partition_id: int) -> dict[str, MetricSpec]:
        """What a reply's metrics must be: num-examples is the partition's size and labels are the partition's
        labels when the server knows them (num-examples weighs the reply, HeteroFL masks classifier rows by labels),
        else distinct classes of the model; loss and time finite, non-negative and below their ceilings."""
        size = None if self.examples_of_partition is None else self.examples_of_partition[partition_id]
        held = None if self.labels_of_partition is None else self.labels_of_partition[partition_id]
        return {
            "num-examples": examples_spec(size, exact=True),
            "labels": labels_spec(self.model_cfg.n_classes, held=held),
            "train-loss": TRAIN_LOSS,
            "client-seconds": CLIENT_SECONDS,
        }

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """What a resumed run needs besides the global model (plain containers only)."""
        return {"rounds": {r: log_.to_dict() for r, log_ in self.rounds.items()}}

    def restore_state(self, saved: dict) -> None:
        self.rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in saved["rounds"].items()}

    # -- rounds -------------------------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if arrays is not self._returned:  # the loop hands back what we returned: no need to decode it again
            self.global_state = record_to_state(arrays)
        view = self.to_wire_view(self.global_state, server_round)
        self._view = (server_round, view)
        log_ = self.rounds.setdefault(server_round, RoundLog())
        live = self.nodes.refresh(grid, server_round) if grid is not None else sorted(self.node_of_partition)
        log_.sampled = sample_partitions(live, self.clients_per_round, self.seed, server_round)
        self.routed, self._sent, self._sent_bytes = {}, {}, {}
        for pid in log_.sampled:
            bounds, arch = self.assign(pid, server_round)
            self.routed[pid] = (bounds, arch)
            payload = state_to_record(
                slice_state(self.client_view(view, pid), self.routed_shapes(bounds)), self.payload_dtype
            )
            self._sent_bytes[pid] = record_bytes(payload)
            log_.bytes_down += self._sent_bytes[pid]
            train_config = {
                **dict(config),
                **self.client_config(pid, bounds),
                "server-round": server_round,
                "lr": float(self.lr_of_round(server_round)),
                "budget-macs": float(self.budgets[pid]),
                "bounds-d": list(bounds.d),
                "bounds-e": list(bounds.e),
                "bounds-w": list(bounds.w),
                "payload-dtype": self.payload_dtype,
                # every partition's budget (declared where declared): the client rebuilds its γ-allocated partition
                "partition-budgets": [float(self.budgets[p]) for p in sorted(self.budgets)],
            }
            if arch is not None:
                train_config.update({"arch-d": list(arch.d), "arch-e": list(arch.e), "arch-w": list(arch.w)})
            content = RecordDict({"arrays": payload, "config": ConfigRecord(train_config)})
            self._sent[pid] = Message(content, message_type=MessageType.TRAIN, dst_node_id=self.node_of_partition[pid])
        return list(self._sent.values())

    def reply_problem(self, server_round: int, partition_id: int, reply: Message, view: dict) -> str | None:
        """Why a reply cannot be aggregated (None when it can): ``strategies.screening``'s checks, in order of cost:
        metrics, then array metadata against exactly what was routed (nothing decoded yet), then the decoded
        tensors (finite, within the magnitude bound of the global tensor they update, prefix slices of it, running
        variances not negative). Decoding reads only what the screened metadata allows (``payload.array_values``);
        anything it or a check raises is the reply's rejection, never the end of the round."""
        try:
            return self._reply_problem(server_round, partition_id, reply, view)
        except Exception as error:  # whatever one reply makes a check raise rejects that reply only
            return raised(error)

    def _reply_problem(self, server_round: int, partition_id: int, reply: Message, view: dict) -> str | None:
        if partition_id not in self.routed:
            return "not sampled this round"
        record = reply.content.array_records.get("arrays")
        if record is None:
            return "no arrays"
        bounds, arch = self.routed[partition_id]
        expected = self.routed_shapes(bounds)
        if arch is not None:  # a single trained subnet comes back: its slice of what was routed
            expected = {k: v for k, v in self.routed_shapes(arch).items() if k in expected}
        metrics = reply.content.metric_records.get("metrics", MetricRecord())
        problem = metrics_problem(metrics, self.metric_specs(partition_id)) or record_problem(
            record, expected, self.payload_dtype
        )
        if problem:
            return problem
        return update_problem(
            view, RecordState(record, self.payload_dtype), 1.0, expected, self._magnitude_bounds(server_round, view)
        )

    def _magnitude_bounds(self, server_round: int, view: dict) -> dict[str, float]:
        if self._bounds is None or self._bounds[0] != server_round:
            self._bounds = (server_round, {name: magnitude_bound(tensor) for name, tensor in view.items()})
        return self._bounds[1]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        log_ = self.rounds.setdefault(server_round, RoundLog())
        view = (
            self._view[1]
            if self._view and self._view[0] == server_round
            else self.to_wire_view(self.global_state, server_round)
        )
        accepted, losses = [], []
        replies = list(replies)
        log_.bytes_up += sum(arrays_bytes(reply, "arrays") for reply in replies)  # what arrived, credited or not
        for pid, reply in log_.screen(server_round, replies, self._sent):
            record = reply.content.array_records.get("arrays")
            problem = self.reply_problem(server_round, pid, reply, view)
            if problem:
                log(WARNING, "round %d: reply from client %d rejected: %s", server_round, pid, problem)
                log_.rejected.append(pid)
                continue
            metrics = reply.content.metric_records.get("metrics", MetricRecord())
            accepted.append((pid, RecordState(record, self.payload_dtype), metrics))
            losses.append(float(metrics.get("train-loss", math.nan)))
            log_.client_seconds += float(metrics.get("client-seconds", 0.0))
        log_.accepted = [pid for pid, _, _ in accepted]
        log_.close(server_round, len(accepted), self.min_reply_fraction, self._sent_bytes)
        weights = self.reply_weights(server_round, [(pid, metrics) for pid, _, metrics in accepted])
        updates = [(state, w) for (_, state, _), w in zip(accepted, weights)]
        masks = [self.reply_mask(pid, metrics) for pid, _, metrics in accepted]
        self.global_state = self.from_wire_view(
            sparse_average(view, updates, masks, tensors_checked=True), server_round
        )
        log_.train_loss = float(np.nanmean(losses)) if np.isfinite(losses).any() else math.nan
        metrics = MetricRecord(
            {
                "train-loss": log_.train_loss,
                "replies": len(accepted),
                "failed": len(log_.failed),
                "rejected": len(log_.rejected),
                "bytes-down": log_.bytes_down,
                "bytes-up": log_.bytes_up,
            }
        )
        self._view, self._sent, self._sent_bytes = None, {}, {}
        self._returned = state_to_record(self.global_state)
        return self._returned, metrics

    # -- the round loop (``strategies.rounds.RoundLoop``): central evaluation by ``evaluate_fn`` -----------------
    def prepare_rounds(self, timeout: float) -> None:
        self.nodes.query_timeout = min(timeout, 60.0)  # a new node answering its partition query

    # -- evaluation is central (tiers on the server); no client-side evaluation rounds ------------------------
    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def summary(self) -> None:
        full = state_numel(subnet_shapes(self.model_cfg, self.model_cfg.max_subnet()))
        log(
            INFO,
            "%s: %d clients, %d per round, routing=%s, payload=%s, weights=%s, global model %.2fM params",
            type(self).__name__,
            len(self.node_of_partition),
            self.clients_per_round,
            self.routing,
            self.payload_dtype,
            self.weighting,
            full / 1e6,
        )
