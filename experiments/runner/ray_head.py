"""A Ray head on this machine that several `flwr run`s join, so that each run skips starting and stopping a private
Ray instance (``bench_startup`` timed them at 5.5 s and 4 s; a whole 10-round run measured 1-6 s shorter,
``bench_overhead --shared-ray``: its actors are still new worker processes that import the app).

``with ray_head(num_cpus=1) as head: local_flower_env(RAY_ADDRESS=head.address)``: the local SuperLink started in
that environment, and every simulation it spawns, connects to the head instead of starting its own Ray; the head's
``num_cpus`` then caps how many clients train at once, as ``init-args-num-cpus`` does for a private Ray. A run's
numbers do not depend on which Ray it used (its actors are new processes either way).

The head gets its own temp dir (short: Ray's unix socket paths are limited to 107 bytes) and free ports (Ray's
defaults are fixed ports another head would clash with), and runs in its own session; on exit its process group and
every process under its temp dir are stopped (SIGTERM, then SIGKILL after a grace: its GCS server outlived a SIGTERM
by 16 s here). `ray stop` is never used: it stops every Ray instance on the machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from experiments.runner.flower_env import free_port
from fl_app.run.processes import live_group_members, process_groups, signal_groups

OBJECT_STORE_BYTES = 100_000_000  # a run's messages go through Flower, not Ray's object store
START_TIMEOUT = 180.0


@dataclass(frozen=True)
class RayHead:
    address: str  # host:port, what RAY_ADDRESS takes
    temp_dir: Path  # the head's session folder lives here: session_latest/logs/ holds its workers' logs
    num_cpus: int


def ray_executable() -> str | None:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else shutil.which("ray")


def stop_groups(groups: set[int], grace: float = 5.0) -> None:
    """SIGTERM every group, wait up to ``grace`` seconds, SIGKILL what is left."""
    signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live_group_members(groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_groups(groups, signal.SIGKILL)


def start_ray_node(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Run a `ray start` command in its own session (the node's raylet, agents and every worker it forks stay in that
    process group); raises with the log's tail if it fails. ``env``: the node's environment (default: this
    process's)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        code = proc.wait(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_groups({proc.pid})
        code = None
    if code != 0:
        stop_groups({proc.pid})
        raise RuntimeError(f"`{' '.join(command[:3])}` failed ({code}):\n{log.read_text()[-3000:]}")
    return proc


def node_flags(num_cpus: int, temp_dir: Path) -> list[str]:
    """What every node started here shares: its CPUs, no GPU, a small object store, no usage stats, the cluster's temp
    dir, and a free port for its agent (Ray's default is a fixed port another node would clash with)."""
    return [
        "--num-cpus",
        str(num_cpus),
        "--num-gpus",
        "0",
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        "--disable-usage-stats",
        "--temp-dir",
        str(temp_dir),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]


def head_command(ray: str, port: int, num_cpus: int, temp_dir: Path) -> list[str]:
    return [
        ray,
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--include-dashboard=false",
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-port",
        str(free_port()),
        *node_flags(num_cpus, temp_dir),
    ]


def worker_command(ray: str, address: str, num_cpus: int, temp_dir: Path) -> list[str]:
    """A second node joining the head at ``address``."""
    return [ray, "start", "--address", address, *node_flags(num_cpus, temp_dir)]


@contextmanager
def ray_head(num_cpus: int, env: dict | None = None):
    """A one-node Ray cluster with ``num_cpus`` CPUs for the duration of the block; yields a ``RayHead``. The actors
    of the runs that join it get the head's environment, not the run's: ``env`` adds variables they need (e.g. a log
    level) to this process's."""
    if num_cpus < 1:
        raise ValueError(f"num_cpus={num_cpus}: a Ray head needs at least 1 CPU")
    ray = ray_executable()
    if ray is None:
        raise RuntimeError(
            "the `ray` command is not installed (it comes with `pip install -e .`, through flwr[simulation])"
        )
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: unix socket paths are limited
    port = free_port()
    proc = None
    try:
        command = head_command(ray, port, num_cpus, temp_dir)
        proc = start_ray_node(command, temp_dir / "start.log", {**os.environ, **(env or {})})
        yield RayHead(f"127.0.0.1:{port}", temp_dir, num_cpus)
    finally:
        stop_groups(({proc.pid} if proc else set()) | process_groups((f"{temp_dir}/",)))
        shutil.rmtree(temp_dir, ignore_errors=True)
