"""FIARSE against hand computations: per-element MAC costs, one global threshold per level (a direct search over
every candidate threshold), the masked gradient rule, the client's masked training, and partial averaging over the
clients whose mask kept each element."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from clients.fiarse import MagnitudeMask, masked_train_costs, masked_weight_grad, train_masked
from fl_app.data.images import ImageData
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import count_macs
from fl_app.run.payload import payload_bytes, record_to_state, state_to_record
from fl_app.supernet.magnitude_masks import element_macs, kept_macs, level_thresholds, magnitude_mask
from strategies.fiarse import FiarseStrategy
from tests.harness.training import plain_settings
from tests.test_hostile_supernet import CACHE, TINY
from tests.test_routing_budgets import _reply


def _state(cfg, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return {k: v.numpy() for k, v in ElasticResNet(cfg).state_dict().items() if not k.endswith("num_batches_tracked")}


def _direct_mask(state: dict, costs: dict, budget: float) -> dict:
    """The largest set ``|w| >= t`` over all masked tensors whose MACs fit ``budget``, found by trying every
    candidate threshold (each distinct magnitude, and 0 for everything)."""
    values = np.concatenate([np.abs(state[n]).ravel() for n in costs])
    for t in [0.0, *np.unique(values)]:  # ascending: the first that fits keeps the most
        mask = {n: np.abs(state[n]) >= np.float32(t) for n in costs}
        if sum(int(m.sum()) * costs[n] for n, m in mask.items()) <= budget:
            return mask
    return {n: np.zeros(np.shape(state[n]), bool) for n in costs}


def test_element_costs_add_up_to_the_model_macs(cpu_cfg):
    for cfg in (cpu_cfg, TINY):
        costs = element_macs(cfg)
        shapes = {k: v.shape for k, v in _state(cfg).items()}
        assert sum(costs[n] * int(np.prod(shapes[n])) for n in costs) == count_macs(cfg, cfg.max_subnet())
        assert not any("bn" in n for n in costs)  # BatchNorm is never masked
        assert costs["classifier.bias"] == 0 and costs["classifier.weight"] == 1


def test_hand_made_threshold_drops_a_tie_that_does_not_fit():
    state = {"a": np.array([3.0, -2.0, 1.0], np.float32), "b": np.array([[-2.0, 0.5]], np.float32)}
    costs = {"a": 1, "b": 2}
    # largest first: 3 (1 MAC), then the tie at |2| costs 1 + 2: with budget 3 the tie does not fit as a whole
    (t3, t4, t10) = level_thresholds(state, costs, [3, 4, 10])
    assert magnitude_mask(state, costs, t3)["a"].tolist() == [True, False, False]
    assert magnitude_mask(state, costs, t3)["b"].tolist() == [[False, False]]
    assert magnitude_mask(state, costs, t4)["a"].tolist() == [True, True, False]
    assert magnitude_mask(state, costs, t4)["b"].tolist() == [[True, False]]
    assert t10 == 0.0  # everything (7 MACs) fits


@pytest.mark.parametrize("seed", [0, 1])
def test_masks_per_level_equal_the_direct_global_threshold(seed):
    strategy = FiarseStrategy(
        TINY, CACHE, {0: CACHE.min_macs, 1: CACHE.max_macs}, {0: 10, 1: 11}, clients_per_round=2, seed=0,
        levels=[c.macs for c in CACHE.entries],
    )  # fmt: skip
    state = _state(TINY, seed)
    thresholds, masks = strategy.level_masks(state)
    assert len(masks) == len(CACHE.entries) == 3
    for level, mask in zip(strategy.tiers, masks):
        direct = _direct_mask(state, strategy.costs, level.macs)
        assert mask.keys() == direct.keys()
        assert all(np.array_equal(mask[n], direct[n]) for n in mask), level.macs
        assert kept_macs(mask, strategy.costs) <= level.macs
    assert thresholds[-1] == 0.0 and all(m.all() for m in masks[-1].values())  # the full level keeps everything
    kept = [sum(int(m.sum()) for m in mask.values()) for mask in masks]
    assert kept[0] < kept[1] < kept[2]


def test_masked_gradient_rule_on_a_tiny_tensor():
    w = torch.tensor([0.5, -0.2, 0.05, -1.0, 0.19], requires_grad=True)
    c = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    out = MagnitudeMask(0.2)(w)
    assert out.tolist() == pytest.approx([0.5, -0.2, 0.0, -1.0, 0.0])
    (c * out).sum().backward()
    assert w.grad.tolist() == [1.0, 2.0, 0.0, 4.0, 0.0]  # the gradient of the masked value, times the mask
    assert torch.equal(masked_weight_grad(w.detach(), c, 0.2), w.grad)


def test_the_reference_mask_function_applies_no_surrogate_derivative():
    """A mask function returning a boolean (as the reference's does) is not differentiated: its backward, here the
    surrogate 2t / (|w| + t)^2, never runs, so the weight's gradient is the masked one."""
    calls = []

    class BoolMask(torch.autograd.Function):
        @staticmethod
        def forward(ctx, scores, threshold):
            ctx.save_for_backward(scores, threshold)
            return scores >= threshold

        @staticmethod
        def backward(ctx, grad):
            calls.append(1)
            scores, threshold = ctx.saved_tensors
            return grad * 2 * threshold / (scores + threshold) ** 2, None

    w = torch.tensor([0.5, -0.2, 0.05, -1.0], requires_grad=True)
    c = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (c * w * BoolMask.apply(w.abs(), torch.tensor(0.2))).sum().backward()
    assert calls == [] and torch.equal(w.grad, masked_weight_grad(w.detach(), c, 0.2))


def test_masked_training_keeps_the_mask_and_the_tensor_names():
    cfg = TINY
    state = _state(cfg)
    costs = element_macs(cfg)
    (threshold,) = level_thresholds(state, costs, [CACHE.min_macs])
    mask = magnitude_mask(state, costs, threshold)
    sent = {k: np.where(mask[k], v, np.float32(0)) if k in mask else v for k, v in state.items()}
    model = ElasticResNet(cfg)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sent.items()}, strict=False)
    gen = torch.Generator().manual_seed(0)
    data = ImageData(
        torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=gen),
        torch.randint(0, 10, (16,), generator=gen),
    )
    settings = plain_settings()
    metrics = train_masked(model, threshold, data, settings)
    assert metrics["local-steps"] == 2
    trained = {k: v.numpy() for k, v in model.state_dict().items()}
    assert set(trained) == set(state) | {k for k in trained if k.endswith("num_batches_tracked")}  # no extra names
    for name, keep in mask.items():
        assert np.all(trained[name][~keep] == 0), name  # outside the mask: never trained (sent as zero)
    assert any(not np.array_equal(trained[n][mask[n]], sent[n][mask[n]]) for n in mask)  # the kept ones were
    costs_metrics = masked_train_costs(cfg, sent, threshold, 16)
    assert costs_metrics["trained-macs"] == kept_macs(mask, costs) <= CACHE.min_macs
    assert costs_metrics["train-flops"] == 6 * kept_macs(mask, costs) * 16


