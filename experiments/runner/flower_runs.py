"""Run the app with `flwr run` from a script or test, wait for it, and read its real status and results.

The run id is what `flwr run --format json` prints; `flwr log --stream` follows the run to its end; and since
neither says how the run ended (`flwr run --stream` exits 0 even when the run failed), the status comes from
`flwr ls --format json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from fl_app.io.files import open_new_file
from fl_app.run.flwr_status import run_status

APP_DIR = Path(__file__).resolve().parents[2]


def format_run_config(values: dict) -> str:
    """dict -> the `--run-config` string (strings quoted, booleans in TOML spelling)."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = f"'{value}'"
        else:
            text = repr(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class RunnerStopped(BaseException):
    """Raised in a lane's ``flwr_run`` once its runner is stopping (``stop`` set): the lane stops its Flower run as
    Ctrl-C stops a one-lane runner's, and a BaseException, like KeyboardInterrupt, so no ``except Exception`` that
    records a failed run catches it."""


def follow_log(command: list[str], env: dict, handle, timeout: float, stop: threading.Event | None) -> None:
    """Run ``command`` (`flwr log RUN_ID --stream`) with its output in ``handle`` until it ends; raises
    subprocess.TimeoutExpired after ``timeout`` seconds and RunnerStopped once ``stop`` is set (checked every half
    second), the command killed either way."""
    proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if stop is not None and stop.is_set():
                raise RunnerStopped("the runner is stopping")
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(command, timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_run(
    run_config: str,
    federation: str | None,
    env: dict,
    connection: list[str],
    timeout: float = 600,
) -> str:
    """`flwr run --format json` (without --stream: it returns once the SuperLink has accepted the run) -> run id."""
    command = ["flwr", "run", str(APP_DIR), *connection, "--format", "json", "--run-config", run_config]
    if federation is not None:
        command += ["--federation-config", federation]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    try:
        started = json.loads(proc.stdout)
    except ValueError:
        started = {}
    if proc.returncode != 0 or not started.get("success") or not started.get("run-id"):
        raise RuntimeError(f"flwr run did not start a run ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return str(started["run-id"])


def flwr_run(
    run_config: str | dict,
    federation: str | None = "num-supernodes=8 client-resources-num-cpus=1",
    env: dict | None = None,
    timeout: float = 3600,
    log_file: Path | None = None,
    superlink: str | None = None,
    started: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> tuple[str, str]:
    """Start a run, follow its log to the end, and return (run id, final status such as 'finished:completed').

    The run id comes from `flwr run --format json`; the log from `flwr log RUN_ID --stream` (what `flwr run --stream`
    shows), into `log_file` as the run goes when one is given. `superlink` names a SuperLink connection in
    $FLWR_HOME/config.toml (a real deployment, see fl_app/deploy/); None uses the default (local simulation).
    `federation=None` sends no `--federation-config` (a deployment's SuperNodes are real processes, not simulation
    settings). A run whose log is interrupted or times out is stopped in the SuperLink, so nothing keeps writing into
    its output folder. ``started(run_id)`` is called once the SuperLink has accepted the run (a caller records the
    id, so that a later process can stop the run should this one be killed before it could). ``stop``: an event
    another thread sets to have the run stopped the same way (a lane of a stopping runner: ``RunnerStopped``)."""
    if isinstance(run_config, dict):
        run_config = format_run_config(run_config)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", **(env or {})}
    connection = [superlink] if superlink else []
    # the log is created before the run starts: a log that cannot be created safely starts nothing
    log = open_new_file(log_file) if log_file is not None else contextlib.nullcontext(subprocess.DEVNULL)
    with log as handle:
        run_id = start_run(run_config, federation, env, connection, timeout=min(timeout, 600))
        if log_file is not None:  # the log names its run first, as `flwr run --stream` does
            handle.write(f"Successfully started run {run_id}\n".encode())
            handle.flush()
        try:  # streamed into the log as the run goes, so a long run can be followed (tail -f) and a dead one read
            if started is not None:
                started(run_id)
            follow_log(["flwr", "log", run_id, *connection, "--stream"], env, handle, timeout, stop)
        except BaseException:  # timeout, Ctrl-C, SIGTERM, stopping lanes, a failing ``started``: nothing may write on
            command = ["flwr", "stop", run_id, *connection]
            subprocess.run(command, env=env, capture_output=True, timeout=120, check=False)
            raise
    return run_id, settled_status(run_id, env, superlink)


def settled_status(run_id: str, env: dict, superlink: str | None, attempts: int = 30) -> str:
    """The run's final status: ``run_status`` asked once a second until it reads finished (it settles right after
    the log ends), at most ``attempts`` times."""
    status = "unknown"
    for _ in range(attempts):
        status = run_status(run_id, superlink, env, timeout=60)
        if status.startswith("finished"):
            break
        time.sleep(1)
    return status
