"""Stopping a real `flwr run` right after a given round's checkpoint, before the rounds that follow can all end.

`flwr stop` only marks the run as stopped in the SuperLink; the simulation process learns of it from its next
heartbeat, up to half a minute later, and on fast cores the remaining rounds of a small test run end first. So the
simulation is frozen (SIGSTOP) the moment the checkpoint holds the round, stopped with `flwr stop`, and then sent the
SIGINT its own heartbeat would send itself before it is let go (SIGCONT): it exits through Flower's graceful exit.
The ServerApp's thread goes on while the exit handlers run, so the round in flight at the freeze may still end and
save its checkpoint: callers that continue the run read the round to continue after from the checkpoint, not from
the round they stopped at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from experiments.runner import checkpoint_round
from experiments.runner.flower_env import superlink_markers
from fl_app.run.processes import is_gone, marker_patterns, process_table


def saved_round(folder: Path) -> int:
    """The round of ``folder``'s verified checkpoint (0 while there is none)."""
    return checkpoint_round(folder)[0] or 0


def simulation_pids(env: dict) -> list[int]:
    """Live `flwr-simulation` processes of the local SuperLink of ``env`` (their command line names its address)."""
    (pattern,) = marker_patterns(superlink_markers(env)[1:])
    return [
        pid
        for pid, (_, cmd) in process_table().items()
        if "flwr-simulation" in cmd and pattern.search(cmd) and not is_gone(pid)
    ]


def stop_after_checkpoint(
    folder: Path,
    at_round: int,
    env: dict,
    run_id: str,
    timeout: float = 600,
    cancelled: Callable[[], bool] = lambda: False,
) -> int:
    """Stop run ``run_id`` of ``env``'s SuperLink once ``folder``'s checkpoint holds round ``at_round`` or later;
    returns the round of the checkpoint it was stopped at (0 when none came within ``timeout`` seconds, or before
    ``cancelled()``, or the simulation had already ended; the run is stopped all the same)."""
    deadline = time.monotonic() + timeout
    while saved_round(folder) < at_round and time.monotonic() < deadline and not cancelled():
        time.sleep(0.05)
    frozen = simulation_pids(env)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        reached = saved_round(folder) if frozen else 0
        subprocess.run(["flwr", "stop", str(run_id)], env=env, capture_output=True, timeout=120)
    finally:
        for pid in frozen:
            for sig in (signal.SIGINT, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
    return reached
