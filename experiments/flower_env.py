"""An isolated local Flower environment for scripts and tests: its own FLWR_HOME and free SuperLink ports, and on exit
the local SuperLink it started (detached, in its own session) and the simulations it spawned are stopped by PID."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path


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


def process_groups(markers: tuple[str, ...], programs: tuple[str, ...] = ()) -> set[int]:
    """Process groups (never this process's own) of running processes whose command line contains one of
    ``markers`` and, when ``programs`` are given, one of them."""
    groups = set()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(m in cmdline for m in markers) and (not programs or any(p in cmdline for p in programs)):
                groups.add(os.getpgid(int(pid_dir.name)))
        except (OSError, ProcessLookupError):
            continue
    return groups - {os.getpgrp()}


def stop_processes(markers: tuple[str, ...], programs: tuple[str, ...] = ("flower-superlink", "flwr-simulation")):
    """SIGTERM the process groups of running ``programs`` whose command line contains one of ``markers``."""
    for group in process_groups(markers, programs):
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass


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
