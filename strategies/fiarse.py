"""FIARSE baseline (importance-aware submodel extraction): every client trains the full model under an
unstructured magnitude mask; the server averages each weight over the clients whose mask kept it.

Levels are MAC targets (the app uses HeteroFL's tiers' MACs, so the width-sliced baselines, ScaleFL and FIARSE
serve the same budgets). Each round, from the global model, every level gets one global threshold
(``magnitude_masks.level_thresholds``: the largest-magnitude elements whose MACs fit the level); a client trains at
the largest level its budget affords (the smallest when it affords none). It receives the full model's parameters
with the elements below its threshold set to zero (dense tensors: see ``docs/feast.md``) and the threshold, trains
with the mask recomputed from it at every step, and returns the same dense tensors. The server averages each masked
element over the clients whose round-start mask kept it (weighted as the run's ``aggregation-weights`` say); an
element no client kept keeps its global value, and whatever a reply holds outside its mask is ignored. BatchNorm is
never masked and, as in HeteroFL, static: its running statistics are neither sent nor averaged (evaluation
recalibrates them).

``fiarse-mapping = "reference"`` maps clients as the FEAST repository does instead: each client keeps its own
fraction of the parameters, its budget over the full model's MACs (``magnitude_masks.model_size``), by count (the
top-k magnitudes over the masked tensors: ``size_threshold``), whatever MACs those elements cost; a reporting tier of
M MACs is the mask of size M / full-model MACs. The client then trains with plain SGD (``clients.fiarse``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import MetricRecord

from fl_app.models.supernet_space import Subnet, count_macs
from fl_app.run.payload import record_to_state
from fl_app.run.records import ARRAYS_RECORD, CONFIG_RECORD
from fl_app.supernet.magnitude_masks import (
    element_macs,
    kept_macs,
    level_thresholds,
    magnitude_mask,
    model_size,
    size_threshold,
)
from fl_app.supernet.message import TrainInstruction
from fl_app.supernet.slicing import state_numel, subnet_shapes
from strategies.heterofl import RUNNING_STATS
from strategies.supernet_base import SupernetStrategy


@dataclass(frozen=True)
class MaskLevel:
    """A reporting tier of FIARSE: the full model (``arch``) masked to ``macs``; ``params`` counts the dense model
    a client holds (unstructured masks save compute, not storage)."""

    arch: Subnet
    macs: int
    params: int


def masked_state(state: dict, mask: dict) -> dict:
    """``state`` with the elements outside ``mask`` set to zero (tensors without a mask unchanged)."""
    return {
        k: np.where(mask[k], v, np.zeros((), dtype=np.asarray(v).dtype)) if k in mask else v for k, v in state.items()
    }


# fiarse-mapping values: how a client's budget becomes its mask
FIARSE_MAPPINGS = ("tiers", "reference")


class FiarseStrategy(SupernetStrategy):
    def __init__(self, *args, levels: list[float], mapping: str = "tiers", **kwargs):
        super().__init__(*args, **kwargs)
        if mapping not in FIARSE_MAPPINGS:
            raise ValueError(f"fiarse-mapping='{mapping}': allowed values are {list(FIARSE_MAPPINGS)}")
        full = self.cfg.max_subnet()
        self.mapping, self.full_macs = mapping, count_macs(self.cfg, full)
        self.costs = element_macs(self.cfg)
        self.tiers = [MaskLevel(full, int(m), state_numel(self.routed_shapes(full))) for m in sorted(set(levels))]
        self._masks: tuple[int, list[float], list[dict]] | None = None  # (round, thresholds, masks) per level
        self._sized: tuple[int, dict[float, tuple[float, dict]]] | None = None  # (round, size -> (threshold, mask))
        self._kept: tuple | None = None  # ((round, threshold, dtype), MACs its mask keeps) last costed

    def level_index(self, budget: float) -> int:
        affordable = [i for i, level in enumerate(self.tiers) if level.macs <= budget]
        return affordable[-1] if affordable else 0

    def level_masks(self, state: dict) -> tuple[list[float], list[dict]]:
        """Per level: its threshold and the masks it gives on ``state``."""
        thresholds = level_thresholds(state, self.costs, [level.macs for level in self.tiers])
        return thresholds, [magnitude_mask(state, self.costs, t) for t in thresholds]

    def _round_masks(self) -> tuple[list[float], list[dict]]:
        server_round, view = self._view  # set by begin_round before any client's message is built
        if self._masks is None or self._masks[0] != server_round:
            self._masks = (server_round, *self.level_masks(view))
        return self._masks[1], self._masks[2]

    def _sized_mask(self, size: float) -> tuple[float, dict]:
        """The reference mapping's threshold and mask of ``size`` on this round's global view."""
        server_round, view = self._view
        if self._sized is None or self._sized[0] != server_round:
            self._sized = (server_round, {})
        if size not in self._sized[1]:
            threshold = size_threshold(view, self.costs, size)
            self._sized[1][size] = (threshold, magnitude_mask(view, self.costs, threshold))
        return self._sized[1][size]

    def client_mask(self, partition_id: int) -> tuple[float, dict]:
        """This round's threshold and mask of a client: its level's, or under the reference mapping its own size's."""
        budget = self.budgets[partition_id]
        if self.mapping == "reference":
            return self._sized_mask(model_size(budget, self.full_macs))
        thresholds, masks = self._round_masks()
        index = self.level_index(budget)
        return thresholds[index], masks[index]

    def tier_state(self, tier: MaskLevel, state: dict) -> dict:
        """The global state as evaluated at ``tier``: masked at the level's threshold on that state (under the
        reference mapping: the mask of size tier MACs / full-model MACs)."""
        if self.mapping == "reference":
            threshold = size_threshold(state, self.costs, model_size(tier.macs, self.full_macs))
        else:
            (threshold,) = level_thresholds(state, self.costs, [tier.macs])
        return masked_state(state, magnitude_mask(state, self.costs, threshold))

    # -- SupernetStrategy's hooks --------------------------------------------------------------------------------------
    def assign(self, partition_id: int, server_round: int):
        full = self.cfg.max_subnet()
        return full, full

    def routed_shapes(self, arch):
        return {k: v for k, v in subnet_shapes(self.cfg, arch).items() if not k.endswith(RUNNING_STATS)}

    def client_view(self, view: dict, partition_id: int) -> dict:
        return masked_state(view, self.client_mask(partition_id)[1])

    def instruction_fields(self, partition_id: int, bounds) -> dict:
        return dict(mask_threshold=self.client_mask(partition_id)[0])

    def routed_macs(self, partition_id: int) -> tuple[float, float]:
        """The MACs the client's mask keeps, as the client computes them from what it received: the sent arrays
        decoded in the payload dtype and the sent threshold (clients of one level share both: costed once)."""
        message = self._sent[partition_id]
        threshold = TrainInstruction.from_config(message.content.config_records[CONFIG_RECORD]).mask_threshold
        key = (self._view[0] if self._view else None, threshold, self.payload_dtype)
        if self._kept is None or self._kept[0] != key:
            received = record_to_state(message.content.array_records[ARRAYS_RECORD], self.payload_dtype)
            self._kept = (key, kept_macs(magnitude_mask(received, self.costs, threshold), self.costs))
        return self._kept[1], self._kept[1]

    def routed_work(self, partition_id: int, metrics: MetricRecord) -> dict:
        """The skeleton's costs (the MACs the mask keeps) and ``train-flops-dense``: the full model's MACs per step,
        what the dense tensors execute (the FEAST repository's convention for matching FIARSE's compute)."""
        work = super().routed_work(partition_id, metrics)
        if work:
            work["train-flops-dense"] = self.local_training.flops(self.full_macs, metrics.get("local-steps", 0))
        return work

    def reply_mask(self, partition_id: int, metrics: MetricRecord) -> dict:
        return self.client_mask(partition_id)[1]
