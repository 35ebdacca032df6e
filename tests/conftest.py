"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch

from experiments.runner.flower_env import isolated_env, stop_local_superlink
from experiments.runner.flower_internals import message_identity
from fl_app.models.supernet_space import load_supernet_config
from fl_app.supernet.subnets import SubnetCache
from tests.harness.collection import WHOLE_SUITE_COLLECTED


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects
def pytest_collection_modifyitems(config, items):
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        WHOLE_SUITE_COLLECTED.update(total=len(items), slow=sum(1 for i in items if i.get_closest_marker("slow")))


@pytest.fixture(autouse=True, scope="session")
def _own_decoded_cache(tmp_path_factory):
    """Decoded images go to a folder of this test session (and of the Flower runs it starts), not the user's."""
    import os

    os.environ["FL_APP_CACHE"] = str(tmp_path_factory.mktemp("fl_app_cache"))


@pytest.fixture(autouse=True, scope="session")
def _own_default_flower_home(tmp_path_factory):
    """A `flwr` command that a test (or the code it tests) starts without a Flower home of its own uses this
    session's, on free ports, never the user's ``~/.flwr`` (where it would start a SuperLink that outlives the tests);
    whatever it started there is stopped at the end."""
    import os

    keys = ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")
    previous = {key: os.environ.get(key) for key in keys}
    env = isolated_env(tmp_path_factory.mktemp("default_flwr_home"))
    os.environ.update({key: env[key] for key in keys})
    yield
    stop_local_superlink(env)
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
    """Messages need a task identity, which a Flower runtime normally sets."""
    with message_identity():
        yield


@pytest.fixture(scope="session")
def flwr_env(tmp_path_factory):
    """Environment for `flwr run` with its own FLWR_HOME and free SuperLink ports; at the end the local SuperLink
    and the simulations it spawned are stopped by PID (experiments/runner/flower_env.py)."""
    env = isolated_env(tmp_path_factory.mktemp("flwr_home"))
    yield env
    stop_local_superlink(env)
