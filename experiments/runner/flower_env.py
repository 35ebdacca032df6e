"""An isolated local Flower environment for scripts and tests: its own FLWR_HOME and free SuperLink ports, and on exit
the local SuperLink it started (detached, in its own session) and the simulations it spawned are stopped by PID
(found through psutil by the FLWR_HOME and port on their command lines, see ``fl_app.run.processes``).

A script killed with SIGKILL never reaches that exit, and its detached SuperLink goes on with the run: ``in_flight``
records what identifies such a run (run id, FLWR_HOME, ports, the SuperLink's pids with their start times) when it
starts, and ``stop_in_flight`` stops it from a later process."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

import psutil

from fl_app.run.processes import is_gone, process_groups, related_pids, signal_groups, terminate


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


def stop_local_superlink(env: dict, timeout: float = 30.0) -> None:
    """Stop the local SuperLink of ``env`` and everything it started, and wait until they are gone: a run that
    `flwr stop` only marked as stopped can go on in its simulation process and write into a folder a later run
    now owns."""
    markers = superlink_markers(env)
    pids = related_pids((), markers, ("flower-superlink", "flwr-simulation"))
    stop_processes(markers)
    if pids:
        terminate(pids, groups=True, timeout=timeout)


@contextmanager
def local_flower_env(home: Path | None = None, **extra: str):
    """``with local_flower_env() as env: flwr_run(..., env=env)``."""
    with tempfile.TemporaryDirectory(prefix="flwr_home_") as tmp:
        env = isolated_env(home or Path(tmp), **extra)
        try:
            yield env
        finally:
            stop_local_superlink(env)


# -- a run left in flight by a runner that died: recorded when it starts, stopped by whoever comes next -------------
def process_identity(pid: int) -> dict | None:
    """{'pid', 'created'} of a live process: the start time tells it apart from a later process given the same pid."""
    try:
        return {"pid": pid, "created": psutil.Process(pid).create_time()}
    except psutil.Error:
        return None


def is_alive(identity: dict) -> bool:
    """Whether the process ``process_identity`` recorded is still running (not a zombie, not a new one on its pid)."""
    try:
        proc = psutil.Process(int(identity["pid"]))
        return proc.create_time() == identity.get("created") and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def superlink_markers(env: dict) -> tuple[str, str]:
    """What the command lines of a local SuperLink (and of what it spawns) name: its FLWR_HOME and address."""
    return env["FLWR_HOME"], f"127.0.0.1:{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}"


def in_flight(env: dict, run_id: str) -> dict:
    """What a restarted runner needs to stop the run ``run_id`` of the local SuperLink of ``env``: the run id, the
    SuperLink's FLWR_HOME and ports, and the live processes of that SuperLink (pid and start time)."""
    home, address = superlink_markers(env)
    pids = related_pids((), (home, address), ("flower-superlink", "flwr-simulation"))
    return {
        "run_id": str(run_id),
        "flwr_home": home,
        "http_port": env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"],
        "control_port": env["FLWR_LOCAL_CONTROL_API_PORT"],
        "processes": [p for p in map(process_identity, sorted(pids)) if p is not None],
    }


def stop_in_flight(record: dict, timeout: float = 30.0) -> list[int]:
    """Stop the run ``in_flight`` recorded (its SuperLink is no one's once its runner is gone): SIGTERM, then SIGKILL
    after ``timeout`` seconds, the recorded processes still alive and every process that descends from them or names
    their FLWR_HOME (or, while the recorded SuperLink still holds it, their address). Returns the pids still alive
    afterwards (none when all stopped)."""
    live = {int(p["pid"]) for p in record.get("processes", []) if is_alive(p)}
    markers = [record["flwr_home"]] if record.get("flwr_home") else []
    if live and record.get("http_port"):  # the port is still theirs: no other SuperLink can have taken it
        markers.append(f"127.0.0.1:{record['http_port']}")
    pids = related_pids(live, tuple(markers), ("flower-superlink", "flwr-simulation")) if live or markers else set()
    if pids:
        terminate(pids, groups=True, timeout=timeout)
    return sorted(pid for pid in pids if not is_gone(pid))
