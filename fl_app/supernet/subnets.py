"""Subnet caches, client budgets and routing bounds.

A subnet cache is a CSV of searched subnets (columns ``macs, params, d, e, w_indices``). Costs are recomputed
analytically for the supernet in use (the reference cache counts a 10-class classifier), sorted by MACs.
"""

from __future__ import annotations

import ast
import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_app.io.files import write_own_file
from fl_app.io.resources import bundled_file
from fl_app.models.supernet_space import NAMED_CACHES, Subnet, SupernetConfig, count_costs


@dataclass(frozen=True)
class CachedSubnet:
    arch: Subnet
    macs: int
    params: int


class SubnetCache:
    """The searched subnets a supernet's clients may run, cheapest first, with their costs recomputed for ``cfg``.

    What a budget affords comes from here: ``under`` (every subnet within it), ``local_max`` (the largest one: what a
    client deploys and is scored with), ``route_bounds`` (the envelope of those subnets: the sub-supernet routed to
    the client); ``tiers`` / ``nearest`` name the reporting tiers. Server and clients load the same cache (``load``:
    a bundled name or a CSV path), so both derive the same answers."""

    def __init__(self, cfg: SupernetConfig, subnets: list[Subnet]):
        if not subnets:
            raise ValueError("subnet cache is empty")
        entries = []
        for arch in subnets:
            cfg.check_subnet(arch)
            macs, params = count_costs(cfg, arch)
            entries.append(CachedSubnet(arch, macs, params))
        self.cfg = cfg
        self.entries = sorted(entries, key=lambda c: (c.macs, c.params))

    @staticmethod
    def load(cfg: SupernetConfig, spec: str) -> "SubnetCache":
        """``spec`` is ``cpu``, ``paper`` or a CSV path."""
        path = bundled_file(NAMED_CACHES[spec]) if spec in NAMED_CACHES else Path(spec).expanduser()
        if not path.is_file():
            raise ValueError(f"subnet-cache: '{spec}' is neither one of {sorted(NAMED_CACHES)} nor an existing CSV")
        return SubnetCache(cfg, read_cache_rows(path)[0])

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def min_macs(self) -> int:
        return self.entries[0].macs

    @property
    def max_macs(self) -> int:
        return self.entries[-1].macs

    def under(self, budget: float) -> list[CachedSubnet]:
        """Cached subnets whose MACs fit ``budget``, cheapest first."""
        return [c for c in self.entries if c.macs <= budget]

    def local_max(self, budget: float) -> CachedSubnet:
        """The largest cached subnet a client with ``budget`` can run."""
        fitting = self.under(budget)
        if not fitting:
            raise ValueError(f"budget {budget:.0f} MACs is below the smallest cached subnet ({self.min_macs} MACs)")
        return fitting[-1]

    def route_bounds(self, budget: float) -> Subnet:
        """The sub-supernet a client with ``budget`` receives: per-dimension max over the cached subnets it can run."""
        fitting = self.under(budget)
        if not fitting:
            raise ValueError(f"budget {budget:.0f} MACs is below the smallest cached subnet ({self.min_macs} MACs)")
        return Subnet.envelope([c.arch for c in fitting])

    def nearest(self, macs: float) -> CachedSubnet:
        return min(self.entries, key=lambda c: abs(c.macs - macs))

    def tiers(self, targets: list[float] | None, count: int = 4) -> list[CachedSubnet]:
        """Reporting tiers: the cached subnets nearest to ``targets``, or ``count`` spread evenly in log-MACs."""
        if not targets:
            lo, hi = np.log(self.min_macs), np.log(self.max_macs)
            targets = list(np.exp(np.linspace(lo, hi, count)))
        chosen = {self.nearest(t).macs: self.nearest(t) for t in targets}
        return [chosen[k] for k in sorted(chosen)]


def read_cache_rows(path: Path) -> tuple[list[Subnet], list[dict]]:
    """Subnets and raw rows of a cache CSV."""
    subnets, rows = [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            subnets.append(
                Subnet(ast.literal_eval(row["d"]), ast.literal_eval(row["e"]), ast.literal_eval(row["w_indices"]))
            )
            rows.append(row)
    return subnets, rows


def write_cache(path: Path, cache_entries: list[CachedSubnet]) -> None:
    """A cache CSV at ``path``, a new file (``write_own_file``: never over another file, never through a symlink)."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["macs", "params", "d", "e", "w_indices"])
    for c in cache_entries:
        writer.writerow([c.macs, c.params, str(list(c.arch.d)), str(list(c.arch.e)), str(list(c.arch.w))])
    write_own_file(path, text.getvalue().encode())


def random_subnet(cfg: SupernetConfig, rng: np.random.Generator) -> Subnet:
    """A subnet drawn uniformly per dimension from the search space."""
    return Subnet(
        d=rng.integers(0, cfg.max_extra_blocks_per_stage + 1, cfg.num_stages),
        e=rng.choice(cfg.expansion_ratio_choices, cfg.num_stages),
        w=rng.integers(0, len(cfg.width_multiplier_choices), cfg.num_stages + 1),
    )


# -- what a FEAST client trains in one step: its plan, which the server costs too --------------------------------
@dataclass
class SubnetPlan:
    """The subnets a client trains: ``largest`` is the teacher; ``smallest`` and ``between`` are its students."""

    largest: Subnet
    smallest: Subnet | None
    between: list[Subnet]  # one is drawn per step


def plan_subnets(cache: SubnetCache, budget: float, bounds: Subnet, wanted: tuple[str, ...]) -> SubnetPlan:
    """Local max = the largest cached subnet under ``budget``; min = the smallest; random = any cached subnet
    strictly between them. All must lie inside the routed ``bounds``. Degenerate cases collapse: with a single
    affordable subnet only the max is trained."""
    fitting = [c for c in cache.under(budget) if c.arch.within(bounds)]
    if not fitting:
        raise ValueError(f"no cached subnet fits budget {budget:.0f} MACs inside the routed bounds")
    largest, smallest = fitting[-1], fitting[0]
    min_arch = smallest.arch if "min" in wanted and smallest.arch != largest.arch else None
    between = [c.arch for c in fitting if smallest.macs < c.macs < largest.macs and c.arch != largest.arch]
    return SubnetPlan(largest.arch, min_arch, between if "random" in wanted else [])
