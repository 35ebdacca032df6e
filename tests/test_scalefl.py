"""ScaleFL against hand computations: levels that fit their budgets and nest in depth and width, exits that leave the
backbone's arithmetic alone, the self-distillation loss, and the aggregation of levels and exits over their holders."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from clients.scalefl import KD_WEIGHT, TEMPERATURE, self_distillation_loss
from clients.supernet_instruction import read_instruction
from fl_app.data.images import ImageData
from fl_app.models.early_exit import (
    SCALEFL_RATES,
    EarlyExitResNet,
    level_shapes,
    level_targets,
    scalefl_config,
    scalefl_levels,
    truncated,
)
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import count_costs, load_supernet_config
from fl_app.run.config import validate_run_config
from fl_app.run.payload import payload_bytes, record_to_state, state_to_record
from fl_app.supernet.evaluation import evaluate_subnet
from fl_app.supernet.shared_setup import SupernetSetup
from fl_app.supernet.slicing import is_prefix_shape
from fl_app.supernet_app import make_supernet_strategy, train_supernet_client
from strategies.scalefl import ScaleFLStrategy, evaluate_level
from tests.harness.training import answered_round, one_step_federation
from tests.test_client_broadcast import _resent
from tests.test_routing_budgets import _reply


@pytest.mark.parametrize("name", ["cpu", "paper"])
def test_levels_fit_their_budgets_and_nest_in_depth_and_width(name):
    cfg = scalefl_config(load_supernet_config(name))
    levels, targets = scalefl_levels(cfg), level_targets(cfg)
    per_stage = 1 + cfg.max_extra_blocks_per_stage
    assert len(levels) == len(targets) == 5
    assert levels[-1].arch == cfg.max_subnet() and levels[-1].macs == targets[-1]  # the whole model
    for level, target in zip(levels, targets):
        assert level.macs <= target
        # MACs of the deepest exit's path: the backbone cut after the level's last stage, with its own classifier
        assert (level.macs, level.params) == count_costs(*truncated(cfg, level.arch, level.stages))
        assert level.blocks == per_stage * (level.stages - 1) + level.last_stage_blocks
        assert all(d == 0 for d in level.arch.d[level.stages :])  # stages it does not run
    for small, large in zip(levels, levels[1:]):
        # a prefix in depth (blocks run, stage by stage) and in width, and smaller in at least one of them
        assert small.blocks <= large.blocks and small.arch.w <= large.arch.w and small.arch.within(large.arch)
        assert (small.blocks, small.arch.w) != (large.blocks, large.arch.w) and small.macs < large.macs
        shapes, larger = level_shapes(cfg, small.arch), level_shapes(cfg, large.arch)
        assert set(shapes) < set(larger)  # the larger level holds every tensor and one more exit
        assert all(is_prefix_shape(shapes[k], larger[k]) for k in shapes)
    for level in levels[:-1]:  # depth and width scaled together
        assert level.blocks < per_stage * cfg.num_stages and SCALEFL_RATES[level.arch.w[0]] < 1.0


def test_exits_leave_the_backbone_arithmetic_alone(cpu_cfg):
    """The global model is the elastic ResNet plus exit heads: same tensor names, and its deepest exit computes
    exactly what ElasticResNet's own forward computes; level i returns i + 1 exits."""
    cfg = scalefl_config(cpu_cfg)
    top = len(scalefl_levels(cfg)) - 1
    torch.manual_seed(0)
    model = EarlyExitResNet(cfg, top).eval()
    backbone = ElasticResNet(cfg).eval()
    extra = set(model.state_dict()) - set(backbone.state_dict())
    assert set(backbone.state_dict()) <= set(model.state_dict())
    assert extra == {f"exits.{j}.{p}" for j in range(top) for p in ("weight", "bias")}
    backbone.load_state_dict({k: v for k, v in model.state_dict().items() if k not in extra})
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        outputs = model(x)
        assert len(outputs) == top + 1
        assert torch.equal(outputs[-1], backbone(x))
    for index in range(top):
        assert len(EarlyExitResNet(cfg, index)(x)) == index + 1


