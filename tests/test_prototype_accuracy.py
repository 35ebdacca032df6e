"""experiments.studies.prototype_accuracy: HtFLlib's nearest-prototype score of a finished FedProto/FedTGP run,
checked against a hand computation on a tiny in-process run, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clients.fedtopo import embed
from experiments.runner.in_process_grid import InProcessGrid, run_in_process
from experiments.studies.prototype_accuracy import main, nearest_prototype, score_run
from fl_app.data.local_splits import client_data
from fl_app.models.multiarch import client_model
from fl_app.multiarch_app import MODEL_STATE
from fl_app.run.config import validate_run_config
from tests.harness.in_process import TINY_RUN


def test_nearest_prototype_by_hand():
    """Features (0, 0) and (3, 3); prototypes of classes 0, 1, 2 at (1, 1), (2, 2), (0, 0); class 2 not held: the
    first feature is nearest class 0 (not the absent class 2), the second class 1."""
    features = torch.tensor([[0.0, 0.0], [3.0, 3.0]])
    prototypes = torch.tensor([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]])
    held = torch.tensor([True, True, False])
    assert nearest_prototype(features, prototypes, held).tolist() == [0, 1]
    assert nearest_prototype(features, prototypes, torch.ones(3, dtype=torch.bool)).tolist() == [2, 1]


@pytest.mark.parametrize("method", ["fedproto", "fedtgp"])
def test_a_finished_run_is_scored_by_its_head_and_its_nearest_global_prototype(flower_ids, tmp_path, method):
    run = validate_run_config(
        {**TINY_RUN, "method": method, "tgp-server-epochs": 2, "checkpoint-every": 1, "output-dir": str(tmp_path)}
    )
    grid = InProcessGrid(run, 3)
    summary = run_in_process(run, 3, grid)
    scored = score_run(tmp_path)
    server = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["strategy"]["global_arrays"]
    prototypes, held = server["prototypes"].numpy(), server["has"].numpy() > 0
    proto_accuracy = []
    for pid in range(3):  # each client's model as its node holds it, scored by hand
        model = client_model(run["model-family"], pid, 10, run["feature-dim"], run["backbones"])
        model.load_state_dict(grid.contexts[pid].state.array_records[MODEL_STATE].to_torch_state_dict())
        _, features, labels = embed(model, client_data(run, pid, 3)[1])
        distances = np.array(
            [[np.mean((f - p) ** 2) if h else np.inf for p, h in zip(prototypes, held)] for f in features.numpy()]
        )
        proto_accuracy.append(np.mean(distances.argmin(1) == labels.numpy()))
    assert scored["head_accuracy"] == pytest.approx(summary["mean_client_accuracy"])
    assert scored["prototype_accuracy"] == pytest.approx(float(np.mean(proto_accuracy)))
    assert (scored["label"], scored["seed"], scored["rounds"]) == (method, 0, 3)


def test_other_methods_and_unfinished_runs_are_refused_naming_the_field(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"method": "fedtopo", "completed": True}))
    assert main([str(tmp_path)]) == 2
    assert "method 'fedtopo'; allowed: fedproto, fedtgp" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text(json.dumps({"method": "fedtgp", "completed": False}))
    assert main([str(tmp_path)]) == 2
    assert "did not complete" in capsys.readouterr().err
