"""Shared fixtures."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest
import torch

from fl_app.subnets import SubnetCache
from fl_app.supernet import load_supernet_config


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # 2-core machines: keep tests from oversubscribing


@pytest.fixture
def cpu_cfg():
    return load_supernet_config("cpu")


@pytest.fixture
def cpu_cache(cpu_cfg):
    return SubnetCache.load(cpu_cfg, "cpu")


@pytest.fixture
def flower_ids():
    """Messages need a task identity, which a Flower runtime normally sets (internal API)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    yield TaskIdentity
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def flwr_env(tmp_path_factory):
    """Environment for `flwr run` with its own FLWR_HOME and free SuperLink ports; at the end the local SuperLink
    (detached in its own session) and the simulations it spawned (another process group) are stopped by PID."""
    home = tmp_path_factory.mktemp("flwr_home")
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port())}
    yield env
    markers = (str(home), f"127.0.0.1:{env['FLWR_LOCAL_SUPERLINK_HTTP_API_PORT']}")
    groups = set()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if any(m in cmdline for m in markers) and ("flower-superlink" in cmdline or "flwr-simulation" in cmdline):
                groups.add(os.getpgid(int(pid_dir.name)))
        except (OSError, ProcessLookupError):
            continue
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
