"""Simulation on an existing Ray cluster: a Ray head started here (own temp dir, free ports), a local SuperLink
started with RAY_ADDRESS pointing at it (own FLWR_HOME, free ports), one tiny FEAST run.

The proof that the clients ran on that cluster: the Ray workers hosting the ClientApp actors write their logs into
the head's temp dir (`session_latest/logs/worker-*.out` starting with `:actor_name:ClientAppActor`), and the
simulation's Ray driver log appears there too. Without RAY_ADDRESS the simulation starts a private Ray instance
under /tmp/ray and nothing appears in the head's temp dir.

Everything started here is stopped by process group at the end: the SuperLink and its simulations as for every
`flwr run` test (experiments/runner/flower_env.py), and the Ray nodes (experiments/runner/ray_head.py: `ray start`
runs in its own session; its daemons and workers stay in that group; never `ray stop`, which would stop every Ray
instance on the machine).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from experiments.runner.flower_env import free_port, isolated_env, stop_local_superlink
from experiments.runner.flower_runs import flwr_run
from experiments.runner.ray_head import (
    head_command,
    ray_executable,
    ray_head,
    start_ray_node,
    stop_groups,
    worker_command,
)
from fl_app.run.processes import process_groups, process_table

pytestmark = pytest.mark.slow  # real Flower processes: minutes; skipped by -m "not slow"
RUN_CONFIG = (
    "num-server-rounds=1 clients-per-round=2 max-local-steps=2 batch-size=16 eval-every=1 val-size=64 test-size=500 "
    "calib-size=64 checkpoint-every=0"
)
FEDERATION = "num-supernodes=2 client-resources-num-cpus=1"


@pytest.fixture
def own_ray_head():
    """A one-node Ray cluster on this machine started for this test (experiments/runner/ray_head.py)."""
    if ray_executable() is None:
        pytest.skip("the `ray` command is not installed")
    started = time.monotonic()
    with ray_head(2) as head:
        print(f"\nray head {head.address} started in {time.monotonic() - started:.1f} s, temp dir {head.temp_dir}")
        yield head


@pytest.fixture
def cluster_flwr_env(own_ray_head, tmp_path):
    """Like conftest's `flwr_env`, plus RAY_ADDRESS: the local SuperLink that `flwr run` starts in this fresh
    FLWR_HOME (on its own ports), and every simulation it spawns, joins the Ray head instead of starting a private
    Ray instance."""
    home = tmp_path / "flwr_home"
    home.mkdir()
    env = isolated_env(home, RAY_ADDRESS=own_ray_head.address)
    try:
        yield env
    finally:
        stop_local_superlink(env)


def _client_actor_logs(ray_temp_dir: Path) -> list[Path]:
    """Stdout logs of the Ray workers that hosted a ClientApp actor (first lines `:job_id:...`,
    `:actor_name:ClientAppActor`)."""
    found = []
    for path in sorted((ray_temp_dir / "session_latest" / "logs").glob("worker-*.out")):
        try:
            if ":actor_name:ClientAppActor" in path.read_text(errors="replace")[:1000]:
                found.append(path)
        except OSError:
            continue
    return found


def test_simulation_runs_on_an_existing_ray_cluster(own_ray_head, cluster_flwr_env, tmp_path):
    started = time.monotonic()
    ray_temp_dir = own_ray_head.temp_dir
    logs = ray_temp_dir / "session_latest" / "logs"
    assert logs.is_dir()
    assert not _client_actor_logs(ray_temp_dir)  # nothing has run on the cluster yet
    assert not list(logs.glob("python-core-driver-*.log"))

    out = tmp_path / "out"
    run_id, status = flwr_run(
        f"{RUN_CONFIG} output-dir='{out}'",
        FEDERATION,
        env=cluster_flwr_env,
        timeout=600,
        log_file=tmp_path / "flwr_run.log",
    )
    run_seconds = time.monotonic() - started
    assert status == "finished:completed", (tmp_path / "flwr_run.log").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1

    # the simulation's Ray driver connected to this head, and the ClientApp actors lived in its workers
    deadline = time.monotonic() + 30  # worker logs are written when an actor starts; allow for slow flushing
    while not _client_actor_logs(ray_temp_dir) and time.monotonic() < deadline:
        time.sleep(1)
    actors = _client_actor_logs(ray_temp_dir)
    drivers = list(logs.glob("python-core-driver-*.log"))
    assert drivers, f"no Ray driver connected to the head: {sorted(p.name for p in logs.iterdir())}"
    assert actors, f"no ClientAppActor ran on the head: {sorted(p.name for p in logs.iterdir())}"
    print(
        f"run {run_id}: {status}; {len(actors)} ClientAppActor worker(s) and {len(drivers)} driver(s) on the "
        f"cluster; flwr run took {run_seconds:.1f} s"
    )


# -- two Ray nodes on this machine ------------------------------------------------------------------------------------
@pytest.fixture
def two_node_cluster(tmp_path_factory):
    """A Ray head and a worker node (a second raylet) on this machine, one CPU each; yields (address, head process
    group, worker process group)."""
    ray = ray_executable()
    if ray is None:
        pytest.skip("the `ray` command is not installed")
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: unix socket paths are limited
    port = free_port()
    logs = tmp_path_factory.getbasetemp()
    procs = []
    try:
        procs.append(start_ray_node(head_command(ray, port, 1, temp_dir), logs / "ray-head.log"))
        procs.append(start_ray_node(worker_command(ray, f"127.0.0.1:{port}", 1, temp_dir), logs / "ray-worker.log"))
        yield f"127.0.0.1:{port}", procs[0].pid, procs[1].pid
    finally:
        stop_groups({p.pid for p in procs} | process_groups((f"{temp_dir}/",)))
        shutil.rmtree(temp_dir, ignore_errors=True)


def _client_actor_groups() -> dict[int, int]:
    """pid -> process group of every running Ray worker that hosts a ClientApp actor (Ray renames the process
    `ray::ClientAppActor...`); the group says which node's raylet forked it."""
    found = {}
    for pid, (_, cmdline) in process_table().items():
        if cmdline.startswith("ray::ClientAppActor"):
            try:
                found[pid] = os.getpgid(pid)
            except ProcessLookupError:
                continue
    return found


