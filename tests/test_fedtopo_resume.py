"""FedTopo-family checkpoints and resume, in-process with real client training: a run that dies in round 3 keeps
its round files and a summary saying it failed; resuming it from its round-2 checkpoint in a fresh federation
(node states gone, as after a restart) ends exactly where the uninterrupted run ends: same metrics, same server
state, same client models, same client statistics (rounds.csv, clients.csv). Damaged or foreign checkpoints and
model files are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import MessageType

from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from fl_app.multiarch_app import MODEL_STATE
from fl_app.run.checkpoint import MODELS_DIR
from fl_app.run.config import validate_run_config
from fl_app.run.payload import record_to_state
from tests.harness.in_process import TINY_RUN, CrashingGrid
from tests.test_faults_resume import measured_columns_dropped

TINY = {**TINY_RUN, "tgp-server-epochs": 2, "checkpoint-every": 2}


class RecordingGrid(InProcessGrid):
    """Keeps what the server broadcast in each round (the global state after the previous round's merge)."""

    def __init__(self, run, num_clients):
        super().__init__(run, num_clients)
        self.broadcasts = {}

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == MessageType.TRAIN:
                self.broadcasts[m.content.config_records["config"]["server-round"]] = record_to_state(
                    m.content.array_records["arrays"]
                )
        return super().send_and_receive(messages, timeout)


def _run(tmp_path, name: str, method: str, **overrides):
    return validate_run_config({**TINY, "method": method, "output-dir": str(tmp_path / name), **overrides})


@pytest.mark.parametrize("method", ["fedtopo", "fedtgp"])
def test_a_resumed_run_ends_exactly_where_the_uninterrupted_one_ends(flower_ids, tmp_path, method):
    straight_grid = RecordingGrid(_run(tmp_path, "straight", method), 3)
    straight = run_in_process(straight_grid.run, 3, straight_grid)

    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="the server died"):
        run_in_process(_run(tmp_path, "crashed", method), 3, CrashingGrid(_run(tmp_path, "crashed", method), 3, 3))
    summary = json.loads((crashed / "summary.json").read_text())  # written although the run failed
    assert summary["completed"] is False and "the server died" in summary["error"] and summary["rounds_done"] == 2
    assert len((crashed / "metrics.csv").read_text().strip().splitlines()) == 2  # header + round 2
    assert torch.load(crashed / "checkpoint.pt", weights_only=True)["round"] == 2

    run = _run(tmp_path, "resumed", method, **{"resume-from": str(crashed)})
    resumed_grid = RecordingGrid(run, 3)  # fresh node states: only the model files remain
    resumed = run_in_process(run, 3, resumed_grid)
    assert resumed["history"] == straight["history"]
    assert [h["round"] for h in resumed["history"]] == [2, 3]
    # the clients' statistics count the rounds before the resume too (time and memory aside)
    for name in ("rounds.csv", "clients.csv"):
        assert measured_columns_dropped(tmp_path / "resumed" / name) == measured_columns_dropped(
            tmp_path / "straight" / name
        ), name
    for pid, context in straight_grid.contexts.items():
        if MODEL_STATE not in context.state.array_records:
            continue
        mine, theirs = (
            resumed_grid.contexts[pid].state.array_records[MODEL_STATE],
            context.state.array_records[MODEL_STATE],
        )
        for key in theirs:
            np.testing.assert_array_equal(mine[key].numpy(), theirs[key].numpy(), err_msg=f"client {pid} {key}")
    # the restored server state is exactly the one the uninterrupted run broadcast in round 3
    assert sorted(resumed_grid.broadcasts) == [3]
    for key, value in straight_grid.broadcasts[3].items():
        np.testing.assert_array_equal(resumed_grid.broadcasts[3][key], value, err_msg=key)


def test_damaged_or_foreign_checkpoints_and_model_files_are_refused(flower_ids, tmp_path):
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="the server died"):
        run_in_process(
            _run(tmp_path, "crashed", "fedtopo"), 3, CrashingGrid(_run(tmp_path, "crashed", "fedtopo"), 3, 3)
        )

    with pytest.raises(ValueError, match=r"run config differs from the checkpoint's \(topo-beta"):
        run_in_process(_run(tmp_path, "other", "fedtopo", **{"resume-from": str(crashed), "topo-beta": 0.9}), 3)
    with pytest.raises(ValueError, match="a checkpoint of another model .*feature-dim"):
        run_in_process(_run(tmp_path, "other2", "fedtopo", **{"resume-from": str(crashed), "feature-dim": 32}), 3)

    model_file = sorted((crashed / MODELS_DIR).glob("partition-*-round-*.pt"))[0]
    damaged = bytearray(model_file.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    model_file.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="content hash mismatch|not a readable checkpoint"):
        run_in_process(_run(tmp_path, "resumed", "fedtopo", **{"resume-from": str(crashed)}), 3)

    checkpoint = crashed / "checkpoint.pt"
    damaged = bytearray(checkpoint.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    checkpoint.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="resume-from=.*(content hash mismatch|not a readable checkpoint)"):
        run_in_process(_run(tmp_path, "resumed2", "fedtopo", **{"resume-from": str(crashed)}), 3)