def test_self_distillation_loss_equals_a_hand_computation():
    logits = [
        torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]]),
        torch.tensor([[0.0, 2.0, 0.0], [1.0, -1.0, 0.5]]),
        torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]]),
    ]
    targets = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.3, 0.7]])  # soft, as after Mixup

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    z = [t.numpy().astype(np.float64) for t in logits]
    y = targets.numpy().astype(np.float64)
    teacher = softmax(z[-1] / TEMPERATURE)
    total = 0.0
    for i, zi in enumerate(z, start=1):
        ce = float(np.mean(-(y * np.log(softmax(zi))).sum(axis=1)))
        kl = 0.0
        if i < len(z):
            kl = float(np.mean((teacher * (np.log(teacher) - np.log(softmax(zi / TEMPERATURE)))).sum(axis=1)))
        total += i * (ce + KD_WEIGHT * TEMPERATURE**2 * kl)
    expected = total / (3 * 4)
    assert float(self_distillation_loss(logits, targets)) == pytest.approx(expected, rel=1e-6)
    # one exit: its plain cross-entropy, halved by the 1 / (l (l + 1)) normalisation
    ce = float(np.mean(-(y * np.log(softmax(z[0]))).sum(axis=1)))
    assert float(self_distillation_loss(logits[:1], targets)) == pytest.approx(ce / 2, rel=1e-6)
    # the teacher is detached: the deepest exit's gradient comes from its own cross-entropy only
    leaves = [t.clone().requires_grad_() for t in logits]
    self_distillation_loss(leaves, targets).backward()
    own = torch.softmax(leaves[-1].detach(), 1) - targets
    assert torch.allclose(leaves[-1].grad, 3 / 12 * own / 2, atol=1e-7)


def _initial(strategy: ScaleFLStrategy) -> dict:
    torch.manual_seed(0)
    return {
        k: v.numpy() for k, v in strategy.global_model().state_dict().items() if not k.endswith("num_batches_tracked")
    }


def test_aggregation_averages_each_element_over_the_levels_that_hold_it(flower_ids, cpu_cfg, cpu_cache):
    cfg = scalefl_config(cpu_cfg)
    levels = scalefl_levels(cfg)
    budgets = {0: float(levels[0].macs), 1: float(levels[2].macs) + 1, 2: float(levels[4].macs)}
    strategy = ScaleFLStrategy(cpu_cfg, cpu_cache, budgets, {p: 10 + p for p in budgets}, clients_per_round=3, seed=0)
    state = _initial(strategy)
    messages = sorted(
        strategy.configure_train(1, state_to_record(state), ConfigRecord(), grid=None),
        key=lambda m: m.metadata.dst_node_id,
    )
    level_of = {0: 0, 1: 2, 2: 4}
    value, examples = {0: 1.0, 1: 2.0, 2: 6.0}, {0: 10, 1: 30, 2: 60}
    replies, sent = [], 0
    for pid, msg in enumerate(messages):
        received = record_to_state(msg.content.array_records["arrays"])
        shapes = level_shapes(cfg, levels[level_of[pid]].arch)
        assert {k: v.shape for k, v in received.items()} == shapes  # the level and its exits, nothing else
        assert not any(k.endswith("running_var") for k in received)  # static BatchNorm
        sent += payload_bytes(shapes, "float32")
        replies.append(_reply(msg, {k: np.full_like(v, value[pid]) for k, v in received.items()}, examples[pid]))
    record, metrics = strategy.aggregate_train(1, replies)
    assert metrics["rejected"] == 0 and metrics["bytes-down"] == metrics["bytes-up"] == sent
    merged = record_to_state(record)

    def average(holders):
        return sum(examples[p] * value[p] for p in holders) / sum(examples[p] for p in holders)

    stem = {p: cfg.stem_channels(levels[level_of[p]].arch) for p in level_of}
    assert stem[0] < stem[1] < stem[2] == merged["stem_conv.weight"].shape[0]
    assert merged["stem_conv.weight"][0, 0, 0, 0] == pytest.approx(average([0, 1, 2]))  # held by every level
    assert merged["stem_conv.weight"][stem[0], 0, 0, 0] == pytest.approx(average([1, 2]))  # wider than level 0
    assert merged["stem_conv.weight"][stem[2] - 1, 0, 0, 0] == pytest.approx(average([2]))  # the full width only
    # depth: the first block of the last stage is run by the full model only
    assert np.all(merged["stages.3.0.conv1.weight"] == np.float32(average([2])))
    assert np.all(merged["classifier.weight"] == np.float32(average([2])))  # the deepest exit
    # exits: exit 0 (after level 0's last block) is held by all three, at each one's width
    c0 = merged["exits.0.weight"].shape[1]
    width0 = cfg.stage_channels(levels[0].arch, levels[0].stages - 1)
    width1 = cfg.stage_channels(levels[2].arch, levels[0].stages - 1)
    assert width0 < width1 < c0
    assert merged["exits.0.weight"][0, 0] == pytest.approx(average([0, 1, 2]))
    assert merged["exits.0.weight"][0, width0] == pytest.approx(average([1, 2]))
    assert merged["exits.0.weight"][0, c0 - 1] == pytest.approx(average([2]))
    assert merged["exits.0.bias"] == pytest.approx([average([0, 1, 2])] * 10)
    assert merged["exits.2.bias"] == pytest.approx([average([1, 2])] * 10)  # levels 2 and 4 hold exit 2
    assert merged["exits.3.bias"] == pytest.approx([average([2])] * 10)
    # exit 1 is held by the clients at levels 2 and 4 only (no client at level 1)
    assert merged["exits.1.bias"] == pytest.approx([average([1, 2])] * 10)
    # running statistics are not aggregated: they keep their initial values
    assert np.array_equal(merged["stem_bn.running_var"], state["stem_bn.running_var"])


