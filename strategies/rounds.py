"""Round bookkeeping shared by every strategy: seeded client sampling over partition ids and the per-round log of
who was sampled, who failed, whose reply was rejected, and what it cost."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from logging import WARNING
from typing import Iterable, Mapping

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.common.logger import log


def sample_partitions(partition_ids: Iterable[int], k: int, seed: int, server_round: int) -> list[int]:
    """Seeded client sampling over partition ids (node ids are random per run)."""
    ids = sorted(partition_ids)
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(p) for p in rng.choice(ids, size=min(k, len(ids)), replace=False))


@dataclass
class RoundLog:
    """What happened in one round. Every sampled partition ends in exactly one of ``accepted``, ``rejected`` (its
    reply failed screening) or ``failed`` (it raised, its node was unavailable, or it never answered)."""

    sampled: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    unreached: list[int] = field(default_factory=list)  # failed without the message reaching the node
    bytes_down: int = 0  # payloads sent; after ``close``, only those delivered to a node that answered
    bytes_down_unanswered: int = 0  # payloads sent to partitions whose node never answered (dead, gone, timed out)
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

    def row(self, server_round: int) -> dict:
        """This round's line of rounds.csv."""
        return {"round": server_round, "sampled": len(self.sampled), "replies": len(self.accepted),
                "failed": len(self.failed), "rejected": len(self.rejected), "train_loss": self.train_loss,
                "bytes_down": self.bytes_down, "bytes_down_unanswered": self.bytes_down_unanswered,
                "bytes_up": self.bytes_up, "seconds": self.seconds, "client_seconds": self.client_seconds,
                "server_rss_mb": self.server_rss_mb, "server_peak_rss_mb": self.server_peak_rss_mb}

    def screen(self, server_round: int, replies: Iterable[Message], node_of_partition: Mapping[int, int],
               sent: Mapping[int, Message] | None = None) -> list[tuple[int, Message]]:
        """(partition id, reply) of the replies without error, in partition order; errors are logged as failures.

        A reply belongs to the partition whose message it answers: ``metadata.reply_to_message_id`` against the ids
        the grid gave the messages in ``sent`` (partition id -> message) when it pushed them. The SuperLink's own
        error replies (a node that died: NODE_UNAVAILABLE) carry the SuperLink's node id as sender, so the sender
        cannot tell whose they are. Replies the ids cannot place fall back to their sender's node id. Each
        partition counts once: a second reply for it, or a reply nobody can place, is logged and ignored."""
        partition_of_message = {m.metadata.message_id: pid for pid, m in (sent or {}).items() if m.metadata.message_id}
        partition_of_node = {n: p for p, n in node_of_partition.items()}
        usable = []
        for reply in replies:
            meta = reply.metadata
            pid = partition_of_message.get(meta.reply_to_message_id, partition_of_node.get(meta.src_node_id))
            if pid is None:
                log(WARNING, "round %d: a reply from node %d answers no message of this round: ignored",
                    server_round, meta.src_node_id)
                continue
            if pid in self.answered:
                log(WARNING, "round %d: a second reply for client %d: ignored", server_round, pid)
                continue
            self.answered.add(pid)
            if reply.has_error():
                log(WARNING, "round %d: client %d failed: %s", server_round, pid, reply.error.reason)
                self.failed.append(pid)
                if reply.error.code == ErrorCode.NODE_UNAVAILABLE or meta.src_node_id != node_of_partition.get(pid):
                    self.unreached.append(pid)
            else:
                usable.append((pid, reply))
        return sorted(usable, key=lambda answer: answer[0])

    def close(self, server_round: int, valid: int, min_reply_fraction: float,
              sent_bytes: Mapping[int, int] | None = None) -> None:
        """Count sampled clients that never answered as failed; move the bytes sent to partitions whose node never
        answered (``sent_bytes``: partition id -> bytes) out of ``bytes_down``; fail the round below the minimum of
        valid replies."""
        silent = [pid for pid in self.sampled if pid not in self.answered]
        if silent:
            log(WARNING, "round %d: no reply from clients %s", server_round, silent)
        self.failed += silent
        self.unreached += silent
        for pid, size in (sent_bytes or {}).items():  # counted in bytes_down when sent; moved if never delivered
            if pid in self.unreached:
                self.bytes_down -= size
                self.bytes_down_unanswered += size
        needed = math.ceil(min_reply_fraction * len(self.sampled))
        if valid < needed:
            raise RuntimeError(f"round {server_round}: {valid} valid replies of {len(self.sampled)} sampled "
                               f"(min-reply-fraction={min_reply_fraction} needs {needed}); "
                               f"failed: {self.failed}, rejected: {self.rejected}")
