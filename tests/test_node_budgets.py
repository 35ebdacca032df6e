"""A SuperNode's declared budget-macs (node config) must be a finite number from the smallest cached subnet to
10^6 x the whole supernet (above the supernet it runs the supernet whole: tests/test_budgets_beyond_supernet.py);
otherwise the run fails before training, naming the node and the key (a declared budget is fixed for the run: the
γ-allocation splits the training rows by it)."""

from __future__ import annotations

import math

import pytest

from fl_app.client_app import declared_budget
from fl_app.models.supernet_space import count_macs
from fl_app.run.config import validate_run_config
from fl_app.supernet.shared_setup import SupernetSetup
from fl_app.supernet_app import run_supernet

NUM = 4


def _nodes(declared: dict[int, object]) -> dict[int, dict]:
    """What discovery hands the server run: partition id -> the node's answer (node ids 100 + partition id)."""
    nodes = {pid: {"partition-id": pid, "num-partitions": NUM, "node_id": 100 + pid} for pid in range(NUM)}
    for pid, value in declared.items():
        nodes[pid]["budget-macs"] = value
    return nodes


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2e12, -5.0, 0.0, 1e3, "5e6", True, [5e6]])
def test_a_node_declaring_a_budget_outside_the_supernet_fails_the_run_before_training(tmp_path, value):
    run = validate_run_config({"clients-per-round": 2, "output-dir": str(tmp_path / "out")})
    with pytest.raises(
        ValueError, match=r"SuperNode 102 \(partition-id=2\) declared budget-macs=.* in its node-config"
    ):
        run_supernet(None, run, _nodes({2: value}))  # no grid: the refusal comes before any message
    assert not (tmp_path / "out").exists()  # nothing written: the run never started


def test_the_refusal_names_the_allowed_range(cpu_cfg, cpu_cache):
    run = validate_run_config({"clients-per-round": 2})
    setup = SupernetSetup.build(run, NUM)
    supernet = count_macs(setup.cfg, setup.cfg.max_subnet())
    assert setup.budget_range == (cpu_cache.min_macs, 1e12)  # 10^6 x the supernet is beyond MAX_MACS
    with pytest.raises(ValueError) as err:
        setup.client_budgets(run, {1: 2e12}, {p: 100 + p for p in range(NUM)})
    assert f"allowed: a number in [{cpu_cache.min_macs}, 1e+12] MACs (the smallest cached subnet .. 1e+06 x" in str(
        err.value
    )
    assert f"the whole supernet 'cpu' of {supernet} MACs; a budget above the supernet runs" in str(err.value)


def test_budgets_inside_the_range_are_used_as_declared():
    run = validate_run_config({"clients-per-round": 2})
    setup = SupernetSetup.build(run, NUM)
    low, high = setup.budget_range
    budgets = setup.client_budgets(run, {0: low, 1: 5e6, 3: high}, {p: 100 + p for p in range(NUM)})
    assert budgets == {0: float(low), 1: 5e6, 2: float(setup.budgets[2]), 3: float(high)}


def test_budget_max_macs_below_the_smallest_cached_subnet_is_refused():
    with pytest.raises(ValueError, match=r"budget-max-macs=1000 gives a largest budget of 1000 MACs, below the"):
        SupernetSetup.build(validate_run_config({"budget-max-macs": 1e3}), NUM)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0, 1e13, "abc", True])
def test_the_node_refuses_its_own_malformed_budget_naming_the_key(value):
    with pytest.raises(ValueError, match=r"node-config budget-macs=.*: expected a number in \[1, 1e12\]"):
        declared_budget(value)
    assert declared_budget(5e6) == 5e6 and declared_budget(2_000_000) == 2e6
