"""Budgets, routing bounds and the strategy's per-client payloads."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from experiments.runner.flower_internals import set_reply_source
from fl_app.data.partition import draw_budgets
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet
from fl_app.run.payload import payload_bytes, record_bytes, record_to_state, state_to_record
from fl_app.supernet.slicing import slice_subnet, state_numel, subnet_shapes
from strategies.feast import FeastStrategy
from strategies.rounds import sample_partitions


def test_budgets_are_seeded_clipped_and_zipf_skewed():
    a = draw_budgets(1000, 1e6, 100e6, 1.2, seed=3)
    assert np.array_equal(a, draw_budgets(1000, 1e6, 100e6, 1.2, seed=3))
    assert not np.array_equal(a, draw_budgets(1000, 1e6, 100e6, 1.2, seed=4))
    assert a.min() >= 1e6 and a.max() <= 100e6
    # rank 1 (the smallest budgets) is the most common
    step = 99e6 / 999
    assert np.mean(a < 1e6 + step / 2) > np.mean((a > 50e6) & (a < 50e6 + step))


def test_route_bounds_is_the_envelope_of_affordable_cached_subnets(cpu_cfg, cpu_cache):
    for budget in [cpu_cache.min_macs, 1.5e6, 4e6, 9e6, cpu_cache.max_macs]:
        bounds = cpu_cache.route_bounds(budget)
        affordable = cpu_cache.under(budget)
        assert all(c.arch.within(bounds) for c in affordable)
        # tight: every dimension of the bounds is reached by some affordable subnet
        for i, d in enumerate(bounds.d):
            assert any(c.arch.d[i] == d for c in affordable)
        for i, w in enumerate(bounds.w):
            assert any(c.arch.w[i] == w for c in affordable)
        assert bounds.within(cpu_cfg.max_subnet())


def test_small_budgets_never_receive_the_full_supernet(cpu_cfg, cpu_cache):
    full = state_numel(subnet_shapes(cpu_cfg, cpu_cfg.max_subnet()))
    sizes = [state_numel(subnet_shapes(cpu_cfg, cpu_cache.route_bounds(b))) for b in (0.5e6, 1e6, 3e6, 6e6)]
    assert all(s < full for s in sizes)
    assert sizes == sorted(sizes)  # more budget, more of the supernet
    assert state_numel(subnet_shapes(cpu_cfg, cpu_cache.route_bounds(cpu_cache.max_macs))) == full


def test_budget_below_smallest_cached_subnet_is_an_error(cpu_cache):
    with pytest.raises(ValueError, match="below the smallest cached subnet"):
        cpu_cache.route_bounds(cpu_cache.min_macs - 1)


def test_seeded_sampling_over_partition_ids():
    a = sample_partitions(range(10), 4, seed=0, server_round=3)
    assert a == sample_partitions(reversed(range(10)), 4, seed=0, server_round=3)
    assert len(set(a)) == 4
    assert a != sample_partitions(range(10), 4, seed=0, server_round=4) or a != sample_partitions(
        range(10), 4, seed=0, server_round=5
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_payload_bytes_are_the_bytes_in_the_message(cpu_cfg, dtype):
    shapes = subnet_shapes(cpu_cfg, cpu_cfg.max_subnet())
    state = {k: np.random.default_rng(0).normal(size=s).astype(np.float32) for k, s in shapes.items()}
    record = state_to_record(state, dtype)
    assert payload_bytes(shapes, dtype) == record_bytes(record)
    decoded = record_to_state(record, dtype)
    tol = 1e-2 if dtype == "bfloat16" else 0
    for k in state:
        np.testing.assert_allclose(decoded[k], state[k], rtol=tol, atol=tol)


def _strategy(cpu_cfg, cpu_cache, budgets, **kw):
    nodes = {pid: 100 + pid for pid in budgets}
    return FeastStrategy(cpu_cfg, cpu_cache, budgets, nodes, clients_per_round=len(budgets), seed=0, **kw)


def _reply(msg: Message, state: dict, num_examples: int, dtype="float32") -> Message:
    reply = Message(
        RecordDict(
            {
                "arrays": state_to_record(state, dtype),
                "metrics": MetricRecord({"num-examples": num_examples, "train-loss": 1.0}),
            }
        ),
        reply_to=msg,
    )
    set_reply_source(reply, msg.metadata.dst_node_id)
    return reply


def test_strategy_routes_each_client_its_own_slice_and_aggregates_sparsely(flower_ids, cpu_cfg, cpu_cache):
    budgets = {0: cpu_cache.min_macs, 1: 3e6, 2: cpu_cache.max_macs}
    strategy = _strategy(cpu_cfg, cpu_cache, budgets)
    init = {
        k: v.numpy() for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    messages = list(strategy.configure_train(1, state_to_record(init), ConfigRecord(), grid=None))
    assert sorted(m.metadata.dst_node_id for m in messages) == [100, 101, 102]
    for msg in messages:
        pid = msg.metadata.dst_node_id - 100
        received = record_to_state(msg.content.array_records["arrays"])
        expected = subnet_shapes(cpu_cfg, cpu_cache.route_bounds(budgets[pid]))
        assert {k: v.shape for k, v in received.items()} == expected
        cfg = msg.content.config_records["config"]
        assert Subnet(cfg["bounds-d"], cfg["bounds-e"], cfg["bounds-w"]) == cpu_cache.route_bounds(budgets[pid])

    # every client returns its slice filled with (pid + 1); weights 1, 2, 3 by num-examples
    replies = []
    for msg in messages:
        pid = msg.metadata.dst_node_id - 100
        received = record_to_state(msg.content.array_records["arrays"])
        replies.append(_reply(msg, {k: np.full_like(v, pid + 1.0) for k, v in received.items()}, pid + 1))
    record, metrics = strategy.aggregate_train(1, replies)
    merged = record_to_state(record)
    full_shapes = subnet_shapes(cpu_cfg, cpu_cfg.max_subnet())
    checked = 0
    for name, full_shape in full_shapes.items():
        corner_values = []
        for index in [(0,) * len(full_shape), tuple(n - 1 for n in full_shape)]:
            covering = [
                pid
                for pid, b in budgets.items()
                if name in subnet_shapes(cpu_cfg, cpu_cache.route_bounds(b))
                and all(i < n for i, n in zip(index, subnet_shapes(cpu_cfg, cpu_cache.route_bounds(b))[name]))
            ]
            # hand computation: value pid+1 with weight pid+1
            expected = (
                sum((p + 1) ** 2 for p in covering) / sum(p + 1 for p in covering) if covering else init[name][index]
            )
            assert merged[name][index] == pytest.approx(expected, rel=1e-6), (name, index, covering)
            corner_values.append(len(covering))
        checked += corner_values[0] != corner_values[1]
    assert checked > 5  # many tensors are covered unevenly, so the check above exercised real overlaps
    assert metrics["bytes-down"] == metrics["bytes-up"] > 0


def test_strategy_rejects_out_of_bounds_reply_and_fails_below_min_replies(flower_ids, cpu_cfg, cpu_cache):
    budgets = {0: cpu_cache.min_macs, 1: cpu_cache.min_macs}
    strategy = _strategy(cpu_cfg, cpu_cache, budgets, min_reply_fraction=0.5)
    full = {
        k: v.numpy() for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")
    }
    messages = list(strategy.configure_train(1, state_to_record(full), ConfigRecord(), grid=None))
    good = record_to_state(messages[0].content.array_records["arrays"])
    good = {k: v + 1 for k, v in good.items()}
    hostile = slice_subnet(cpu_cfg, full, cpu_cfg.max_subnet())  # beyond what was routed
    replies = [_reply(messages[0], good, 10), _reply(messages[1], hostile, 10)]
    record, metrics = strategy.aggregate_train(1, replies)
    assert metrics["rejected"] == 1
    merged = record_to_state(record)
    np.testing.assert_allclose(merged["stem_conv.weight"][:8], good["stem_conv.weight"], rtol=1e-6)
    np.testing.assert_array_equal(merged["stem_conv.weight"][8:], full["stem_conv.weight"][8:])

    strict = _strategy(cpu_cfg, cpu_cache, budgets, min_reply_fraction=1.0)
    messages = list(strict.configure_train(1, state_to_record(full), ConfigRecord(), grid=None))
    with pytest.raises(RuntimeError, match="valid replies"):
        strict.aggregate_train(1, [_reply(messages[0], good, 10), _reply(messages[1], hostile, 10)])