def test_clients_run_on_two_ray_nodes_and_survive_losing_one(two_node_cluster, tmp_path):
    """ClientApp actors run on both nodes; the worker node is killed (SIGKILL to its raylet, agents and workers)
    after round 2, and the run still completes on the head, the lost clients counted as failures."""
    address, head_group, worker_group = two_node_cluster
    env = isolated_env(tmp_path / "flwr_home", RAY_ADDRESS=address)
    (tmp_path / "flwr_home").mkdir()
    out = tmp_path / "out"
    rounds = 6
    seen: dict[int, int] = {}
    killed_after: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.update(_client_actor_groups())
            done = (out / "rounds.csv").read_text().count("\n") - 1 if (out / "rounds.csv").exists() else 0
            if not killed_after and done >= 2 and worker_group in seen.values():
                os.killpg(worker_group, signal.SIGKILL)
                killed_after.append(done)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run_config = (
            f"num-server-rounds={rounds} clients-per-round=2 max-local-steps=2 batch-size=16 "
            f"eval-every={rounds} val-size=64 test-size=500 calib-size=64 checkpoint-every=0 min-reply-fraction=0.5 "
            f"output-dir='{out}'"
        )
        _, status = flwr_run(
            run_config,
            "num-supernodes=4 client-resources-num-cpus=1",
            env=env,
            timeout=900,
            log_file=tmp_path / "flwr_run.log",
        )
    finally:
        stop.set()
        watcher.join()
        stop_local_superlink(env)
    groups = set(seen.values())
    assert head_group in groups and worker_group in groups, (
        f"actor groups {groups}, head {head_group}, worker {worker_group}"
    )
    assert killed_after, "the worker node was never killed (its actor was not seen by round 2)"
    assert status == "finished:completed", (tmp_path / "flwr_run.log").read_text()[-3000:]
    with open(out / "rounds.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == rounds
    after = rows[killed_after[0] :]
    assert sum(int(r["failed"]) for r in after) >= 1  # the dead node's actor cost at least one client
    assert all(int(r["replies"]) >= 1 for r in after)  # and every later round still trained on the head