def test_a_client_refuses_bounds_that_are_no_level(flower_ids):
    run = validate_run_config({"method": "scalefl", "clients-per-round": 2, "max-local-steps": 1, "batch-size": 8})
    setup = SupernetSetup.build(run, 4)
    strategy = make_supernet_strategy(run, setup, setup.client_budgets(run, {}), {p: 100 + p for p in range(4)})
    message = strategy.configure_train(1, state_to_record(_initial(strategy)), ConfigRecord(), grid=None)[0]
    pid = message.metadata.dst_node_id - 100
    instruction = read_instruction(message.content, run, setup.cfg, setup.budget_range, pid, 4)
    assert instruction.arch in [level.arch for level in strategy.levels]
    config = message.content.config_records["config"]
    other = [w + 1 for w in config["bounds-w"]]  # a wider subnet of the ScaleFL config that no level encodes
    with pytest.raises(ValueError, match="not one of ScaleFL's levels"):
        read_instruction(
            _resent(message, **{"bounds-w": other, "arch-w": other}).content, run, setup.cfg, setup.budget_range, pid, 4
        )


def test_real_clients_train_their_levels_and_the_server_accepts_them(flower_ids):
    num = 4
    run, setup, strategy = one_step_federation(num, method="scalefl")
    state = _initial(strategy)
    answered = answered_round(
        strategy, state_to_record(state), lambda m, pid: train_supernet_client(m, run, pid, num, None)
    )
    replies = [reply for _, reply in answered]
    for reply in replies:
        metrics = reply.content.metric_records["metrics"]
        assert metrics["local-steps"] == 1 and math.isfinite(metrics["train-loss"]) and metrics["train-flops"] > 0
    record, _ = strategy.aggregate_train(1, replies)
    assert strategy.rounds[1].accepted == list(range(num)) and strategy.rounds[1].rejected == []
    merged = record_to_state(record)
    assert any(not np.array_equal(merged[k], state[k]) for k in state)


def test_a_level_is_scored_at_its_deepest_exit(cpu_cfg, cpu_cache):
    """The full level's score is the backbone's own (its deepest exit is the classifier); every level is scored."""
    strategy = ScaleFLStrategy(cpu_cfg, cpu_cache, {0: cpu_cache.max_macs}, {0: 10}, clients_per_round=1, seed=0)
    cfg, state = strategy.model_cfg, _initial(strategy)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=generator)
    data = ImageData(images, torch.randint(0, 10, (64,), generator=generator))
    calibration, test = data.subset(range(32)), data.subset(range(32, 64))
    top = strategy.levels[-1].arch
    assert evaluate_level(cfg, state, top, calibration, test) == evaluate_subnet(cfg, state, top, calibration, test)
    for level in strategy.levels[:-1]:
        (score,) = evaluate_level(cfg, state, level.arch, calibration, test)
        assert 0.0 <= score <= 1.0
