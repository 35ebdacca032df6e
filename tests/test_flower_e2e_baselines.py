"""Each baseline's two-round run end to end. The baselines with client paths of their own (ScaleFL's early exits,
FIARSE's masked training) run through `flwr run`; the five that train a width- or depth-sliced subnet as FEAST's
clients do (whose `flwr run`s are test_flower_e2e.py's) run the same server run and client functions in one process
(``experiments.runner.in_process_grid``), without Flower's fixed start and stop of about 20 s a run. A file of its
own, so that these runs train on one pytest-xdist worker while test_flower_e2e.py's train on the other."""

from __future__ import annotations

import json

import pytest

from experiments.runner.flower_runs import format_run_config
from experiments.runner.in_process_grid import run_in_process
from fl_app.run.config import validate_run_config
from tests.harness.tiny_runs import NUM_SUPERNODES, TINY_VALUES, flwr_run

pytestmark = pytest.mark.slow  # real training and evaluation: minutes; skipped by -m "not slow"
# the tiers scored on 500 of the sample's 4,000 test images (most of a tiny run's time); test_flower_e2e.py keeps them
# all, so that its kill-after-round-1 test stops its run before round 2 ends
BASELINE_VALUES = {**TINY_VALUES, "test-size": 500}


def check_summary(out, method: str) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method and summary["rounds"] == 2
    assert summary["tiers"] and all(0 <= t["accuracy"] <= 1 for t in summary["tiers"])
    assert summary["bytes_down"] > 0 and summary["bytes_up"] > 0 and summary["rejected_replies"] == 0
    if method in ("heterofl", "fedrolex", "scalefl", "fiarse"):
        assert len(summary["tiers"]) == 5  # rates 1/16 .. 1 (ScaleFL, FIARSE: one level per rate's MACs)
    if method == "fedavg-min":
        assert len(summary["tiers"]) == 1


@pytest.mark.parametrize("method", ["fiarse", "scalefl"])
def test_baseline_two_round_simulation_writes_a_valid_summary(flwr_env, tmp_path, method):
    out = tmp_path / method
    _, status = flwr_run(flwr_env, f"{format_run_config(BASELINE_VALUES)} method='{method}' output-dir='{out}'")
    assert status == "finished:completed"
    check_summary(out, method)


@pytest.mark.parametrize("method", ["superfednas", "deepfednas", "heterofl", "fedrolex", "fedavg-min"])
def test_sliced_baseline_two_round_run_in_process_writes_a_valid_summary(tmp_path, method):
    out = tmp_path / method
    run_in_process(validate_run_config({**BASELINE_VALUES, "method": method, "output-dir": str(out)}), NUM_SUPERNODES)
    check_summary(out, method)
