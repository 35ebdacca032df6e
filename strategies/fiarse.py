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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import MetricRecord

from fl_app.models.supernet_space import Subnet
from fl_app.run.payload import record_to_state
from fl_app.supernet.magnitude_masks import element_macs, kept_macs, level_thresholds, magnitude_mask
from fl_app.supernet.slicing import state_numel, subnet_shapes
from strategies.feast import FeastStrategy
from strategies.heterofl import RUNNING_STATS


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


class FiarseStrategy(FeastStrategy):
    def __init__(self, *args, levels: list[float], **kwargs):
        super().__init__(*args, **kwargs)
        full = self.cfg.max_subnet()
        self.costs = element_macs(self.cfg)
        self.tiers = [MaskLevel(full, int(m), state_numel(self.routed_shapes(full))) for m in sorted(set(levels))]
        self._masks: tuple[int, list[float], list[dict]] | None = None  # (round, thresholds, masks) per level
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

    def tier_state(self, tier: MaskLevel, state: dict) -> dict:
        """The global state as evaluated at ``tier``: masked at the level's threshold on that state."""
        (threshold,) = level_thresholds(state, self.costs, [tier.macs])
        return masked_state(state, magnitude_mask(state, self.costs, threshold))

    # -- FeastStrategy's hooks -------------------------------------------------------------------------------------
    def assign(self, partition_id: int, server_round: int):
        full = self.cfg.max_subnet()
        return full, full

    def routed_shapes(self, arch):
        return {k: v for k, v in subnet_shapes(self.cfg, arch).items() if not k.endswith(RUNNING_STATS)}

    def client_view(self, view: dict, partition_id: int) -> dict:
        _, masks = self._round_masks()
        return masked_state(view, masks[self.level_index(self.budgets[partition_id])])

    def client_config(self, partition_id: int, bounds) -> dict:
        thresholds, _ = self._round_masks()
        return {"mask-threshold": thresholds[self.level_index(self.budgets[partition_id])]}

    def routed_macs(self, partition_id: int) -> tuple[float, float]:
        """The MACs the client's mask keeps, as the client computes them from what it received: the sent arrays
        decoded in the payload dtype and the sent threshold (clients of one level share both: costed once)."""
        message = self._sent[partition_id]
        threshold = float(message.content.config_records["config"]["mask-threshold"])
        key = (self._view[0] if self._view else None, threshold, self.payload_dtype)
        if self._kept is None or self._kept[0] != key:
            received = record_to_state(message.content.array_records["arrays"], self.payload_dtype)
            self._kept = (key, kept_macs(magnitude_mask(received, self.costs, threshold), self.costs))
        return self._kept[1], self._kept[1]

    def reply_mask(self, partition_id: int, metrics: MetricRecord) -> dict:
        _, masks = self._round_masks()
        return masks[self.level_index(self.budgets[partition_id])]
