"""FIARSE mapped as the FEAST repository maps it (``fiarse-mapping = "reference"``): each client keeps its own
fraction of the parameters, budget / full-model MACs, by count (the top-k magnitudes), and trains with plain SGD;
against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fl_app.models.supernet_space import count_macs
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.magnitude_masks import element_macs, magnitude_mask, model_size, size_threshold
from strategies.fiarse import FiarseStrategy
from tests.harness.training import one_step_federation, plain_settings
from tests.test_fiarse import _state
from tests.test_hostile_supernet import CACHE, TINY


def test_continuous_size_mask_by_hand():
    state = {"a": np.array([0.1, -0.5, 0.3, 0.9], np.float32), "b": np.array([[0.2, 0.8], [-0.05, 0.4]], np.float32)}
    full = 1000.0
    # budget 500 of 1000 MACs: half of the 8 elements by count, whatever they cost: 0.9, 0.8, 0.5, 0.4
    assert model_size(500, full) == 0.5
    t = size_threshold(state, ["a", "b"], model_size(500, full))
    assert t == pytest.approx(0.4)
    mask = magnitude_mask(state, ["a", "b"], t)
    assert mask["a"].tolist() == [False, True, False, True] and mask["b"].tolist() == [[False, True], [False, True]]
    # 300 of 1000: int(8 x 0.3) = 2 elements (0.9, 0.8)
    assert size_threshold(state, ["a", "b"], model_size(300, full)) == pytest.approx(0.8)
    # below 1/256 of the model: the size is 1/256, int(8 / 256) = 0 elements, at least one kept (0.9)
    assert model_size(1, full) == 1 / 256
    assert size_threshold(state, ["a", "b"], model_size(1, full)) == pytest.approx(0.9)
    # at or above the whole model: everything
    assert model_size(5000, full) == 1.0 and size_threshold(state, ["a", "b"], 1.0) == 0.0


def test_each_client_gets_its_own_size_not_a_level(flower_ids):
    """Two clients whose budgets fall inside one level of the tiers mapping get different masks under the
    reference mapping: each keeps int(numel x budget / full MACs) of the masked elements."""
    full_macs = count_macs(TINY, TINY.max_subnet())
    budgets = {0: 0.30 * full_macs, 1: 0.40 * full_macs, 2: 2.0 * full_macs}
    levels = [c.macs for c in CACHE.entries]
    strategy = FiarseStrategy(
        TINY, CACHE, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0, levels=levels,
        mapping="reference",
    )  # fmt: skip
    state = _state(TINY)
    costs = element_macs(TINY)
    numel = sum(state[n].size for n in costs)
    messages = strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)
    assert len(messages) == 3
    magnitudes = np.sort(np.concatenate([np.abs(state[n]).ravel() for n in sorted(costs)]))[::-1]
    for msg in messages:
        pid = msg.metadata.dst_node_id - 10
        size = min(1.0, budgets[pid] / full_macs)
        k = max(1, int(numel * size))
        expected = 0.0 if size >= 1 else float(magnitudes[k - 1])  # the k-th largest magnitude, by hand
        threshold = msg.content.config_records["config"]["mask-threshold"]
        assert threshold == pytest.approx(expected)
        received = record_to_state(msg.content.array_records["arrays"])
        kept = sum(int(np.count_nonzero(np.abs(state[n]) >= threshold)) for n in costs)
        assert kept == (numel if size >= 1 else k)  # ties aside (random weights have none)
        for name in costs:
            assert np.array_equal(received[name], np.where(np.abs(state[name]) >= threshold, state[name], 0)), name
    thresholds = [m.content.config_records["config"]["mask-threshold"] for m in messages]
    assert len(set(thresholds)) == 3
    with pytest.raises(ValueError, match="fiarse-mapping='levels'"):
        FiarseStrategy(
            TINY, CACHE, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0, levels=levels,
            mapping="levels",
        )  # fmt: skip


def test_reference_mapping_trains_with_plain_sgd():
    from clients.fiarse import fiarse_settings
    from fl_app.run.config import validate_run_config

    settings = plain_settings()
    ours = fiarse_settings(validate_run_config({"method": "fiarse"}), settings)
    assert (ours.momentum, ours.weight_decay) == (0.9, 5e-4)  # the default: the run's optimiser
    reference = fiarse_settings(validate_run_config({"method": "fiarse", "fiarse-mapping": "reference"}), settings)
    assert (reference.momentum, reference.weight_decay, reference.lr) == (0.0, 0.0, 0.1)


def test_real_clients_train_their_own_sizes_and_count_both_conventions(flower_ids):
    """A round of real clients under the reference mapping: each trains under its own threshold, the server
    accepts every reply, and each reply counts its kept and its executed (full-model) FLOPs."""
    import math

    from experiments.runner.flower_internals import set_message_id, set_reply_source
    from fl_app.supernet_app import train_supernet_client

    num = 3
    run, setup, strategy = one_step_federation(num, method="fiarse", **{"fiarse-mapping": "reference"})
    full_macs = count_macs(setup.cfg, setup.cfg.max_subnet())
    torch_state = strategy.global_model().state_dict()
    state = {k: v.numpy() for k, v in torch_state.items() if not k.endswith("num_batches_tracked")}
    replies = []
    for i, message in enumerate(strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)):
        set_message_id(message, f"message-{i}")
        pid = message.metadata.dst_node_id - 100
        threshold = message.content.config_records["config"]["mask-threshold"]
        assert threshold == size_threshold(state, element_macs(setup.cfg), model_size(strategy.budgets[pid], full_macs))
        reply = train_supernet_client(message, run, pid, num, None)
        set_reply_source(reply, message.metadata.dst_node_id)
        metrics = reply.content.metric_records["metrics"]
        assert metrics["local-steps"] == 1 and math.isfinite(metrics["train-loss"])
        assert metrics["train-flops-dense"] == 6 * full_macs * 8 >= metrics["train-flops"]
        replies.append(reply)
    strategy.aggregate_train(1, replies)
    assert strategy.rounds[1].accepted == list(range(num)) and strategy.rounds[1].rejected == []
