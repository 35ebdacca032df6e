"""The supernet family's base (FEAST and the methods built on the supernet) on the round skeleton
(``strategies.skeleton``): one global model, a slice of it routed to each sampled client, screening of what comes
back, and sparse aggregation of the accepted slices. FEAST's own choice of what to route is ``strategies.feast``."""

from __future__ import annotations

from abc import abstractmethod
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.logger import log

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, SupernetConfig, count_macs
from fl_app.run.config import check_choice
from fl_app.run.costs import LocalTraining
from fl_app.run.payload import RecordState, record_to_state, state_to_record
from fl_app.run.records import ARRAYS_RECORD, CONFIG_RECORD
from fl_app.supernet.evaluation import TierScoring
from fl_app.supernet.message import TrainInstruction
from fl_app.supernet.slicing import prefix_region, slice_state, state_numel, subnet_shapes
from fl_app.supernet.subnets import SubnetCache, plan_subnets
from fl_app.supernet.training_costs import plan_step_macs
from strategies.robust import AGGREGATIONS
from strategies.screening import (
    SLICE_BOUND_BASIS,
    MetricSpec,
    examples_spec,
    labels_spec,
    reply_cost_specs,
    slice_relative_bound,
)
from strategies.skeleton import RoundSkeleton
from strategies.sparse import update_problem


