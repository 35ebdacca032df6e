"""Each baseline's two-round run end to end through `flwr run` (a file of its own, so that these seven runs train on
one pytest-xdist worker while test_flower_e2e.py's FEAST runs train on the other)."""

from __future__ import annotations

import json

import pytest

from tests.harness.tiny_runs import TINY, flwr_run

pytestmark = pytest.mark.slow  # real Flower processes: minutes; skipped by -m "not slow"


@pytest.mark.parametrize(
    "method", ["superfednas", "deepfednas", "heterofl", "fedrolex", "fedavg-min", "fiarse", "scalefl"]
)
def test_baseline_two_round_simulation_writes_a_valid_summary(flwr_env, tmp_path, method):
    out = tmp_path / method
    _, status = flwr_run(flwr_env, f"{TINY} method='{method}' output-dir='{out}'")
    assert status == "finished:completed"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method and summary["rounds"] == 2
    assert summary["tiers"] and all(0 <= t["accuracy"] <= 1 for t in summary["tiers"])
    assert summary["bytes_down"] > 0 and summary["bytes_up"] > 0 and summary["rejected_replies"] == 0
    if method in ("heterofl", "fedrolex", "scalefl", "fiarse"):
        assert len(summary["tiers"]) == 5  # rates 1/16 .. 1 (ScaleFL, FIARSE: one level per rate's MACs)
    if method == "fedavg-min":
        assert len(summary["tiers"]) == 1