def test_partial_averaging_by_hand(flower_ids):
    """Three clients at two levels, each replying one constant everywhere (outside its mask too): every element is
    the example-weighted mean over the clients whose mask kept it; an element none kept keeps its global value."""
    budgets = {0: CACHE.min_macs, 1: CACHE.entries[1].macs, 2: CACHE.entries[1].macs}
    examples = {0: 50, 1: 70, 2: 90}
    strategy = FiarseStrategy(
        TINY, CACHE, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0,
        levels=[c.macs for c in CACHE.entries],
    )  # fmt: skip
    state = _state(TINY)
    state["classifier.weight"][0, 0] = 5.0  # the largest magnitude: every level keeps it
    messages = strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None)
    assert len(messages) == 3
    thresholds, masks = strategy.level_masks(state)
    low, mid = masks[0], masks[1]
    replies = []
    for msg in messages:
        pid = msg.metadata.dst_node_id - 10
        received = record_to_state(msg.content.array_records["arrays"])
        level = 0 if pid == 0 else 1
        assert msg.content.config_records["config"]["mask-threshold"] == thresholds[level]
        for name, keep in masks[level].items():  # dense tensors, zero outside the client's mask
            assert np.array_equal(received[name], np.where(keep, state[name], 0)), name
        assert not any(k.endswith(("running_mean", "running_var")) for k in received)  # static BatchNorm
        replies.append(_reply(msg, {k: np.full_like(v, pid + 1.0) for k, v in received.items()}, examples[pid]))
    _, metrics = strategy.aggregate_train(1, replies)
    merged = strategy.global_state
    # dense: every client gets (and returns) every parameter tensor of the full model, its mask's zeros included
    dense = payload_bytes(strategy.routed_shapes(TINY.max_subnet()), "float32")
    assert metrics["bytes-down"] == metrics["bytes-up"] == 3 * dense and metrics["replies"] == 3

    all_three = (50 * 1 + 70 * 2 + 90 * 3) / 210
    clients_1_2 = (70 * 2 + 90 * 3) / 160
    assert merged["classifier.weight"][0, 0] == pytest.approx(all_three)
    assert np.allclose(merged["stem_bn.weight"], all_three)  # BatchNorm: every client covers it
    assert np.array_equal(merged["stem_bn.running_var"], state["stem_bn.running_var"])  # never sent, unchanged
    name = next(n for n in mid if (mid[n] & ~low[n]).any())
    only_mid, none = mid[name] & ~low[name], ~mid[name]
    assert only_mid.any() and none.any()
    assert np.allclose(merged[name][only_mid], clients_1_2)
    assert np.array_equal(merged[name][none], state[name][none])  # no client kept it: the global value
    assert np.allclose(merged[name][low[name]], all_three)


