"""FedTopo through a real `flwr run` (local SuperLink, Ray simulation): the one end-to-end check of the wiring, and
the check that the in-process driver (``run_in_process``, used by experiments) gives the same results as `flwr run`.

Uses the session's local SuperLink (`flwr_env` fixture: own FLWR_HOME and ports, stopped by PID). One real run per
module, shared by the tests.
"""

from __future__ import annotations

import json

import pytest
import torch

from experiments.runner.flower_runs import flwr_run
from experiments.runner.in_process_grid import run_in_process
from fl_app.run.checkpoint import load_verified
from fl_app.run.config import validate_run_config

pytestmark = pytest.mark.slow  # real Flower processes: minutes; skipped by -m "not slow"
NUM_SUPERNODES = 3
TINY = {
    "method": "fedtopo",
    "num-server-rounds": 2,
    "clients-per-round": 2,
    "max-local-steps": 2,
    "batch-size": 16,
    "eval-every": 1,
    "proto-max-samples": 64,
    "test-fraction": 0.05,
}
FEDERATION = f"num-supernodes={NUM_SUPERNODES} client-resources-num-cpus=1"
# depends on the machine, not on the run; every other key of the summary must agree
RUN_SPECIFIC = ("wall_seconds", "run_config")


@pytest.fixture(scope="module")
def flwr_summary(flwr_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("flwr") / "fedtopo"
    _, status = flwr_run({**TINY, "output-dir": str(out)}, FEDERATION, env=flwr_env, timeout=600)
    assert status == "finished:completed"
    return out, json.loads((out / "summary.json").read_text())


def test_fedtopo_flwr_run_writes_a_summary(flwr_summary):
    out, summary = flwr_summary
    assert summary["method"] == "fedtopo" and summary["num_clients"] == NUM_SUPERNODES
    assert 0 <= summary["mean_client_accuracy"] <= 1 and 0 <= summary["pooled_accuracy"] <= 1
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0
    assert [h["round"] for h in summary["history"]] == [1, 2]
    assert (out / "metrics.csv").exists() and (out / "accuracy_per_round.png").exists()


def test_in_process_run_equals_flwr_run(flwr_summary, tmp_path):
    """Same config, seed and number of clients: the in-process driver reproduces the `flwr run` bit for bit (every
    round's losses, accuracies and bytes, and every client's trained weights), so experiments may use it instead of
    `flwr run`. Both train each client on one thread (the Ray actor gets OMP_NUM_THREADS=1 from its one CPU)."""
    real_out, real = flwr_summary
    out = tmp_path / "fedtopo"
    local = run_in_process(validate_run_config({**TINY, "output-dir": str(out)}), NUM_SUPERNODES)
    # pyproject's defaults (what `flwr run` starts from) and the registry's (validate_run_config) are the same config
    assert {k: v for k, v in real["run_config"].items() if k != "output-dir"} == {
        k: v for k, v in local["run_config"].items() if k != "output-dir"
    }
    assert real["history"] == local["history"]
    assert {k: v for k, v in real.items() if k not in RUN_SPECIFIC} == {
        k: v for k, v in local.items() if k not in RUN_SPECIFIC
    }
    assert (real_out / "metrics.csv").read_text() == (out / "metrics.csv").read_text()

    # the clients' own models (saved after each round they trained, checkpoint-every > 0), weight for weight
    real_files = sorted(f.name for f in (real_out / "client-models").glob("*.pt"))
    assert real_files and real_files == sorted(f.name for f in (out / "client-models").glob("*.pt"))
    for name in real_files:
        a, b = (load_verified(d / "client-models" / name)["model"] for d in (real_out, out))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
