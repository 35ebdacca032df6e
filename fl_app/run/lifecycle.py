"""One server run, the same for every method family: ``FederatedRun`` does what all runs do, a ``MethodFamily``
says what its methods do differently (``fl_app.supernet_app.SupernetFamily``, ``fl_app.multiarch_app.MultiArchFamily``).

summary.json, for every method: ``summary_head`` (method, dataset, rounds, seed, completed, error), then
``rounds_done``, ``num_clients``, ``clients_per_round``, the family's own keys (``MethodFamily.summary_fields``), the
round totals (bytes, accepted / failed / rejected replies, per partition too), ``wall_seconds``,
``resumed_after_round`` and the ``run_config``.
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path
from typing import Callable, Protocol

from flwr.app import ArrayRecord
from flwr.common.logger import log

from fl_app.run.checkpoint import load_run_checkpoint, restore_rng, write_run_checkpoint
from fl_app.run.config import RunConfig
from fl_app.run.outputs import (
    ClientRecords,
    memory_mb,
    prepare_output_dir,
    resume_client_records,
    summary_head,
    write_results,
    write_round_files,
)
from fl_app.run.round_log import RoundLog, round_totals


class RunStrategy(Protocol):
    """What a run needs of its family's strategy (``strategies.skeleton.RoundSkeleton`` is one): the round logs it
    fills (``rounds``), the listener it tells what it credited (``credit_listener``), and the loop over rounds that
    calls ``round_done(round)`` after each one."""

    rounds: dict[int, RoundLog]
    credit_listener: Callable | None

    def start(
        self,
        grid,
        initial_arrays: ArrayRecord | None,
        *,
        num_rounds: int,
        timeout: float,
        evaluate_fn,
        first_round: int,
        round_done: Callable[[int], None],
    ): ...


class MethodFamily:
    """What a family of methods adds to a ``FederatedRun``. Built before anything is written (a run config the
    family cannot serve fails there), it holds the ``strategy``, the ``fingerprint`` of its checkpoints and the
    ``client_columns`` clients.csv starts with (column -> partition id -> value)."""

    strategy: RunStrategy
    fingerprint: dict
    client_columns: dict[str, dict]
    evaluate_fn = None  # the server-side evaluation the strategy calls after each round (and before the first)
    checkpoint_last_round = False  # also checkpoint after the last round (a family without a final model file)

    def prepare(self, out_dir: Path) -> None:
        """Set up what needs the output folder, or what is done only once the run is known to go ahead."""

    def restore(self, blob: dict, path: Path) -> None:
        """Continue from the checkpoint content ``blob`` read from ``path``."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the run's start is logged with, after the number of clients."""
        return ""

    def initial_arrays(self) -> ArrayRecord:
        raise NotImplementedError

    def metrics_rows(self) -> list[dict]:
        """metrics.csv's rows so far."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict:
        """The family's part of a round checkpoint (``write_run_checkpoint``'s ``state``)."""
        raise NotImplementedError

    def summary_fields(self) -> dict:
        """The family's own summary.json keys (see the module docstring for the rest)."""
        raise NotImplementedError

    def save_final(self, out_dir: Path, result) -> None:
        """Files of a run that finished every round (``result``: what ``strategy.start`` returned)."""

    def plot(self, out_dir: Path, summary: dict) -> None:
        """The run's figure, also when it failed."""

    def outcome(self, summary: dict) -> str:
        """What the end of a finished run is logged with."""
        return ""


