"""Hostile clients against FEAST and its five supernet / width-sliced baselines: one of three clients answers every
round with each kind of bad reply (tests/hostile.py); the run completes under min-reply-fraction and the global
model stays finite and equal to the run in which that client never answers. Strategies are built by the app's own
wiring (``make_supernet_strategy``) on a tiny supernet."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, SupernetConfig, width_sliced_config
from fl_app.run.config import SUPERNET_METHODS, validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.slicing import slice_state, subnet_shapes
from fl_app.supernet.subnets import SubnetCache
from fl_app.supernet_app import make_supernet_strategy
from tests.hostile import Corruption, check_hostile, node_of, run_rounds, set_value_corruption, standard_corruptions

TINY = SupernetConfig.from_dict(
    {
        "num_stages": 1,
        "max_extra_blocks_per_stage": 1,
        "original_stem_out_channels": 8,
        "original_stage_base_channels": [16],
        "initial_input_hw": 8,
        "initial_input_channels": 3,
        "stem_stride": 1,
        "stage_downsample_factors": [2],
        "channel_divisible_by": 4,
        "n_classes": 10,
        "width_multiplier_choices": [0.5, 1.0],
        "expansion_ratio_choices": [0.5, 1.0],
    },
    name="tiny",
)
CACHE = SubnetCache(TINY, [TINY.min_subnet(), Subnet((1,), (0.5,), (1, 0)), TINY.max_subnet()])
BUDGETS = {0: CACHE.min_macs, 1: CACHE.entries[1].macs, 2: CACHE.max_macs}  # client 0: the strictest slice
EXAMPLES = {0: 50, 1: 70, 2: 90}
LABELS = {0: [0, 1, 2], 1: [1, 3, 5, 7], 2: list(range(10))}
PAYLOAD = {"feast": "bfloat16"}  # one method runs with a bfloat16 payload, the int16 wire path
METHODS = sorted(SUPERNET_METHODS)


def test_the_matrix_covers_every_supernet_method():
    assert METHODS == ["deepfednas", "feast", "fedavg-min", "fedrolex", "fiarse", "heterofl", "scalefl", "superfednas"]


def supernet_setup(method: str):
    payload = PAYLOAD.get(method, "float32")

    def make_strategy(min_reply_fraction: float):
        run = validate_run_config(
            {
                "method": method,
                "seed": 0,
                "num-server-rounds": 2,
                "clients-per-round": 3,
                "min-reply-fraction": min_reply_fraction,
                "payload-dtype": payload,
            }
        )
        return make_supernet_strategy(
            run, SimpleNamespace(cfg=TINY, cache=CACHE), BUDGETS, {p: node_of(p) for p in BUDGETS}, EXAMPLES, LABELS
        )

    def honest(msg: Message, pid: int) -> RecordDict:
        """Deterministic stand-in for train_supernet_client: the received slice (cut to the assigned subnet) moved by a
        client/round constant, and the metrics a client reports."""
        config = msg.content.config_records["config"]
        received = record_to_state(msg.content.array_records["arrays"], payload)
        if "arch-d" in config and config.get("model") != "early-exit":  # a ScaleFL level comes back whole
            cfg = width_sliced_config(TINY) if config.get("model", "supernet") == "width-sliced" else TINY
            arch = Subnet(config["arch-d"], config["arch-e"], config["arch-w"])
            received = slice_state(received, {k: v for k, v in subnet_shapes(cfg, arch).items() if k in received})
        shift = 0.1 * (pid + 1) + 0.01 * config["server-round"]
        trained = {k: 0.5 * v + shift for k, v in received.items()}
        return RecordDict(
            {
                "arrays": state_to_record(trained, payload),
                "metrics": MetricRecord(
                    {
                        "num-examples": EXAMPLES[pid],
                        "labels": LABELS[pid],
                        "train-loss": 1.0 + pid,
                        "client-seconds": 0.5,
                    }
                ),
            }
        )

    torch.manual_seed(0)
    model = make_strategy(1.0).global_model()
    initial = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    return make_strategy, state_to_record(initial), honest, payload


def _first_running_var(record) -> str:
    return next(name for name in record.keys() if name.endswith("running_var"))


def supernet_corruptions(method: str, payload: str, make_strategy) -> list[Corruption]:
    """The standard corruptions (the server knows every partition's labels) and, for the methods whose replies
    carry BatchNorm statistics, a negative running variance (within the magnitude bound)."""
    corruptions = standard_corruptions(10, payload_dtype=payload, exact_labels=True)
    strategy = make_strategy(1.0)
    if any(name.endswith("running_var") for name in strategy.routed_shapes(strategy.model_cfg.max_subnet())):
        corruptions.append(set_value_corruption("negative-running-var", -1.0, _first_running_var))
    return corruptions


def test_the_matrix_holds_the_decoding_and_derived_value_cases():
    for method in METHODS:
        make_strategy, _, _, payload = supernet_setup(method)
        names = {c.name for c in supernet_corruptions(method, payload, make_strategy)}
        assert {"header-claims-a-huge-shape", "labels-a-class-not-held", "train-loss-above-ceiling"} <= names
        static_bn = ("heterofl", "fedrolex", "fiarse", "scalefl")
        assert ("negative-running-var" in names) == (method not in static_bn), method


@pytest.mark.parametrize("method", METHODS)
def test_one_hostile_client_of_three_changes_nothing(flower_ids, method):
    make_strategy, initial, honest, payload = supernet_setup(method)
    reference = run_rounds(make_strategy, initial, honest, (0, 1, 2), 2, 0.6, silent=[0])
    clean = run_rounds(make_strategy, initial, honest, (0, 1, 2), 2, 0.6)
    # the reference did real work: two honest replies moved the model, and the third client would have too
    assert any(not np.array_equal(reference.global_state[k], clean.global_state[k]) for k in clean.global_state)
    outcomes = {}
    for corruption in supernet_corruptions(method, payload, make_strategy):
        strategy, _ = check_hostile(
            make_strategy, initial, honest, lambda s: s.global_state, corruption, reference=reference
        )
        outcomes[corruption.name] = corruption.counted
    assert len(outcomes) >= 40


@pytest.mark.parametrize("method", ["feast", "heterofl", "fiarse"])
def test_below_min_reply_fraction_the_round_fails_with_the_reasons(flower_ids, method):
    make_strategy, initial, honest, payload = supernet_setup(method)
    nan = next(c for c in standard_corruptions(payload_dtype=payload) if c.name == "nan")
    with pytest.raises(RuntimeError, match=r"round 1: 2 valid replies of 3 sampled .* rejected: \[0\]"):
        run_rounds(make_strategy, initial, honest, (0, 1, 2), 2, 1.0, hostile=0, corruption=nan)


def test_honest_training_stays_far_inside_the_magnitude_bound(cpu_cfg, cpu_cache):
    """Real local training of the full cpu supernet at ten times the default learning rate moves no tensor beyond
    a tenth of the bound (worst seen: BatchNorm running variance, 1.9x its global scale), so the bound that refuses
    1e37 refuses no honest reply."""
    from clients.feast import plan_subnets, train_subnets
    from strategies.screening import RELATIVE_BOUND, magnitude_bound, state_problem
    from tests.harness.training import feast_settings, random_images

    data = random_images(64)
    torch.manual_seed(0)
    bounds = cpu_cache.route_bounds(cpu_cache.max_macs)
    model = ElasticResNet(cpu_cfg, bounds)
    before = {k: v.clone().numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    settings = feast_settings(max_steps=4, batch_size=16, lr=0.5)
    train_subnets(model, plan_subnets(cpu_cache, cpu_cache.max_macs, bounds, ("max", "min", "random")), data, settings)
    after = {k: v.numpy() for k, v in model.state_dict().items() if k in before}
    assert any(not np.array_equal(after[k], before[k]) for k in before)
    assert state_problem(after, before) is None
    worst = max(np.abs(after[k]).max() / max(1.0, np.abs(before[k]).max()) for k in before)
    assert 1.0 < worst < RELATIVE_BOUND / 10
    assert state_problem({"w": np.full(3, 1e37, np.float32)}, {"w": np.ones(3)}) is not None
    assert magnitude_bound(np.full(3, 1e30, np.float32)) == 1e6  # the ceiling keeps float32 sums finite
