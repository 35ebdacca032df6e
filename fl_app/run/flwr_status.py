"""A Flower run's status as its SuperLink reports it (``flwr ls --run-id ID --format json``): what a deployment's
``fetch_results`` and the experiments' ``flwr_run`` read to learn how a run ended (its log does not say)."""

from __future__ import annotations

import json
import subprocess


def run_status(run_id: str, connection: str | None = None, env: dict | None = None, timeout: float = 120.0) -> str:
    """The run's status on the connection's SuperLink (``finished:completed``, ``running``, ...); ``connection``
    None: the ``flwr`` CLI's default one."""
    proc = subprocess.run(
        ["flwr", "ls", *([connection] if connection else []), "--run-id", str(run_id), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    try:
        listing = json.loads(proc.stdout[proc.stdout.find("{") :])
        return listing["runs"][0]["status"]
    except (ValueError, KeyError, IndexError):
        raise ValueError(
            f"run {run_id} on connection {connection!r}: flwr ls gave no status ({proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-2000:]}"
        ) from None
