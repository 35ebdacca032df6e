"""Baseline rules against hand computations: MaxNet weights, tracking sandwich, HeteroFL counts, FedRolex roll."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, count_macs, width_sliced_config, width_tier
from fl_app.run.payload import payload_bytes, record_to_state, state_to_record
from fl_app.supernet.slicing import subnet_shapes
from strategies.heterofl import FedRolexStrategy, HeteroFLStrategy, elastic_dims, roll_state
from strategies.superfednas import SuperFedNASStrategy, maxnet_beta, maxnet_weights, sandwich_roles
from tests.test_routing_budgets import _reply


def test_maxnet_beta_schedule():
    assert maxnet_beta(0, 100) == pytest.approx(0.9)
    # T = 80 rounds: at t = 40, cos term = 0.5 -> 0.9 * (0.875 * 0.5 + 0.125)
    assert maxnet_beta(40, 100) == pytest.approx(0.9 * (0.875 * 0.5 + 0.125))
    assert maxnet_beta(80, 100) == pytest.approx(0.9 * 0.125)
    assert maxnet_beta(95, 100) == maxnet_beta(80, 100)


def test_maxnet_weights():
    assert maxnet_weights(["max", "min", "random", "random"], 0.6) == pytest.approx([0.6, 0.4 / 3, 0.4 / 3, 0.4 / 3])
    assert sum(maxnet_weights(["max", "max", "min"], 0.5)) == pytest.approx(1.0)
    assert maxnet_weights(["max", "max", "min"], 0.5)[:2] == pytest.approx([0.25, 0.25])


def test_tracking_sandwich_prefers_least_assigned():
    roles = sandwich_roles([3, 5, 7, 9], largest_counts={3: 2, 5: 0, 7: 1, 9: 0}, smallest_counts={3: 0, 7: 3, 9: 1})
    assert roles == {5: "max", 3: "min", 7: "random", 9: "random"}


def test_superfednas_roles_rotate_and_respect_budgets(flower_ids, cpu_cfg, cpu_cache):
    budgets = {0: cpu_cache.min_macs, 1: 3e6, 2: 8e6, 3: cpu_cache.max_macs}
    nodes = {p: 10 + p for p in budgets}
    strategy = SuperFedNASStrategy(
        cpu_cfg, cpu_cache, budgets, nodes, clients_per_round=4, seed=0, num_rounds=4, subnet_source="space"
    )
    state = {
        k: v.numpy() for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    max_owners = []
    for rnd in range(1, 5):
        messages = list(strategy.configure_train(rnd, state_to_record(state), ConfigRecord(), grid=None))
        for msg in messages:
            pid = msg.metadata.dst_node_id - 10
            cfg = msg.content.config_records["config"]
            arch = Subnet(cfg["arch-d"], cfg["arch-e"], cfg["arch-w"])
            assert count_macs(cpu_cfg, arch) <= budgets[pid]
            # only the subnet the client trains goes down (not the full supernet), and it is routed as the bounds
            received = record_to_state(msg.content.array_records["arrays"])
            assert {k: v.shape for k, v in received.items()} == subnet_shapes(cpu_cfg, arch)
            assert Subnet(cfg["bounds-d"], cfg["bounds-e"], cfg["bounds-w"]) == arch
        max_owners.append(next(p for p, r in strategy.roles.items() if r == "max"))
    assert sorted(max_owners) == [0, 1, 2, 3]  # every client gets the max once in four rounds


def test_superfednas_client_returns_its_subnet_and_the_server_merges_it(flower_ids, cpu_cfg, cpu_cache):
    """The slice a client received is exactly what it may send back; MaxNet weights apply to the merge."""
    budgets = {0: cpu_cache.min_macs, 1: 3e6}
    strategy = SuperFedNASStrategy(
        cpu_cfg, cpu_cache, budgets, {0: 10, 1: 11}, clients_per_round=2, seed=0, num_rounds=10, subnet_source="cache"
    )
    state = {
        k: v.numpy() for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    messages = list(strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None))
    replies, subnet_bytes = [], 0
    for msg in messages:
        pid = msg.metadata.dst_node_id - 10
        received = record_to_state(msg.content.array_records["arrays"])
        replies.append(_reply(msg, {k: np.full_like(v, pid + 1.0) for k, v in received.items()}, 5))
        subnet_bytes += payload_bytes(subnet_shapes(cpu_cfg, strategy.routed[pid][1]), "float32")
    record, metrics = strategy.aggregate_train(1, replies)
    assert metrics["rejected"] == 0
    # bytes down = bytes up = the two subnets' payloads (the full supernet would be far more)
    assert metrics["bytes-down"] == metrics["bytes-up"] == subnet_bytes
    assert subnet_bytes < payload_bytes(subnet_shapes(cpu_cfg, cpu_cfg.max_subnet()), "float32")
    merged = record_to_state(record)
    beta = maxnet_beta(1, 10)
    roles = dict(strategy.roles)
    value = {p: p + 1.0 for p in budgets}
    # the stem's first filter is covered by both subnets: MaxNet-weighted average of the two values
    w = {p: beta if roles[p] == "max" else 1 - beta for p in budgets}
    expected = sum(w[p] * value[p] for p in budgets) / sum(w.values())
    assert merged["stem_conv.weight"][0, 0, 0, 0] == pytest.approx(expected, rel=1e-6)
    # the stem's last filter is outside both subnets' slices (budgets below the full stem width): unchanged
    assert merged["stem_conv.weight"][-1, 0, 0, 0] == pytest.approx(state["stem_conv.weight"][-1, 0, 0, 0])


def test_heterofl_counts_one_per_client_and_masks_classifier_rows(flower_ids, cpu_cfg, cpu_cache):
    width_cfg = width_sliced_config(cpu_cfg)
    tiers = [count_macs(width_cfg, width_tier(width_cfg, i)) for i in range(5)]
    budgets = {0: float(tiers[2]), 1: float(tiers[4])}  # rate 1/4 and rate 1
    strategy = HeteroFLStrategy(cpu_cfg, cpu_cache, budgets, {0: 10, 1: 11}, clients_per_round=2, seed=0)
    state = {
        k: v.numpy()
        for k, v in ElasticResNet(width_cfg).state_dict().items()
        if not k.endswith(("num_batches_tracked", "running_mean", "running_var"))
    }
    messages = sorted(
        strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None),
        key=lambda m: m.metadata.dst_node_id,
    )
    small = record_to_state(messages[0].content.array_records["arrays"])
    assert small["stem_conv.weight"].shape[0] == round(16 / 4)  # rate 1/4 of 16 stem channels
    assert not any(k.endswith("running_mean") for k in small)  # static BN: no running statistics
    replies = [
        _reply(messages[0], {k: np.full_like(v, 2.0) for k, v in small.items()}, 100),
        _reply(
            messages[1],
            {k: np.full_like(v, 4.0) for k, v in record_to_state(messages[1].content.array_records["arrays"]).items()},
            1,
        ),
    ]
    replies[0].content.metric_records["metrics"] = MetricRecord({"num-examples": 100, "labels": [0, 1]})
    replies[1].content.metric_records["metrics"] = MetricRecord({"num-examples": 1, "labels": [1, 2]})
    record, _ = strategy.aggregate_train(1, replies)
    merged = record_to_state(record)
    # count rule: both clients weigh 1 whatever their data size -> (2 + 4) / 2 where both cover
    assert merged["stem_conv.weight"][0, 0, 0, 0] == pytest.approx(3.0)
    assert merged["stem_conv.weight"][-1, 0, 0, 0] == pytest.approx(4.0)
    w = merged["classifier.weight"]
    assert w[0, 0] == pytest.approx(2.0)  # label 0: only client 0 holds it
    assert w[1, 0] == pytest.approx(3.0)  # label 1: both
    assert w[2, 0] == pytest.approx(4.0)  # label 2: only client 1
    np.testing.assert_array_equal(w[5], state["classifier.weight"][5])  # nobody holds label 5


def test_fedrolex_window_is_the_rolled_index_prefix(cpu_cfg):
    width_cfg = width_sliced_config(cpu_cfg)
    dims = elastic_dims(width_cfg)
    assert dims["stem_conv.weight"] == (0,)  # RGB input channels never roll
    assert dims["classifier.weight"] == (1,)  # classes never roll
    channels = 16
    state = {"stem_conv.weight": np.arange(channels, dtype=float)[:, None, None, None] * np.ones((1, 3, 3, 3))}
    for rnd in (1, 5, 17):
        rolled = roll_state(state, dims, rnd)
        kept = 4
        expected = np.roll(np.arange(channels), rnd % channels)[:kept]
        np.testing.assert_array_equal(rolled["stem_conv.weight"][:kept, 0, 0, 0], expected)
        back = roll_state(rolled, dims, rnd, -1)
        np.testing.assert_array_equal(back["stem_conv.weight"], state["stem_conv.weight"])


def test_fedrolex_trains_different_channels_each_round(flower_ids, cpu_cfg, cpu_cache):
    width_cfg = width_sliced_config(cpu_cfg)
    budgets = {0: float(count_macs(width_cfg, width_tier(width_cfg, 3)))}  # rate 1/2
    strategy = FedRolexStrategy(cpu_cfg, cpu_cache, budgets, {0: 10}, clients_per_round=1, seed=0)
    state = {
        k: v.numpy()
        for k, v in ElasticResNet(width_cfg).state_dict().items()
        if not k.endswith(("num_batches_tracked", "running_mean", "running_var"))
    }
    touched = []
    for rnd in (1, 2):
        msg = list(strategy.configure_train(rnd, state_to_record(state), ConfigRecord(), grid=None))[0]
        sent = record_to_state(msg.content.array_records["arrays"])
        record, _ = strategy.aggregate_train(rnd, [_reply(msg, {k: v + 1 for k, v in sent.items()}, 5)])
        merged = record_to_state(record)
        changed = np.flatnonzero(
            ~np.isclose(merged["stem_conv.weight"][:, 0, 0, 0], state["stem_conv.weight"][:, 0, 0, 0])
        )
        touched.append(changed.tolist())
    assert touched[0] != touched[1]
    assert touched[0] == sorted(np.roll(np.arange(16), 1)[:8].tolist())
    assert math.isclose(len(touched[1]), 8)
