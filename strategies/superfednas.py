"""SuperFedNAS and DeepFedNAS baselines: one subnet per client chosen by the tracking sandwich, sent to that client
alone (as in both papers: a client downloads only the subnet it trains), MaxNet-weighted aggregation of the returned
subnet slices."""

from __future__ import annotations

import math

import numpy as np
from flwr.app import MetricRecord

from fl_app.models.supernet_space import Subnet, count_macs
from fl_app.supernet.subnets import random_subnet
from strategies.supernet_base import SupernetStrategy


def maxnet_beta(
    server_round: int, num_rounds: int, beta0: float = 0.9, final: float = 0.125, decay_fraction: float = 0.8
) -> float:
    """β_t = β₀·[(1-a)·½(1+cos(π·min(t,T)/T)) + a] with a = ``final`` and T = ``decay_fraction`` of the rounds."""
    horizon = max(1.0, decay_fraction * num_rounds)
    return beta0 * ((1 - final) * 0.5 * (1 + math.cos(math.pi * min(server_round, horizon) / horizon)) + final)


def maxnet_weights(roles: list[str], beta: float) -> list[float]:
    """The max-subnet clients share β (β/top_k each); the others share 1-β."""
    top_k = roles.count("max")
    if top_k == 0 or top_k == len(roles):
        return [1.0 / len(roles)] * len(roles)
    return [beta / top_k if r == "max" else (1 - beta) / (len(roles) - top_k) for r in roles]


def sandwich_roles(sampled: list[int], largest_counts: dict[int, int], smallest_counts: dict[int, int]) -> dict:
    """Tracking sandwich: the client with the fewest past 'max' assignments trains the max subnet, of the rest the one
    with the fewest past 'min' trains the min subnet, everyone else a random one (ties by partition id)."""
    roles = {}
    remaining = sorted(sampled, key=lambda p: (largest_counts.get(p, 0), p))
    roles[remaining.pop(0)] = "max"
    if remaining:
        remaining.sort(key=lambda p: (smallest_counts.get(p, 0), p))
        roles[remaining.pop(0)] = "min"
    roles.update({p: "random" for p in remaining})
    return roles


class SuperFedNASStrategy(SupernetStrategy):
    """``subnet_source = "space"`` (SuperFedNAS) draws the random subnet from the search space; ``"cache"``
    (DeepFedNAS) draws max/min/random from the subnet cache."""

    def __init__(
        self,
        *args,
        num_rounds: int,
        budget_constrained: bool = True,
        subnet_source: str = "space",
        beta0: float = 0.9,
        beta_final: float = 0.125,
        decay_fraction: float = 0.8,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.num_rounds, self.budget_constrained, self.subnet_source = num_rounds, budget_constrained, subnet_source
        self.beta0, self.beta_final, self.decay_fraction = beta0, beta_final, decay_fraction
        self.largest_counts: dict[int, int] = {}
        self.smallest_counts: dict[int, int] = {}
        self.roles: dict[int, str] = {}
        self.roles_round = 0

    def _subnet_for(self, role: str, budget: float, rng: np.random.Generator) -> Subnet:
        limit = budget if self.budget_constrained else math.inf
        affordable = self.cache.under(limit)
        if role == "max":
            if self.subnet_source == "space" and not self.budget_constrained:
                return self.cfg.max_subnet()
            return affordable[-1].arch
        if role == "min":
            return self.cfg.min_subnet() if self.subnet_source == "space" else affordable[0].arch
        if self.subnet_source == "cache":
            return affordable[rng.integers(len(affordable))].arch
        for _ in range(100):  # rejection sampling under the budget
            arch = random_subnet(self.cfg, rng)
            if count_macs(self.cfg, arch) <= limit:
                return arch
        return affordable[0].arch

    def assign(self, partition_id: int, server_round: int):
        if self.roles_round != server_round:  # decide the whole round's roles once
            self.roles_round = server_round
            self.roles = sandwich_roles(self.rounds[server_round].sampled, self.largest_counts, self.smallest_counts)
            for pid, role in self.roles.items():
                counts = {"max": self.largest_counts, "min": self.smallest_counts}.get(role)
                if counts is not None:
                    counts[pid] = counts.get(pid, 0) + 1
        rng = np.random.default_rng([self.seed, server_round, partition_id, 17])
        arch = self._subnet_for(self.roles[partition_id], self.budgets[partition_id], rng)
        return arch, arch  # the client receives exactly the subnet it trains and sends the same slice back

    def checkpoint_state(self) -> dict:
        return {
            **super().checkpoint_state(),
            "largest_counts": dict(self.largest_counts),
            "smallest_counts": dict(self.smallest_counts),
        }

    def restore_state(self, saved: dict) -> None:
        super().restore_state(saved)
        self.largest_counts = {int(p): int(c) for p, c in saved["largest_counts"].items()}
        self.smallest_counts = {int(p): int(c) for p, c in saved["smallest_counts"].items()}

    def reply_weights(self, server_round: int, entries: list[tuple[int, MetricRecord]]) -> list[float]:
        beta = maxnet_beta(server_round, self.num_rounds, self.beta0, self.beta_final, self.decay_fraction)
        return maxnet_weights([self.roles[pid] for pid, _ in entries], beta)
