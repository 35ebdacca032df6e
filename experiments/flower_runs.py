"""Run the app with `flwr run` from a script or test, wait for it, and read its real status and results.

`flwr run --stream` exits 0 even when the run failed, so the status comes from `flwr ls --format json`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

APP_DIR = Path(__file__).resolve().parents[1]


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


def flwr_run(
    run_config: str | dict,
    federation: str | None = "num-supernodes=8 client-resources-num-cpus=1",
    env: dict | None = None,
    timeout: float = 3600,
    log_file: Path | None = None,
    superlink: str | None = None,
) -> tuple[str, str]:
    """Start a run, stream it to completion, and return (run id, final status such as 'finished:completed').

    `superlink` names a SuperLink connection in $FLWR_HOME/config.toml (a real deployment, see fl_app/deploy.py);
    None uses the default (local simulation). `federation=None` sends no `--federation-config` (a deployment's
    SuperNodes are real processes, not simulation settings)."""
    if isinstance(run_config, dict):
        run_config = format_run_config(run_config)
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", **(env or {})}
    connection = [superlink] if superlink else []
    command = ["flwr", "run", str(APP_DIR), *connection, "--stream", "--run-config", run_config]
    if federation is not None:
        command += ["--federation-config", federation]
    if log_file is None:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        output = proc.stdout + proc.stderr
    else:  # streamed into the log as the run goes, so a long run can be followed (tail -f) and a dead one read
        with open(log_file, "w") as handle:
            try:
                subprocess.run(
                    command, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False
                )
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                # the run goes on in the SuperLink after its CLI is killed or interrupted: stop it, so the next one
                # runs alone and nothing keeps writing into the run's output folder
                started = re.search(r"Successfully started run (\d+)", log_file.read_text(errors="replace"))
                if started:
                    subprocess.run(
                        ["flwr", "stop", started.group(1), *connection],
                        env=env,
                        capture_output=True,
                        timeout=120,
                        check=False,
                    )
                raise
        output = log_file.read_text(errors="replace")
    found = re.search(r"Successfully started run (\d+)", output)
    if not found:
        raise RuntimeError(f"flwr run did not start a run:\n{output[-3000:]}")
    run_id = found.group(1)
    status = "unknown"
    for _ in range(30):  # the status settles right after the stream ends
        listing = subprocess.run(
            ["flwr", "ls", *connection, "--run-id", run_id, "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        status = json.loads(listing.stdout)["runs"][0]["status"]
        if status.startswith("finished"):
            break
        time.sleep(1)
    return run_id, status
