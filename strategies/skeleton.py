"""The one round skeleton every strategy here subclasses: Flower's ``Strategy`` shape (``configure_train`` ->
the grid -> ``aggregate_train``, as ``flwr.serverapp.strategy.FedAvg``), with the steps both families share written
once and the method-specific parts left to a few hooks (see ``RoundSkeleton``)."""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from logging import DEBUG, INFO, WARNING
from typing import Any, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fl_app.run.costs import LocalTraining
from fl_app.run.payload import RecordState, record_bytes
from fl_app.run.phase_times import PhaseTimer
from fl_app.run.records import ARRAYS_RECORD, METRICS_RECORD
from fl_app.run.round_log import RoundLog
from strategies.rounds import LiveNodes, arrays_bytes, sample_partitions
from strategies.screening import RECORDED_METRICS, MetricSpec, metrics_problem, record_problem


class RoundSkeleton(Strategy):
    """A federated round as every strategy here runs it, and the loop over rounds.

    ``configure_train``: sample the partitions with a connected node (seeded, ``sample_partitions``) and build
    each one's TRAIN message from ``train_content``. ``aggregate_train``: credit each reply to the partition it
    answers (``RoundLog.screen``), reject those ``reply_problem`` finds fault with, close the round (silent
    partitions fail; too few valid replies fail the round), ``merge`` the accepted ones and report the round's
    metrics. ``start`` runs the rounds and can continue from ``first_round``.

    Hooks (the supernet family implements them in ``strategies.supernet_base``, the model-heterogeneous one in
    ``strategies.multiarch_base``):
      - ``begin_round``: what this round's messages are cut from (optional);
      - ``train_content``: the records sent to one partition (its arrays under ``ARRAYS_RECORD``);
      - ``metric_specs``, ``reply_shapes``: what a reply's metrics and arrays must be, checked before anything is
        decoded; ``decoded_problem``: what is wrong with the decoded arrays (``decode`` reads them);
      - ``merge``: fold the accepted replies into the global state; the ArrayRecord it returns replaces the model
        the loop hands to the next round (None: the method keeps no model the loop carries).
    """

    upload_record = ARRAYS_RECORD  # the record a reply's arrays travel in
    reply_records: frozenset[str] | None = None  # the only records a reply may hold (None: other records ignored)

    def __init__(
        self,
        node_of_partition: dict[int, int],
        num_partitions: int,
        *,
        clients_per_round: int,
        seed: int,
        payload_dtype: str = "float32",
        min_reply_fraction: float = 1.0,
        lr_of_round=None,
        local_training: LocalTraining | None = None,
    ):
        self.node_of_partition = node_of_partition
        # the run's local-training shape: bounds a reply's step count, and costs what was routed (None: unknown)
        self.local_training = local_training
        # told (round, sampled partitions, [(partition id, what to record of its credited reply)]) after screening
        self.credit_listener = None
        # in a deployment nodes leave, join and rejoin: sampling (and evaluation) follow the connected ones
        self.nodes = LiveNodes(node_of_partition, num_partitions=num_partitions)
        self.clients_per_round, self.seed = clients_per_round, seed
        self.payload_dtype, self.min_reply_fraction = payload_dtype, min_reply_fraction
        self.lr_of_round = lr_of_round or (lambda r: 0.0)
        self.rounds: dict[int, RoundLog] = {}
        self._sent: dict[int, Message] = {}  # partition id -> this round's message (the grid sets its id on push)
        self._sent_bytes: dict[int, int] = {}  # partition id -> payload bytes of that message
        self.round_timer = PhaseTimer()  # seconds per phase of this round (logged: fl_app.run.phase_times)

    # -- hooks ---------------------------------------------------------------------------------------------------
    def begin_round(self, server_round: int, arrays: ArrayRecord) -> None:
        """Prepare what this round's messages are built from; ``arrays`` is the model the loop carries."""

    @abstractmethod
    def train_content(self, partition_id: int, server_round: int, config: ConfigRecord) -> RecordDict:
        """The records of ``partition_id``'s TRAIN message; ``config`` is the run's train config."""

    @abstractmethod
    def metric_specs(self, partition_id: int) -> dict[str, MetricSpec]:
        """What each metric of ``partition_id``'s reply must be (``screening.metrics_problem``)."""

    @abstractmethod
    def reply_shapes(self, partition_id: int) -> dict[str, tuple]:
        """Key -> shape of exactly the arrays ``partition_id``'s reply must hold."""

    def decode(self, record: ArrayRecord) -> Any:
        """A reply's arrays, once their metadata passed: a lazy name -> float32 view (one tensor decoded at a time)."""
        return RecordState(record, self.payload_dtype)

    def decoded_problem(self, server_round: int, partition_id: int, decoded: Any) -> str | None:
        """What is wrong with a reply's decoded arrays (None: nothing)."""
        return None

    @abstractmethod
    def merge(self, server_round: int, accepted: list[tuple[int, Any, MetricRecord]]) -> ArrayRecord | None:
        """Fold the accepted (partition id, decoded arrays, metrics) into the global state."""

    def routed_macs(self, partition_id: int) -> tuple[float, float] | None:
        """(forward MACs of one local step, MACs of the largest model trained) of what ``partition_id`` was told to
        train this round (None: the strategy cannot say)."""
        return None

    def max_local_steps(self, partition_size: int | None) -> int | None:
        """The most local steps a client holding ``partition_size`` samples may report (None: unknown)."""
        if self.local_training is None or partition_size is None:
            return None
        return self.local_training.steps(partition_size)

    def routed_work(self, partition_id: int, metrics: MetricRecord) -> dict:
        """What a credited reply's training cost, computed here from what was routed to it (``routed_macs``) and its
        screened step count: ``train-flops`` and ``trained-macs`` (empty when the strategy cannot say)."""
        macs = self.routed_macs(partition_id)
        if macs is None or self.local_training is None:
            return {}
        step_macs, trained_macs = macs
        steps = metrics.get("local-steps", 0)
        return {"train-flops": self.local_training.flops(step_macs, steps), "trained-macs": float(trained_macs)}

    def credited(self, partition_id: int, metrics: MetricRecord) -> dict:
        """What a record keeps of a credited reply: its screened ``RECORDED_METRICS`` and the server's
        ``routed_work``; nothing else the client claims."""
        kept = {key: metrics[key] for key in RECORDED_METRICS if key in metrics}
        try:
            work = self.routed_work(partition_id, metrics)
        except Exception as error:  # costing what was routed never ends a round: the reply is recorded without it
            log(WARNING, "client %d: the cost of what it was routed is unknown (%s); not recorded", partition_id, error)
            work = {}
        return {**kept, **work}

    def round_train_loss(self, losses: list[float]) -> float:
        """The round's train loss from the accepted replies' (NaN where a reply reported none): the mean of those
        reported."""
        return float(np.nanmean(losses)) if np.isfinite(losses).any() else math.nan

    def prepare_rounds(self, timeout: float) -> None:
        """What a strategy sets up from the round timeout before its first round."""

    # -- training rounds -----------------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.begin_round(server_round, arrays)
        log_ = self.rounds.setdefault(server_round, RoundLog())
        live = self.nodes.partitions(grid, server_round)
        log_.sampled = sample_partitions(live, self.clients_per_round, self.seed, server_round)
        self._sent, self._sent_bytes = {}, {}
        for pid in log_.sampled:
            content = self.train_content(pid, server_round, config)
            self._sent_bytes[pid] = record_bytes(content.array_records[ARRAYS_RECORD])
            log_.bytes_down += self._sent_bytes[pid]
            self._sent[pid] = Message(content, message_type=MessageType.TRAIN, dst_node_id=self.node_of_partition[pid])
        return list(self._sent.values())

    def reply_problem(self, server_round: int, partition_id: int, reply: Message) -> tuple[str | None, Any]:
        """(why the reply cannot be merged or None, its decoded arrays). Checks in order of cost, as
        ``strategies.screening`` lays out: the records, the metrics, the arrays' metadata against exactly what
        ``reply_shapes`` allows (nothing decoded yet), then the decoded arrays (``decoded_problem``). Decoding reads
        only what the screened metadata allows (``payload.array_values``); anything this raises is the reply's
        rejection (``RoundLog.accept``), never the end of the round."""
        if partition_id not in self._sent:
            return "not sampled this round", None
        content = reply.content
        if self.reply_records is not None:
            unknown = sorted(set(content.keys()) - self.reply_records)
            if unknown:
                return f"unknown records {unknown[:3]} in the reply", None
        record = content.array_records.get(self.upload_record)
        if record is None:
            return f"no {self.upload_record}", None
        metrics = content.metric_records.get(METRICS_RECORD, MetricRecord())
        problem = metrics_problem(metrics, self.metric_specs(partition_id)) or record_problem(
            record, self.reply_shapes(partition_id), self.payload_dtype
        )
        if problem:
            return problem, None
        decoded = self.decode(record)
        return self.decoded_problem(server_round, partition_id, decoded), decoded

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord]:
        log_ = self.rounds.setdefault(server_round, RoundLog())
        replies = list(replies)
        log_.bytes_up += sum(arrays_bytes(reply, self.upload_record) for reply in replies)  # arrived, credited or not
        accepted = []
        for pid, reply, decoded in log_.accept(
            server_round, replies, self._sent, lambda pid, reply: self.reply_problem(server_round, pid, reply)
        ):
            metrics = reply.content.metric_records.get(METRICS_RECORD, MetricRecord())
            accepted.append((pid, decoded, metrics))
            log_.client_seconds += float(metrics.get("client-seconds", 0.0))
        self.round_timer.lap("screening")
        if self.credit_listener is not None:  # records keep only what was credited, keyed by partition
            self.credit_listener(
                server_round, list(log_.sampled), [(pid, self.credited(pid, metrics)) for pid, _, metrics in accepted]
            )
        log_.close(server_round, len(accepted), self.min_reply_fraction, self._sent_bytes)
        arrays = self.merge(server_round, accepted)
        self.round_timer.lap("aggregation")
        log_.train_loss = self.round_train_loss([float(m.get("train-loss", math.nan)) for _, _, m in accepted])
        self._sent, self._sent_bytes = {}, {}
        return arrays, MetricRecord(
            {
                "train-loss": log_.train_loss,
                "replies": len(accepted),
                "failed": len(log_.failed),
                "rejected": len(log_.rejected),
                "bytes-down": log_.bytes_down,
                "bytes-up": log_.bytes_up,
            }
        )

    # -- evaluation: none on the clients unless a family configures it ------------------------------------------
    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        """What a resumed run needs besides the global model (plain containers only)."""
        return {"rounds": {r: log_.to_dict() for r, log_ in self.rounds.items()}}

    def restore_state(self, saved: dict) -> None:
        self.rounds = {int(r): RoundLog.from_dict(log_) for r, log_ in saved["rounds"].items()}

    # -- the loop over rounds ------------------------------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn=None,
        *,
        first_round: int = 1,
        round_done=None,
    ) -> Result:
        """Flower's round loop, continuing from ``first_round`` with ``initial_arrays`` as the model after round
        ``first_round - 1``. Each round trains (``configure_train``, the grid, ``aggregate_train``), evaluates on the
        clients when the strategy configures that, centrally when ``evaluate_fn(round, arrays)`` is given (also
        before round 1), then calls ``round_done(round)`` (results written as the run goes, checkpoints)."""
        log(INFO, "Starting %s at round %d of %d", type(self).__name__, first_round, num_rounds)
        self.prepare_rounds(timeout)
        self.summary()
        train_config, evaluate_config = train_config or ConfigRecord(), evaluate_config or ConfigRecord()
        result, arrays, started = Result(), initial_arrays, time.time()
        if evaluate_fn and first_round == 1:
            evaluate_fn(0, arrays)
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            self.round_timer = timer = PhaseTimer()
            messages = self.configure_train(server_round, arrays, train_config, grid)
            timer.lap("dispatch")
            replies = grid.send_and_receive(messages, timeout=timeout)
            timer.lap("clients")  # the clients' work and the messages' way there and back
            aggregated, metrics = self.aggregate_train(server_round, replies)  # laps screening and aggregation
            if aggregated is not None:
                arrays = result.arrays = aggregated
            result.train_metrics_clientapp[server_round] = metrics
            log(INFO, "\t└──> %s", metrics)
            messages = self.configure_evaluate(server_round, arrays, evaluate_config, grid)
            if messages:
                evaluated = self.aggregate_evaluate(server_round, grid.send_and_receive(messages, timeout=timeout))
                result.evaluate_metrics_clientapp[server_round] = evaluated
                log(INFO, "\t└──> evaluation: %s", evaluated)
            if evaluate_fn:
                evaluated = evaluate_fn(server_round, arrays)
                if evaluated is not None:
                    log(INFO, "\t└──> evaluation: %s", evaluated)
                    result.evaluate_metrics_serverapp[server_round] = evaluated
            timer.lap("evaluation")
            if round_done:
                round_done(server_round)
            timer.lap("writes")
            log(DEBUG, timer.line("server", server_round))
        log(INFO, "Strategy finished rounds %d-%d in %.1fs", first_round, num_rounds, time.time() - started)
        return result