class FederatedRun:
    """A server run from its output folder to its summary, whatever the method.

    Before training: the ``resume-from`` checkpoint is read and checked (content, model, run config, federation
    size), then the output folder is claimed (refused when it holds results), then the family prepares and, on a
    resume, restores its state, the server's RNG states and the clients' statistics. ``execute`` runs the rounds;
    after each one it records the round's wall time and the server's memory in the round's log, rewrites the round
    files (metrics.csv, rounds.csv, clients.csv) and, every ``checkpoint-every`` rounds, writes checkpoint.pt (not
    after the last round unless the family asks: a finished run is not resumed). summary.json is written in a
    ``finally``: a run that fails, or is interrupted, still says how far it got (``completed: false``, the error,
    ``rounds_done``) before the error is raised again."""

    def __init__(self, run: RunConfig, nodes: dict[int, dict], family: MethodFamily):
        self.run, self.family, self.num_clients = run, family, len(nodes)
        location = run["resume-from"]
        resumed = load_run_checkpoint(location, run, self.num_clients, family.fingerprint) if location else None
        self.out_dir = prepare_output_dir(run["output-dir"], run["method"], run["dataset"], run["seed"])
        family.prepare(self.out_dir)
        self.clients = ClientRecords(nodes, **family.client_columns)
        family.strategy.credit_listener = self.clients.credit  # the records see only what the strategy credited
        self.first_round = 1
        if resumed is not None:
            path, blob = resumed
            family.restore(blob, path)
            restore_rng(blob["rng"])
            resume_client_records(self.clients, blob, location)
            self.first_round = blob["round"] + 1
            log(INFO, "Resuming from %s after round %d", location, blob["round"])
        self.rounds_done = self.first_round - 1
        log(
            INFO,
            "%s on %s: %d clients, %s, output %s",
            run["method"],
            run["dataset"],
            self.num_clients,
            family.describe(),
            self.out_dir,
        )

    def execute(self, grid) -> dict:
        """Train every round left; write the results (also when a round fails); return the summary."""
        run, family, error = self.run, self.family, None
        self.started = self.round_started = time.time()
        try:
            result = family.strategy.start(
                grid,
                family.initial_arrays(),
                num_rounds=run["num-server-rounds"],
                timeout=run["round-timeout"],
                evaluate_fn=family.evaluate_fn,
                first_round=self.first_round,
                round_done=self.round_done,
            )
            family.save_final(self.out_dir, result)
        except BaseException as failure:  # an interrupt too: the summary must not say the run completed
            error = f"{type(failure).__name__}: {failure}"
            raise
        finally:
            summary = self.summary(error)
            family.plot(self.out_dir, summary)
            write_results(self.out_dir, summary, family.metrics_rows(), family.strategy.rounds, self.clients)
            log(INFO, "Results written to %s", self.out_dir)
        log(INFO, "Done in %.0fs%s", summary["wall_seconds"], family.outcome(summary))
        return summary

    def round_done(self, server_round: int) -> None:
        """After each round: its time and memory, the round files, the checkpoint when one is due."""
        self.rounds_done = server_round
        log_ = self.family.strategy.rounds[server_round]
        now = time.time()
        log_.record_server(now - self.round_started, *memory_mb())
        self.round_started = now
        log(
            INFO,
            "round %d: %.1fs, server memory %.0f MiB (peak %.0f)",
            server_round,
            log_.seconds,
            log_.server_rss_mb,
            log_.server_peak_rss_mb,
        )
        write_round_files(self.out_dir, self.family.metrics_rows(), self.family.strategy.rounds, self.clients)
        if self.checkpoint_due(server_round):
            path = write_run_checkpoint(
                self.out_dir,
                server_round,
                self.run,
                self.num_clients,
                self.family.fingerprint,
                self.family.checkpoint_state(),
                self.clients.checkpoint_state(),
            )
            log(INFO, "Checkpoint after round %d: %s", server_round, path)

    def checkpoint_due(self, server_round: int) -> bool:
        every = self.run["checkpoint-every"]
        last = server_round >= self.run["num-server-rounds"]
        return bool(every) and server_round % every == 0 and (not last or self.family.checkpoint_last_round)

    def summary(self, error: str | None) -> dict:
        """summary.json (see the module docstring)."""
        return {
            **summary_head(self.run, error),
            "rounds_done": self.rounds_done,
            "num_clients": self.num_clients,
            "clients_per_round": self.run.clients_per_round(self.num_clients),
            **self.family.summary_fields(),
            **round_totals(self.family.strategy.rounds),
            "wall_seconds": round(time.time() - self.started, 1),
            "resumed_after_round": self.first_round - 1,
            "run_config": self.run.to_dict(),
        }
