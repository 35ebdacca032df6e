"""FIARSE's training compute in both conventions, by hand on a tiny supernet: the MACs its mask keeps (the project's
count) and the MACs its dense tensors execute (the FEAST repository's, for matching compute); the per-round record
of each, and a match-compute run set from either."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from clients.fiarse import masked_train_costs
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.supernet.magnitude_masks import element_macs
from tests.test_hostile_supernet import TINY


def _tiny_state() -> dict:
    torch.manual_seed(0)
    return {k: v.numpy() for k, v in ElasticResNet(TINY).state_dict().items() if not k.endswith("num_batches_tracked")}


def test_kept_and_dense_training_flops_by_hand_on_a_tiny_model():
    state = _tiny_state()
    masked = sorted(element_macs(TINY))
    for name in masked:
        state[name] = np.zeros_like(state[name])
    # five elements above the threshold 0.5: two in the stem (8 x 8 output positions each), one in the first
    # block's conv1 (4 x 4 after the stage's stride 2), one classifier weight (1 MAC), the classifier bias (0 MACs)
    state["stem_conv.weight"][0, 0, 0, 0] = 1.0
    state["stem_conv.weight"][1, 2, 1, 1] = -2.0
    state["stages.0.0.conv1.weight"][0, 0, 0, 0] = 0.7
    state["classifier.weight"][3, 0] = 1.0
    state["classifier.bias"][0] = 1.0
    kept = 2 * 8 * 8 + 4 * 4 + 1 + 0
    # executed densely: every element of every masked tensor, at the same per-position costs
    positions = {
        name: 8 * 8 if name.startswith("stem") else 1 if name == "classifier.weight" else 0 if "bias" in name else 16
        for name in masked
    }
    dense = sum(state[name].size * cost for name, cost in positions.items())
    samples = 16
    costs = masked_train_costs(TINY, state, 0.5, samples)
    assert costs["train-flops"] == 6 * kept * samples  # 3 passes x 2 FLOPs per MAC
    assert costs["trained-macs"] == kept
    assert costs["train-flops-dense"] == 6 * dense * samples
    assert dense == 145_056  # the whole tiny supernet's MACs (the masked tensors are all its MACs)


def test_client_records_keep_executed_flops_per_round_only_where_counted_apart():
    from fl_app.run.outputs import ClientRecords

    records = ClientRecords({0: 10, 1: 11})
    records.credit(1, [0], [(0, {"train-flops": 1e9})])
    assert records.round_columns(1) == {"client_train_flops": 1e9}  # nothing counted apart: no dense column
    records.credit(2, [0, 1], [(0, {"train-flops": 2e9, "train-flops-dense": 5e9}), (1, {"train-flops": 1e9})])
    # round 1 executed what it counted; in round 2 one reply counted 5e9 executed, the other executed its 1e9
    assert records.round_columns(1) == {"client_train_flops": 1e9, "client_train_flops_dense": 1e9}
    assert records.round_columns(2) == {"client_train_flops": 3e9, "client_train_flops_dense": 6e9}
    resumed = ClientRecords({0: 10, 1: 11})
    resumed.restore_state(records.checkpoint_state())
    assert resumed.round_columns(2) == records.round_columns(2)


def test_the_server_costs_fiarse_both_ways_from_what_it_routed():
    """The server's dense figure is the full model's MACs per step, whatever the mask keeps; its kept figure is the
    mask's (``routed_macs``)."""
    from fl_app.run.costs import LocalTraining
    from strategies.fiarse import FiarseStrategy

    strategy = FiarseStrategy.__new__(FiarseStrategy)  # only what costing reads: no model, no round
    strategy.local_training, strategy.full_macs = LocalTraining(epochs=1, max_steps=0, batch_size=8), 1000.0
    strategy.routed_macs = lambda pid: (250.0, 250.0)
    work = FiarseStrategy.routed_work(strategy, 0, {"local-steps": 3})
    assert work["train-flops"] == LocalTraining(1, 0, 8).flops(250.0, 3)
    assert work["train-flops-dense"] == LocalTraining(1, 0, 8).flops(1000.0, 3) == 4 * work["train-flops"]


def test_match_flops_executed_sets_the_rounds_from_the_dense_column(tmp_path):
    from experiments.runner import expand, load_suite, settle_match
    from fl_app.run.outputs import write_csv
    from tests.harness.suites import write_suite
    from tests.test_matched_compute import SUITE, finished_folder

    text = SUITE.replace(
        'fedavg-min-matched = { method = "fedavg-min", match-compute = "feast" }',
        'fedavg-min-matched = { method = "fedavg-min", match-compute = "feast", match-flops = "executed" }',
    )
    runs = expand(load_suite(write_suite(tmp_path, text)))
    reference, source, matched = runs[:3]
    assert matched.match_flops == "executed" and "match-flops" not in matched.run_config
    reference.folder = finished_folder(tmp_path / "feast", [3e9] * 4)  # executes what it counts: 12e9
    source.folder = finished_folder(tmp_path / "src", [1e9] * 4)
    # the source counted 1e9 a round and executed 4e9 (a dense masked model): 12e9 / 4e9 = 3 rounds, not 12
    write_csv(
        source.folder / "rounds.csv",
        [{"round": r, "client_train_flops": 1e9, "client_train_flops_dense": 4e9} for r in range(1, 5)],
    )
    settle_match(matched, runs, tmp_path / "out", rerun_changed=False)
    assert matched.run_config["num-server-rounds"] == 3 and matched.match_compute["flops"] == "executed"
    bad = text.replace('match-flops = "executed"', 'match-flops = "logical"')
    with pytest.raises(ValueError, match=r"match-flops='logical'; allowed: \['counted', 'executed'\]"):
        load_suite(write_suite(tmp_path, bad))


def test_the_matched_table_gives_the_executed_compute_ratio_beside_the_counted_one(tmp_path):
    from tests.test_matched_compute import Launcher, run

    class DenseLauncher(Launcher):
        """The matched method counts a quarter of what it executes (as FIARSE's kept MACs)."""

        def __call__(self, planned, timeout):
            status = super().__call__(planned, timeout)
            if planned.label != "feast":
                path = planned.folder / "rounds.csv"
                with open(path) as handle:
                    rows = list(csv.DictReader(handle))
                from fl_app.run.outputs import write_csv

                write_csv(
                    path,
                    [{**r, "client_train_flops_dense": 4 * float(r["client_train_flops"])} for r in rows],
                    replace=True,
                )
            return status

    result, _ = run(tmp_path, DenseLauncher())
    assert not result["failed"]
    with open(tmp_path / "out/matched.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["compute_ratio"]) == pytest.approx((12.6 / 12 + 14 / 14) / 2)
    assert float(row["compute_ratio_executed"]) == pytest.approx(4 * (12.6 / 12 + 14 / 14) / 2)
    assert "executed compute (× vs)" in (tmp_path / "out/table.md").read_text()
