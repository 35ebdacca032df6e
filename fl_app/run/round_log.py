"""What happened in each round of a run, whatever the method: ``RoundLog`` (who was sampled, who failed, whose reply
was rejected, what it cost; how a reply is credited to the partition it answers) and the run totals summary.json
reports of them (``round_totals``). The strategies fill the logs; the run (``fl_app.run.lifecycle``) times them and
writes them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from logging import WARNING
from typing import Any, Callable, Iterable, Mapping

from flwr.app import Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log


def raised(error: BaseException) -> str:
    """The rejection reason of a reply whose decoding or checking raised ``error``: a ValueError's message is the
    reason (decoding raises it for data that disagrees with its metadata); anything else is named with its type."""
    if isinstance(error, ValueError):
        return str(error)
    text = str(error) if len(str(error)) <= 200 else str(error)[:197] + "..."
    return f"checking it raised {type(error).__name__}: {text}"


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
    diagnostics: dict[str, float] = field(default_factory=dict)  # a method's own per-round numbers (extra columns)

    def record_server(self, seconds: float, rss_mb: float, peak_rss_mb: float) -> None:
        """The run's own measures of the round, once the strategy is done with it: its wall time and the server
        process's memory (resident, peak so far)."""
        self.seconds, self.server_rss_mb, self.server_peak_rss_mb = seconds, rss_mb, peak_rss_mb

    def to_dict(self) -> dict:
        return {**asdict(self), "answered": sorted(self.answered)}

    @staticmethod
    def from_dict(saved: dict) -> "RoundLog":
        return RoundLog(**{**saved, "answered": set(saved["answered"])})

    def row(self, server_round: int) -> dict:
        """This round's line of rounds.csv."""
        return {
            "round": server_round,
            "sampled": len(self.sampled),
            "replies": len(self.accepted),
            "failed": len(self.failed),
            "rejected": len(self.rejected),
            "train_loss": self.train_loss,
            "bytes_down": self.bytes_down,
            "bytes_down_unanswered": self.bytes_down_unanswered,
            "bytes_up": self.bytes_up,
            "seconds": self.seconds,
            "client_seconds": self.client_seconds,
            "server_rss_mb": self.server_rss_mb,
            "server_peak_rss_mb": self.server_peak_rss_mb,
            **self.diagnostics,
        }

    def screen(
        self, server_round: int, replies: Iterable[Message], sent: Mapping[int, Message]
    ) -> list[tuple[int, Message]]:
        """(partition id, reply) of the replies without error, in partition order; errors are logged as failures.

        A reply is credited to partition p only when it answers the message ``sent[p]`` of this round
        (``metadata.reply_to_message_id`` is the id the grid gave that message when it pushed it) and comes from the
        node that message was sent to. The one exception is the SuperLink's own error reply for a message it could
        not deliver (a node that died: NODE_UNAVAILABLE), which carries the SuperLink's node id as sender: an error
        from ``SUPERLINK_NODE_ID`` that answers ``sent[p]`` counts as p's failure. Every other reply (one that
        answers a message of another round, a replayed one, one from a node answering another node's message) is
        logged and ignored, as is a second reply for a partition: each partition counts once."""
        partition_of_message = {m.metadata.message_id: p for p, m in sent.items() if m.metadata.message_id}
        partition_of_node = {m.metadata.dst_node_id: p for p, m in sent.items()}
        usable = []
        for reply in replies:
            pid, why_not = self._partition_of(reply, sent, partition_of_message, partition_of_node)
            if pid is None:
                log(
                    WARNING,
                    "round %d: a reply from node %d %s: ignored",
                    server_round,
                    reply.metadata.src_node_id,
                    why_not,
                )
                continue
            if pid in self.answered:
                log(WARNING, "round %d: a second reply for client %d: ignored", server_round, pid)
                continue
            self.answered.add(pid)
            if reply.has_error():
                log(WARNING, "round %d: client %d failed: %s", server_round, pid, reply.error.reason)
                self.failed.append(pid)
                if reply.error.code == ErrorCode.NODE_UNAVAILABLE or reply.metadata.src_node_id == SUPERLINK_NODE_ID:
                    self.unreached.append(pid)
            else:
                usable.append((pid, reply))
        return sorted(usable, key=lambda answer: answer[0])

    @staticmethod
    def _partition_of(
        reply: Message, sent: Mapping[int, Message], partition_of_message: dict, partition_of_node: dict
    ) -> tuple[int | None, str]:
        """(the partition ``reply`` is credited to, or None and why not); see ``screen``."""
        meta = reply.metadata
        if meta.src_node_id == SUPERLINK_NODE_ID and reply.has_error():
            pid = partition_of_message.get(meta.reply_to_message_id)
            return pid, "" if pid is not None else "(the SuperLink's error) answers no message of this round"
        pid = partition_of_node.get(meta.src_node_id)
        if pid is None:
            answered = partition_of_message.get(meta.reply_to_message_id)
            if answered is not None:
                return None, f"answers the message sent to client {answered}, on another node"
            return None, "was sent no message this round"
        if sent[pid].metadata.message_id != meta.reply_to_message_id:
            answered = partition_of_message.get(meta.reply_to_message_id)
            if answered is not None:
                return None, f"(client {pid}'s node) answers the message sent to client {answered}"
            return None, f"(client {pid}'s node) answers no message of this round (another round's, or none)"
        return pid, ""

    def accept(
        self,
        server_round: int,
        replies: Iterable[Message],
        sent: Mapping[int, Message],
        problem_of: Callable[[int, Message], tuple[str | None, Any]],
        what: str = "reply",
    ) -> list[tuple[int, Message, Any]]:
        """(partition id, reply, its decoded form) of the replies ``screen`` credits whose ``problem_of(partition id,
        reply)`` gives (None, decoded form), in partition order; they become ``accepted``. The others are logged with
        their reason and ``rejected``: whatever ``problem_of`` raises is that reply's rejection (``raised``), never
        the end of the round."""
        usable = []
        for pid, reply in self.screen(server_round, replies, sent):
            try:
                problem, decoded = problem_of(pid, reply)
            except Exception as error:  # whatever one reply makes a check raise rejects that reply only
                problem, decoded = raised(error), None
            if problem:
                log(WARNING, "round %d: %s from client %d rejected: %s", server_round, what, pid, problem)
                self.rejected.append(pid)
                continue
            usable.append((pid, reply, decoded))
        self.accepted = [pid for pid, _, _ in usable]
        return usable

    def close(
        self, server_round: int, valid: int, min_reply_fraction: float, sent_bytes: Mapping[int, int] | None = None
    ) -> None:
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
        if not self.sampled:
            raise RuntimeError(f"round {server_round}: no client to sample: no partition has a connected node")
        needed = math.ceil(min_reply_fraction * len(self.sampled))
        if valid < needed:
            raise RuntimeError(
                f"round {server_round}: {valid} valid replies of {len(self.sampled)} sampled "
                f"(min-reply-fraction={min_reply_fraction} needs {needed}); "
                f"failed: {self.failed}, rejected: {self.rejected}"
            )


def round_totals(rounds: Mapping[int, RoundLog]) -> dict:
    """Run totals for summary.json: every failure and rejection counted once, bytes delivered and not."""
    return {
        "bytes_down": sum(r.bytes_down for r in rounds.values()),
        "bytes_down_unanswered": sum(r.bytes_down_unanswered for r in rounds.values()),
        "bytes_up": sum(r.bytes_up for r in rounds.values()),
        "accepted_replies": sum(len(r.accepted) for r in rounds.values()),
        "failed_replies": sum(len(r.failed) for r in rounds.values()),
        "rejected_replies": sum(len(r.rejected) for r in rounds.values()),
        "failed_by_partition": _per_partition(r.failed for r in rounds.values()),
        "rejected_by_partition": _per_partition(r.rejected for r in rounds.values()),
    }


def _per_partition(lists: Iterable[list[int]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pids in lists:
        for pid in pids:
            counts[str(pid)] = counts.get(str(pid), 0) + 1
    return dict(sorted(counts.items(), key=lambda item: int(item[0])))
