"""An isolated local Flower environment for scripts and tests: its own FLWR_HOME and free SuperLink ports, and on exit
the local SuperLink it started (detached, in its own session) and the simulations it spawned are stopped by PID
(found through psutil by the FLWR_HOME and port on their command lines, see ``fl_app.run.processes``)."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

from fl_app.run.processes import process_groups, signal_groups


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while picking, so none repeats)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def isolated_env(home: Path, **extra: str) -> dict:
    return {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        **extra,
    }


def stop_processes(markers: tuple[str, ...], programs: tuple[str, ...] = ("flower-superlink", "flwr-simulation")):
    """SIGTERM the process groups of running ``programs`` whose command line contains one of ``markers``."""
    signal_groups(process_groups(markers, programs), signal.SIGTERM)


def stop_local_superlink(env: dict) -> None:
    stop_processes((env["FLWR_HOME"], f"127.0.0.1:{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}"))


@contextmanager
def local_flower_env(home: Path | None = None, **extra: str):
    """``with local_flower_env() as env: flwr_run(..., env=env)``."""
    with tempfile.TemporaryDirectory(prefix="flwr_home_") as tmp:
        env = isolated_env(home or Path(tmp), **extra)
        try:
            yield env
        finally:
            stop_local_superlink(env)
