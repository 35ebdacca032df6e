"""Round bookkeeping shared by every strategy: seeded client sampling over partition ids and the per-round log of
who was sampled, who failed, whose reply was rejected, and what it cost."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from logging import WARNING
from typing import Iterable

import numpy as np
from flwr.app import Message
from flwr.common.logger import log


def sample_partitions(partition_ids: Iterable[int], k: int, seed: int, server_round: int) -> list[int]:
    """Seeded client sampling over partition ids (node ids are random per run)."""
    ids = sorted(partition_ids)
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(p) for p in rng.choice(ids, size=min(k, len(ids)), replace=False))


@dataclass
class RoundLog:
    sampled: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    bytes_down: int = 0
    bytes_up: int = 0
    train_loss: float = math.nan
    seconds: float = math.nan  # wall time of the whole round (training, aggregation, evaluation)
    client_seconds: float = 0.0  # sum of the accepted clients' own time in their ClientApp function
    server_rss_mb: float = math.nan  # server process memory after the round: resident and peak so far
    server_peak_rss_mb: float = math.nan
    answered: set[int] = field(default_factory=set)

    def to_dict(self) -> dict:
        return {**asdict(self), "answered": sorted(self.answered)}

    @staticmethod
    def from_dict(saved: dict) -> "RoundLog":
        return RoundLog(**{**saved, "answered": set(saved["answered"])})

    def screen(self, server_round: int, replies: Iterable[Message],
               node_of_partition: dict[int, int]) -> list[tuple[int, Message]]:
        """(partition id, reply) of the replies without error, in partition order; errors are logged as failures."""
        partition_of_node = {n: p for p, n in node_of_partition.items()}
        answers = sorted(((partition_of_node.get(m.metadata.src_node_id, -1), m) for m in replies),
                         key=lambda answer: answer[0])
        usable = []
        for pid, reply in answers:
            self.answered.add(pid)
            if reply.has_error():
                log(WARNING, "round %d: client %d failed: %s", server_round, pid, reply.error.reason)
                self.failed.append(pid)
            else:
                usable.append((pid, reply))
        return usable

    def close(self, server_round: int, valid: int, min_reply_fraction: float) -> None:
        """Count sampled clients that never answered as failed; fail the round below the minimum of valid replies."""
        self.failed += [pid for pid in self.sampled if pid not in self.answered]
        needed = math.ceil(min_reply_fraction * len(self.sampled))
        if valid < needed:
            raise RuntimeError(f"round {server_round}: {valid} valid replies of {len(self.sampled)} sampled "
                               f"(min-reply-fraction={min_reply_fraction} needs {needed}); "
                               f"failed: {self.failed}, rejected: {self.rejected}")