def test_a_run_resumed_from_its_checkpoint_state_continues_exactly(flower_ids):
    """The masks come from the global state each round, so the checkpointed state is all a resumed run needs."""
    budgets = {0: CACHE.min_macs, 1: CACHE.entries[1].macs, 2: CACHE.max_macs}

    def make():
        return FiarseStrategy(
            TINY, CACHE, budgets, {p: 10 + p for p in budgets}, clients_per_round=2, seed=0,
            levels=[c.macs for c in CACHE.entries],
        )  # fmt: skip

    def run(strategy, initial: dict, first: int, last: int) -> dict:
        class Grid:  # answers at once: the received tensors moved by a client/round constant
            def get_node_ids(self):
                return list(strategy.node_of_partition.values())

            def send_and_receive(self, messages, timeout):
                replies = []
                for m in messages:
                    pid, rnd = m.metadata.dst_node_id - 10, m.content.config_records["config"]["server-round"]
                    received = record_to_state(m.content.array_records["arrays"])
                    moved = {k: 0.9 * v + 0.01 * (pid + rnd) for k, v in received.items()}
                    replies.append(_reply(m, moved, 10 * (pid + 1)))
                return replies

        strategy.start(Grid(), state_to_record(initial), num_rounds=last, first_round=first)
        return strategy.global_state

    initial = _state(TINY)
    final = run(make(), initial, 1, 4)
    first = make()
    after_two = run(first, initial, 1, 2)
    resumed = make()
    resumed.restore_state(first.checkpoint_state())
    continued = run(resumed, after_two, 3, 4)
    for k in final:
        np.testing.assert_array_equal(continued[k], final[k], err_msg=k)
    assert not np.array_equal(after_two["stem_conv.weight"], final["stem_conv.weight"])  # rounds 3-4 did work


@pytest.mark.parametrize("threshold, fragment", [(None, "is missing"), (-0.1, "must be"), (float("nan"), "expected")])
def test_a_bad_mask_threshold_is_refused_naming_it(flower_ids, threshold, fragment):
    from fl_app.supernet_app import train_supernet_client
    from tests.test_client_broadcast import NUM, _honest, _resent

    run, _, pid, message = _honest("fiarse")
    with pytest.raises(ValueError, match=f"client {pid} refuses .*config 'mask-threshold'.*{fragment}"):
        train_supernet_client(_resent(message, **{"mask-threshold": threshold}), run, pid, NUM, context=None)


def test_other_methods_refuse_a_mask_threshold(flower_ids):
    from fl_app.supernet_app import train_supernet_client
    from tests.test_client_broadcast import NUM, _honest, _resent

    run, _, pid, message = _honest("heterofl")
    with pytest.raises(ValueError, match="config 'mask-threshold'=0.5: allowed: \\[\\]"):
        train_supernet_client(_resent(message, **{"mask-threshold": 0.5}), run, pid, NUM, context=None)
