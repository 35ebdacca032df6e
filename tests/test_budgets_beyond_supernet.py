"""A client whose budget is above the whole supernet (a device stronger than the model: the reference's normal case,
Zipf budgets up to 1.5 GMAC over a cache topping at 596 MMAC) is valid in every supernet-family method: it is routed,
assigned, trained and scored exactly as a client whose budget is the whole supernet, and counts as the supernet in
the γ shares. Simulated budgets reach beyond the model with ``budget-max-factor``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from fl_app.data.partition import draw_budgets
from fl_app.run.config import SUPERNET_METHODS, validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.evaluation import population_weighted_accuracy
from fl_app.supernet.shared_setup import SupernetSetup, partition_rows
from fl_app.supernet_app import SupernetFamily, train_supernet_client

NUM = 4
SUPERNET_MACS = 13_546_752  # the CPU supernet whole (= the CPU cache's largest subnet)
ABOVE = 1.4e7  # the operator's example: a SuperNode declaring a budget above the whole CPU supernet
TINY = {
    "clients-per-round": NUM,
    "max-local-steps": 1,
    "batch-size": 8,
    "val-size": 64,
    "calib-size": 64,
    "test-size": 500,
}


def _family(method: str, budget: float) -> SupernetFamily:
    """The server side of a run whose partition 0 declared ``budget`` (node ids 100 + partition id)."""
    run = validate_run_config({**TINY, "method": method})
    nodes = {pid: {"node_id": 100 + pid} for pid in range(NUM)}
    nodes[0]["budget-macs"] = budget
    return SupernetFamily(run, nodes)


def _round_one(family: SupernetFamily):
    """Round 1's training message to partition 0 (every partition is sampled), from the seeded initial model."""
    torch.manual_seed(0)
    state = {
        k: v.numpy()
        for k, v in family.strategy.global_model().state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    messages = family.strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)
    return next(m for m in messages if m.metadata.dst_node_id == 100)


@pytest.mark.parametrize("method", SUPERNET_METHODS)
def test_a_client_above_the_supernet_trains_and_is_scored_as_one_at_the_supernet(flower_ids, method):
    above, whole = _family(method, ABOVE), _family(method, float(SUPERNET_MACS))
    assert above.setup.supernet_macs == SUPERNET_MACS and above.budgets[0] == ABOVE
    # same rows (the γ share counts the budget as the supernet), same routing and assignment
    assert above.client_columns["num_examples"] == whole.client_columns["num_examples"]
    sent_above, sent_whole = _round_one(above), _round_one(whole)
    arrays_above = record_to_state(sent_above.content.array_records["arrays"])
    arrays_whole = record_to_state(sent_whole.content.array_records["arrays"])
    assert {k: v.shape for k, v in arrays_above.items()} == {k: v.shape for k, v in arrays_whole.items()}
    config_above = dict(sent_above.content.config_records["config"])
    config_whole = dict(sent_whole.content.config_records["config"])
    assert config_above.pop("budget-macs") == ABOVE and config_whole.pop("budget-macs") == SUPERNET_MACS
    assert config_above.pop("partition-budgets")[0] == ABOVE and config_whole.pop("partition-budgets")
    assert config_above == config_whole
    # the client accepts the broadcast and trains what a client at the supernet trains, on the same data
    reply_above = train_supernet_client(sent_above, above.run, 0, NUM, context=None)
    reply_whole = train_supernet_client(sent_whole, whole.run, 0, NUM, context=None)
    metrics_above = reply_above.content.metric_records["metrics"]
    assert metrics_above["trained-macs"] == reply_whole.content.metric_records["metrics"]["trained-macs"]
    assert metrics_above["num-examples"] == above.client_columns["num_examples"][0]
    trained_above = record_to_state(reply_above.content.array_records["arrays"])
    trained_whole = record_to_state(reply_whole.content.array_records["arrays"])
    assert trained_above.keys() == trained_whole.keys()
    assert all(np.array_equal(trained_above[k], trained_whole[k]) for k in trained_above)
    # scored with the largest tier, and where clients deploy cached subnets, with the whole supernet
    tier_macs = [t.macs for t in above.tiers]
    accuracies = [0.1 * (i + 1) for i in range(len(tier_macs))]
    assert population_weighted_accuracy([ABOVE], tier_macs, accuracies) == accuracies[int(np.argmax(tier_macs))]
    if above.method.clients_run_cached_subnets:
        assert above.setup.cache.local_max(ABOVE).macs == SUPERNET_MACS
    if method in ("feast", "heterofl", "fedrolex", "scalefl"):  # the method's largest model, whole
        assert metrics_above["trained-macs"] == max(tier_macs) == SUPERNET_MACS


def test_the_gamma_share_counts_a_budget_above_the_supernet_as_the_supernet():
    run = validate_run_config({"clients-per-round": 2})
    setup = SupernetSetup.build(run, NUM)
    budgets = [float(b) for b in setup.budgets]
    at_supernet = partition_rows(run, NUM, [SUPERNET_MACS, *budgets[1:]])
    for above in (ABOVE, 1e9):
        rows = partition_rows(run, NUM, [above, *budgets[1:]])
        assert all(np.array_equal(a, b) for a, b in zip(rows, at_supernet))


def test_budget_max_factor_draws_zipf_budgets_up_to_k_times_the_supernet(cpu_cache):
    run = validate_run_config({"budget-max-factor": 2.5, "seed": 3})
    setup = SupernetSetup.build(run, 100)
    expected = draw_budgets(100, cpu_cache.min_macs, 2.5 * SUPERNET_MACS, 1.2, 3)
    assert np.array_equal(setup.budgets, expected)
    assert setup.budgets.max() <= 2.5 * SUPERNET_MACS and (setup.budgets > SUPERNET_MACS).any()
    # the default draw is today's: Zipf up to the cache's largest subnet
    default = SupernetSetup.build(validate_run_config({"seed": 3}), 100)
    assert np.array_equal(default.budgets, draw_budgets(100, cpu_cache.min_macs, cpu_cache.max_macs, 1.2, 3))


def test_budget_max_macs_above_the_supernet_is_valid():
    setup = SupernetSetup.build(validate_run_config({"budget-max-macs": 3e7}), 100)
    assert setup.budgets.max() <= 3e7 and (setup.budgets > SUPERNET_MACS).any()


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"budget-max-factor": 1e6}, r"budget-max-factor=1e\+06 gives a largest budget of \d+ MACs, too large"),
        ({"budget-max-factor": 0.01}, r"budget-max-factor=0.01 gives .* below the smallest cached subnet"),
        ({"budget-max-macs": 1e12, "supernet": "paper"}, None),  # 373 x the paper supernet: valid
    ],
)
def test_absurd_largest_budgets_are_refused_naming_the_key(config, fragment):
    run = validate_run_config(config)
    if fragment is None:
        assert SupernetSetup.build(run, 4).budgets.max() <= 1e12
        return
    with pytest.raises(ValueError, match=fragment):
        SupernetSetup.build(run, 4)


def test_budget_max_factor_and_budget_max_macs_are_not_both_set():
    with pytest.raises(ValueError, match="budget-max-factor=2 and budget-max-macs=2e\\+07 both set"):
        validate_run_config({"budget-max-factor": 2.0, "budget-max-macs": 2e7})
