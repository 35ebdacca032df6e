"""Shared fixtures."""

from __future__ import annotations

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
