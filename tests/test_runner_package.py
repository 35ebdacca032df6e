"""experiments.runner as a package of modules: importing one module loads only what it needs, and every name the
package offers comes from the module that defines it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_importing_flower_env_loads_neither_pandas_nor_the_report():
    check = "import experiments.runner.flower_env, sys; assert 'pandas' not in sys.modules, 'pandas'; "
    check += "assert 'fl_app.report' not in sys.modules, 'fl_app.report'"
    done = subprocess.run(
        [sys.executable, "-c", check], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_every_name_of_the_package_is_its_modules_own():
    import importlib

    import experiments.runner as runner

    for name, module in runner.MODULE_OF.items():
        home = importlib.import_module(f"experiments.runner.{module}")
        assert getattr(runner, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        runner.nothing  # noqa: B018
