"""FedTopo through a real `flwr run` (local SuperLink, Ray simulation): the one end-to-end check of the wiring.

Uses the session's local SuperLink (`flwr_env` fixture: own FLWR_HOME and ports, stopped by PID).
"""

from __future__ import annotations

import json

from experiments.flower_runs import flwr_run


TINY = ("method='fedtopo' num-server-rounds=2 clients-per-round=2 max-local-steps=2 batch-size=16 eval-every=1 "
        "proto-max-samples=64 test-fraction=0.05")
FEDERATION = "num-supernodes=3 client-resources-num-cpus=1"


def test_fedtopo_flwr_run_writes_a_summary(flwr_env, tmp_path):
    out = tmp_path / "fedtopo"
    _, status = flwr_run(f"{TINY} output-dir='{out}'", FEDERATION, env=flwr_env, timeout=600)
    assert status == "finished:completed"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "fedtopo" and summary["num_clients"] == 3
    assert 0 <= summary["mean_client_accuracy"] <= 1 and 0 <= summary["pooled_accuracy"] <= 1
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0
    assert [h["round"] for h in summary["history"]] == [1, 2]
    assert (out / "metrics.csv").exists() and (out / "accuracy_per_round.png").exists()
