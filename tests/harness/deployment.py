"""Start and stop the processes of a local deployment for a test: a SuperLink and SuperNodes (command lines from
fl_app.deploy.commands), each in its own session with its log in a private file, and everything they spawned stopped
by process id at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from fl_app.deploy.commands import DEFAULT_SUPERLINK_PORT, superlink_command, supernode_command
from fl_app.deploy.credentials import PRIVATE
from fl_app.deploy.files import make_private_dir
from fl_app.run.processes import related_pids, terminate

LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def flower_env(flwr_home: str | Path | None = None, base: dict | None = None) -> dict:
    """Environment for Flower processes: FLWR_HOME (apps, config.toml) and no runtime dependency installation."""
    env = {**(os.environ if base is None else base), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    if flwr_home is not None:
        env["FLWR_HOME"] = str(Path(flwr_home).resolve())
    return env


def start_process(
    command: list[str], log_file: str | Path, env: dict | None = None, cwd: str | Path | None = None
) -> subprocess.Popen:
    """Start a Flower process in its own session (stop it with `stop_processes`), output appended to `log_file`
    (created 0600 in a folder created 0700; a symlink at its name is refused, not followed)."""
    log_file = Path(log_file)
    make_private_dir(log_file.parent)
    fd = os.open(log_file, LOG_FLAGS, PRIVATE)
    with os.fdopen(fd, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


def start_superlink(
    state_dir: str | Path,
    certs_dir: str | Path | None = None,
    port: int = DEFAULT_SUPERLINK_PORT,
    host: str = "127.0.0.1",
    env: dict | None = None,
    insecure: bool = False,
    allow_remote_insecure: bool = False,
    in_memory: bool = True,
) -> subprocess.Popen:
    """Start the SuperLink (log in `state_dir`/superlink.log) and return its Popen.

    Its state is in memory unless told otherwise: with two test workers on two cores, a write to the state file was
    seen waiting past Flower's 5 s SQLite busy timeout ("database is locked"), which the SuperLink answers with a
    500 that ends the ServerApp; no test restarts a SuperLink, so none needs the file."""
    command = superlink_command(state_dir, certs_dir, port, host, insecure, allow_remote_insecure, in_memory)
    state_dir = make_private_dir(state_dir)
    return start_process(command, state_dir / "superlink.log", env=env, cwd=state_dir)


def wait_for_port(host: str, port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts TCP connections on host:port; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before opening port {port}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f} s")


def start_supernode(
    log_file: str | Path,
    superlink: str,
    partition_id: int,
    num_partitions: int,
    port: int,
    root_certificates: str | Path | None = None,
    private_key: str | Path | None = None,
    budget_macs: float | None = None,
    env: dict | None = None,
    insecure: bool = False,
    max_retries: int | None = None,
    allow_remote_insecure: bool = False,
) -> subprocess.Popen:
    """Start one SuperNode (see `supernode_command`) and return its Popen."""
    command = supernode_command(
        superlink,
        partition_id,
        num_partitions,
        port,
        root_certificates,
        private_key,
        budget_macs,
        insecure,
        max_retries,
        allow_remote_insecure,
    )
    return start_process(command, log_file, env=env, cwd=Path(log_file).parent)


# ---------------------------------------------------------------------------------------------------------------
# Stopping everything
# ---------------------------------------------------------------------------------------------------------------
def stop_processes(procs: list[subprocess.Popen], markers: tuple[str, ...] = (), timeout: float = 15.0) -> None:
    """Stop `procs`, everything they spawned (Flower detaches SuperExec, ServerApp and ClientApp processes into
    their own sessions) and Flower processes whose command line names one of `markers` (e.g. "127.0.0.1:9093":
    catches ones already orphaned). Order: the spawned processes, then `procs` in reverse start order (SuperNodes
    sign off while their SuperLink still runs: one killed hard stays "online" on the SuperLink for up to two
    heartbeat intervals, ~60 s, and is refused if restarted in that time), then whatever still names a marker.
    SIGTERM to each process and its group, SIGKILL after `timeout`; never this process or its group."""

    def reap() -> None:
        for p in procs:
            p.poll()

    roots = [p.pid for p in procs if p.poll() is None]
    terminate(related_pids(roots, markers) - set(roots), groups=False, timeout=min(timeout, 5.0), reap=reap)
    for p in reversed(procs):
        if p.poll() is None:
            terminate(related_pids([p.pid]) | {p.pid}, groups=True, timeout=timeout, reap=reap)
    if markers:
        terminate(related_pids([], markers), groups=True, timeout=timeout, reap=reap)
    for p in procs:
        try:
            p.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
