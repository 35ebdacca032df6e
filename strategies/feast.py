"""FEAST server: each client is routed the sub-supernet its budget affords and plans its own step in it; the rest of
the round (screening, sparse aggregation, tiers) is the supernet family's (``strategies.supernet_base``)."""

from __future__ import annotations

from fl_app.models.supernet_space import Subnet
from strategies.supernet_base import SupernetStrategy


class FeastStrategy(SupernetStrategy):
    """FEAST: the envelope of the cached subnets a client's budget affords (the whole supernet when the run config's
    ``routing`` is off), no subnet assigned: the client plans its max/min/random step itself."""

    def assign(self, partition_id: int, server_round: int) -> tuple[Subnet, Subnet | None]:
        bounds = self.cache.route_bounds(self.budgets[partition_id]) if self.slice_to_budget else self.cfg.max_subnet()
        return bounds, None