class SupernetStrategy(RoundSkeleton, TierScoring):
    """The supernet family's server (FEAST, SuperFedNAS, DeepFedNAS, HeteroFL, FedRolex, ScaleFL, FIARSE and FedAvg-min
    subclass it): one global model, of which each sampled client is sent the slice its budget affords and returns
    the slice it trained; the server averages every element over the replies that cover it (``sparse_average``).

    A round (``strategies.skeleton.RoundSkeleton``) cuts each client's slice from the global state in the
    coordinates clients use (``to_wire_view``), routes it by ``assign`` (bounds, and the one subnet to train or None
    for FEAST's own plan) with a ``TrainInstruction`` (``fl_app.supernet.message``; ``instruction_fields``: the
    method's own), screens what comes back against exactly what was routed, and merges the accepted replies
    with ``reply_weights`` and ``reply_mask``. Evaluation is central (tiers on the server): no client-side
    evaluation rounds; how a tier is scored is the ``TierScoring`` it declares (the subnet cut from the global state,
    unless a subclass says otherwise). Subclasses change what is routed and the merge through these methods, not the
    round."""

    def __init__(
        self,
        cfg: SupernetConfig,
        cache: SubnetCache,
        budgets: dict[int, float],
        node_of_partition: dict[int, int],
        *,
        clients_per_round: int,
        seed: int,
        slice_to_budget: bool = True,  # the run config's routing: each client gets its budget's sub-supernet
        payload_dtype: str = "float32",
        weighting: str = "num-examples",
        robust_aggregation: str = "none",
        min_reply_fraction: float = 1.0,
        lr_of_round=None,
        examples_of_partition: dict[int, int] | None = None,
        labels_of_partition: dict[int, list[int]] | None = None,
        local_training: LocalTraining | None = None,
        train_subnets: tuple[str, ...] = ("max", "min", "random"),
    ):
        super().__init__(
            node_of_partition,
            len(budgets),
            clients_per_round=clients_per_round,
            seed=seed,
            payload_dtype=payload_dtype,
            min_reply_fraction=min_reply_fraction,
            lr_of_round=lr_of_round,
            local_training=local_training,
        )
        self.train_subnets = train_subnets  # what a client told to plan its own step trains (run's train-subnets)
        self.cfg, self.cache, self.budgets = cfg, cache, budgets
        self.slice_to_budget, self.weighting = slice_to_budget, weighting
        check_choice("robust-aggregation", robust_aggregation)
        self.robust_aggregation = robust_aggregation
        # what each client must report as num-examples (its partition size), when the server can know it
        self.examples_of_partition = examples_of_partition
        # the labels each client's partition holds (what it must report as labels), when the server can know them
        self.labels_of_partition = labels_of_partition
        self.global_state: dict[str, np.ndarray] = {}
        self.routed: dict[int, tuple[Subnet, Subnet | None]] = {}  # partition id -> (bounds, arch) this round
        self._returned: ArrayRecord | None = None  # the record merge handed back (decoded: global_state)
        self._view: tuple[int, dict] | None = None  # (round, wire view of global_state) built by begin_round
        self._bounds: tuple[int, dict] | None = None  # (round, magnitude bound per (tensor, routed shape) of that view)

    # -- what each client gets ------------------------------------------------------------------------------------
    @property
    def model_cfg(self) -> SupernetConfig:
        """The config of the global model (baselines on width-sliced models override it)."""
        return self.cfg

    def global_model(self) -> ElasticResNet:
        """A freshly initialised global model (ScaleFL's also holds its exit heads)."""
        return ElasticResNet(self.model_cfg)

    @abstractmethod
    def assign(self, partition_id: int, server_round: int) -> tuple[Subnet, Subnet | None]:
        """(bounds routed to the client, the single subnet it must train or None to let it plan FEAST's step): each
        method's own."""

    def routed_shapes(self, arch: Subnet) -> dict[str, tuple]:
        return subnet_shapes(self.model_cfg, arch)

    def instruction_fields(self, partition_id: int, bounds: Subnet) -> dict:
        """The method's own fields of the client's ``TrainInstruction`` (its keyword arguments); none here."""
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
            **reply_cost_specs(self.max_local_steps(size)),
        }

    def routed_macs(self, partition_id: int) -> tuple[float, float]:
        """What the client was routed: the one subnet it was told to train, else the step it plans within its bounds
        and budget (``plan_subnets``, as the client does); costed as the client costs it (``plan_step_macs``)."""
        bounds, arch = self.routed[partition_id]
        if arch is not None:
            return plan_step_macs(self.model_cfg, arch, None, []), count_macs(self.model_cfg, arch)
        plan = plan_subnets(self.cache, float(self.budgets[partition_id]), bounds, self.train_subnets)
        step = plan_step_macs(self.model_cfg, plan.largest, plan.smallest, plan.between)
        return step, count_macs(self.model_cfg, plan.largest)

    # -- the round skeleton's hooks -------------------------------------------------------------------------
    def begin_round(self, server_round: int, arrays: ArrayRecord) -> None:
        if arrays is not self._returned:  # the loop hands back what merge returned: no need to decode it again
            self.global_state = record_to_state(arrays)
        self._view = (server_round, self.to_wire_view(self.global_state, server_round))
        self.routed = {}

    def _round_view(self, server_round: int) -> dict:
        """The wire view clients sliced this round (built here when the round did not start with ``begin_round``)."""
        if self._view is None or self._view[0] != server_round:
            self._view = (server_round, self.to_wire_view(self.global_state, server_round))
        return self._view[1]

    def train_content(self, partition_id: int, server_round: int, config: ConfigRecord) -> RecordDict:
        bounds, arch = self.assign(partition_id, server_round)
        self.routed[partition_id] = (bounds, arch)
        view = self.client_view(self._round_view(server_round), partition_id)
        payload = state_to_record(slice_state(view, self.routed_shapes(bounds)), self.payload_dtype)
        instruction = TrainInstruction(
            server_round=server_round,
            lr=float(self.lr_of_round(server_round)),
            budget_macs=float(self.budgets[partition_id]),
            # every partition's budget (declared where declared): the client rebuilds its γ-allocated partition
            partition_budgets=tuple(float(self.budgets[p]) for p in sorted(self.budgets)),
            bounds=bounds,
            payload_dtype=self.payload_dtype,
            arch=arch,
            **self.instruction_fields(partition_id, bounds),
        )
        train_config = {**dict(config), **instruction.to_config()}
        return RecordDict({ARRAYS_RECORD: payload, CONFIG_RECORD: ConfigRecord(train_config)})

    def reply_shapes(self, partition_id: int) -> dict[str, tuple]:
        """Exactly what was routed, or of it the single subnet the client was told to train."""
        bounds, arch = self.routed[partition_id]
        expected = self.routed_shapes(bounds)
        if arch is not None:
            expected = {k: v for k, v in self.routed_shapes(arch).items() if k in expected}
        return expected

    def decoded_problem(self, server_round: int, partition_id: int, decoded: RecordState) -> str | None:
        """Tensors finite, prefix slices of the global tensor they update, within the bound of the global slice they
        were sent (``screening.slice_relative_bound``), running variances not negative (``sparse.update_problem``)."""
        view = self._round_view(server_round)
        shapes = self.reply_shapes(partition_id)
        bounds = self._magnitude_bounds(server_round, view, shapes)
        return update_problem(view, decoded, 1.0, shapes, bounds, SLICE_BOUND_BASIS)

    def _magnitude_bounds(self, server_round: int, view: dict, shapes: dict[str, tuple]) -> dict[str, float]:
        """The bound of each routed slice, computed once per round for each (tensor, shape) routed."""
        if self._bounds is None or self._bounds[0] != server_round:
            self._bounds = (server_round, {})
        cached = self._bounds[1]
        for name, shape in shapes.items():
            key = (name, tuple(shape))
            if key not in cached and name in view:
                cached[key] = slice_relative_bound(name, view[name][prefix_region(shape)])
        return {name: cached[(name, tuple(shape))] for name, shape in shapes.items() if name in view}

    def merge(self, server_round: int, accepted: list[tuple[int, RecordState, MetricRecord]]) -> ArrayRecord:
        view = self._round_view(server_round)
        weights = self.reply_weights(server_round, [(pid, metrics) for pid, _, metrics in accepted])
        updates = [(state, w) for (_, state, _), w in zip(accepted, weights)]
        masks = [self.reply_mask(pid, metrics) for pid, _, metrics in accepted]
        merged = AGGREGATIONS[self.robust_aggregation](view, updates, masks)  # "none": sparse_average
        self.global_state = self.from_wire_view(merged, server_round)
        self._view = None
        self._returned = state_to_record(self.global_state)
        return self._returned

    def prepare_rounds(self, timeout: float) -> None:
        self.nodes.query_timeout = min(timeout, 60.0)  # a new node answering its partition query

    def summary(self) -> None:
        full = state_numel(subnet_shapes(self.model_cfg, self.model_cfg.max_subnet()))
        log(
            INFO,
            # "routing": the run-config key this flag comes from
            "%s: %d clients, %d per round, routing=%s, payload=%s, weights=%s, global model %.2fM params",
            type(self).__name__,
            len(self.node_of_partition),
            self.clients_per_round,
            self.slice_to_budget,
            self.payload_dtype,
            self.weighting,
            full / 1e6,
        )
