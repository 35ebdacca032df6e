"""Where a round's time goes: seconds per named phase on the server (dispatch, clients, screening, aggregation,
evaluation, writes) and in a client call (decode, model, data, steps, encode), logged as one DEBUG line per round or
call and read back by the benchmarks (experiments.benchmarks.bench_overhead). Never written to a run's results, so
they stay bit-identical with or without it.

Server: ``dispatch`` builds the round's messages (routing, slicing, encoding), ``clients`` waits for the replies (the
clients' calls and the messages' way there and back), ``screening`` checks and decodes them, ``aggregation`` merges
them, ``evaluation`` scores the model, ``writes`` records the round (result files, checkpoints). Client: ``decode``
reads and checks the instruction, ``model`` builds the model (and the subnet plan), ``data`` loads the partition,
``steps`` trains (with what the method computes before training and, for the model-heterogeneous methods, what it
computes for its upload: prototypes, class means), ``encode`` builds the reply (and, for the model-heterogeneous
methods, saves the node's model)."""

from __future__ import annotations

import re
import time

SERVER_PHASES = ("dispatch", "clients", "screening", "aggregation", "evaluation", "writes")
CLIENT_PHASES = ("decode", "model", "data", "steps", "encode")
LINE = re.compile(r"(server|client) phases: (partition (\d+) )?round (\d+): ((?:[a-z]+=[0-9.]+ ?)+)")


class PhaseTimer:
    """Seconds since the last lap, added to a named phase (a phase may be lapped several times)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def line(self, side: str, server_round: int | str, partition_id: int | None = None) -> str:
        """'SIDE phases: [partition P ]round R: name=seconds ...' (the form ``read_phases`` parses)."""
        who = "" if partition_id is None else f"partition {partition_id} "
        spent = " ".join(f"{name}={seconds:.4f}" for name, seconds in self.seconds.items())
        return f"{side} phases: {who}round {server_round}: {spent}"


def read_phases(log_text: str) -> dict[str, dict[str, float]]:
    """Total seconds per phase over every 'server phases' and every 'client phases' line of a run's log, with
    the number of lines read ('lines'): {"server": {...}, "client": {...}}."""
    totals: dict[str, dict[str, float]] = {"server": {"lines": 0}, "client": {"lines": 0}}
    for found in LINE.finditer(log_text):
        side = totals[found.group(1)]
        side["lines"] += 1
        for pair in found.group(5).split():
            name, seconds = pair.split("=")
            side[name] = side.get(name, 0.0) + float(seconds)
    return totals
