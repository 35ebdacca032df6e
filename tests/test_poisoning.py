"""Poisoning of the supernet family: a reply may not scale the global slice it was sent (the relative screen,
``screening.SLICE_RELATIVE_BOUND``), and the optional robust merges (``strategies.robust``, run-config
``robust-aggregation``) keep one poisoning client of eight from owning the model, while the default merge stays
the sparse average bit for bit."""

from __future__ import annotations

import hashlib
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, Message, MetricRecord, RecordDict

from experiments.runner.flower_internals import message_identity, set_message_id, set_reply_source
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.run.config import ROBUST_AGGREGATIONS, validate_run_config
from fl_app.run.payload import record_to_state, state_to_record
from fl_app.supernet.shared_setup import SupernetSetup
from fl_app.supernet.slicing import prefix_region
from fl_app.supernet_app import make_supernet_strategy, partition_reports, train_supernet_client
from strategies.robust import AGGREGATIONS, TRIM_FRACTION
from strategies.screening import SLICE_RELATIVE_BOUND, magnitude_bound, slice_relative_bound
from strategies.sparse import sparse_average
from tests.hostile import Corruption, check_hostile, node_of, run_rounds
from tests.test_hostile_supernet import CACHE, METHODS, TINY, supernet_setup


# -- the relative screen -------------------------------------------------------------------------------------------
def _scaled_reply(payload: str, change) -> Corruption:
    """A reply whose every array is ``change(honest array)`` (re-encoded in the run's payload dtype)."""

    def corrupt(content: RecordDict, msg: Message) -> RecordDict:
        copy = RecordDict(dict(content))
        state = record_to_state(content.array_records["arrays"], payload)
        copy["arrays"] = state_to_record({k: change(v) for k, v in state.items()}, payload)
        return copy

    return Corruption("scaled", corrupt)


@pytest.mark.parametrize("method", METHODS)
def test_a_reply_that_scales_the_model_is_refused(flower_ids, method):
    """999 times the honest reply (every tensor), and every element at 990 (inside the absolute bound of 1,000 times
    max(1, scale)), were both accepted; now both are refused and the global model is the one without that client."""
    make_strategy, initial, honest, payload = supernet_setup(method)
    reference = run_rounds(make_strategy, initial, honest, (0, 1, 2), 2, 0.6, silent=[0])
    for change in (lambda v: 999.0 * v, lambda v: np.full_like(v, 990.0)):
        check_hostile(
            make_strategy,
            initial,
            honest,
            lambda s: s.global_state,
            _scaled_reply(payload, change),
            reference=reference,
        )


def test_the_refusal_names_the_tensor_and_the_relative_bound(flower_ids):
    make_strategy, initial, honest, _ = supernet_setup("heterofl")
    strategy = run_rounds(make_strategy, initial, honest, (0, 1, 2), 1, 1.0)
    shapes = strategy.reply_shapes(2)
    view = strategy._round_view(1)
    name = next(n for n in shapes if n.endswith("conv.weight"))
    reply = {n: np.array(view[n][prefix_region(s)]) for n, s in shapes.items()}
    bound = magnitude_bound(view[name][prefix_region(shapes[name])], SLICE_RELATIVE_BOUND)
    assert strategy.decoded_problem(1, 2, reply) is None  # the global slice itself passes
    reply[name] = reply[name] * 0 + np.float32(1.01 * bound)
    problem = strategy.decoded_problem(1, 2, reply)
    assert problem.startswith(f"'{name}' has magnitude") and f"allowed at most {bound:.3g}" in problem
    assert f"{SLICE_RELATIVE_BOUND:g}x the max-abs of the global slice" in problem


def test_honest_training_stays_far_inside_the_slice_bound(cpu_cfg, cpu_cache):
    """Real local training of a routed cpu slice at ten times the default learning rate (BatchNorm statistics
    included) moves no tensor beyond a fifth of the relative bound of the slice it was sent."""
    from clients.feast import plan_subnets, train_subnets
    from tests.harness.training import feast_settings, random_images

    torch.manual_seed(0)
    bounds = cpu_cache.route_bounds(cpu_cache.entries[len(cpu_cache.entries) // 2].macs)
    model = ElasticResNet(cpu_cfg, bounds)
    before = {k: v.clone().numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    plan = plan_subnets(cpu_cache, cpu_cache.max_macs, bounds, ("max", "min", "random"))
    train_subnets(model, plan, random_images(64), feast_settings(max_steps=4, batch_size=16, lr=0.5))
    after = {k: v.numpy() for k, v in model.state_dict().items() if k in before}
    growth = max(np.abs(after[k]).max() / magnitude_bound(before[k], 1.0) for k in before)
    assert 1.0 < growth < SLICE_RELATIVE_BOUND / 5
    assert max(np.abs(after[k]).max() / slice_relative_bound(k, before[k]) for k in before) < 0.2


class _ClientGrid:
    """Hands each message to the app's own client function (``train_supernet_client``) of its partition, in order."""

    def __init__(self, run, num: int):
        self.run, self.num = run, num

    def get_node_ids(self):
        return [node_of(p) for p in range(self.num)]

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
            pid = msg.metadata.dst_node_id - node_of(0)
            node_config = {"partition-id": pid, "num-partitions": self.num}
            context = Context(
                run_id=1, node_id=node_of(pid), state=RecordDict(), run_config={}, node_config=node_config
            )
            reply = train_supernet_client(msg, self.run, pid, self.num, context)
            set_reply_source(reply, node_of(pid))
            replies.append(reply)
        return replies


@pytest.mark.parametrize("method", METHODS)
def test_real_honest_training_of_every_method_passes_the_screen(flower_ids, method):
    """The app's own clients on the bundled images, the cpu supernet, ten times the default learning rate: every
    reply of two rounds is accepted (ScaleFL's exits, FIARSE's masked tensors, BatchNorm statistics included)."""
    num = 4
    run = validate_run_config(
        {"method": method, "clients-per-round": num, "max-local-steps": 4, "batch-size": 16, "lr": 0.5}
        | {"num-server-rounds": 2, "lr-schedule": "constant"}
    )
    setup = SupernetSetup.build(run, num)
    budgets = setup.client_budgets(run, {})
    examples, held = partition_reports(run, setup, budgets)
    strategy = make_supernet_strategy(run, setup, budgets, {p: node_of(p) for p in range(num)}, examples, held)
    torch.manual_seed(0)
    initial = {k: v for k, v in strategy.global_model().state_dict().items() if not k.endswith("num_batches_tracked")}
    strategy.start(_ClientGrid(run, num), initial_arrays=state_to_record(initial), num_rounds=2, timeout=100.0)
    assert [sorted(log_.accepted) for log_ in strategy.rounds.values()] == [list(range(num))] * 2


# -- the robust merges on tiny tensors -----------------------------------------------------------------------------
GLOBAL = {"w": np.zeros(4, np.float32), "b": np.full((2, 2), 5.0, np.float32)}
# three replies: prefix slices of 4, 4 and 2 elements of w; the second's mask drops w[3]; only the first sends b
REPLIES = [
    ({"w": np.array([1.0, 2.0, 3.0, 4.0], np.float32), "b": np.full((1, 2), 7.0, np.float32)}, 1.0),
    ({"w": np.array([3.0, 6.0, 9.0, 100.0], np.float32)}, 3.0),
    ({"w": np.array([-10.0, 0.0], np.float32)}, 1.0),
]
MASKS = [None, {"w": np.array([True, True, True, False])}, None]


def _merge(kind):
    return AGGREGATIONS[kind](GLOBAL, REPLIES, MASKS)


def test_the_median_is_taken_over_the_replies_covering_each_element():
    merged = _merge("median")
    np.testing.assert_array_equal(merged["w"], [1.0, 2.0, 6.0, 4.0])  # w[2], w[3]: two and one covering values
    np.testing.assert_array_equal(merged["b"], [[7.0, 7.0], [5.0, 5.0]])  # row 1: nobody covers it
    assert merged["w"].dtype == np.float32


def test_the_trimmed_mean_drops_the_extremes_of_each_element():
    assert TRIM_FRACTION == 0.2
    five = [({"w": np.array([v, v], np.float32)}, 1.0) for v in (1.0, 2.0, 3.0, 4.0, 1000.0)]
    merged = AGGREGATIONS["trimmed-mean"]({"w": np.zeros(2, np.float32)}, five, [None] * 5)
    np.testing.assert_array_equal(merged["w"], [3.0, 3.0])  # 1 and 1000 dropped: (2 + 3 + 4) / 3
    # fewer than five covering values: nothing dropped, the plain (unweighted) mean
    np.testing.assert_allclose(_merge("trimmed-mean")["w"], [-2.0, 8.0 / 3.0, 6.0, 4.0], rtol=1e-6)


def test_clipping_scales_each_update_to_the_median_update_size():
    # update RMS over the covered elements: sqrt(30/4), sqrt(126/3), sqrt(100/2); median sqrt(42)
    merged = _merge("clip")
    limit = np.sqrt(42.0)
    s1 = 1.0  # below the median: unchanged
    s3 = limit / np.sqrt(50.0)
    w0 = (1.0 * 1 + 3.0 * 3 + (-10.0 * s3) * 1) / 5
    w1 = (2.0 * 1 + 6.0 * 3 + 0.0) / 5
    w2 = (3.0 * s1 + 9.0 * 3) / 4
    np.testing.assert_allclose(merged["w"], [w0, w1, w2, 4.0], rtol=1e-6)
    # the b update (7 - 5 = 2 per element) belongs to reply 0, whose RMS is below the median: unchanged
    np.testing.assert_array_equal(merged["b"], [[7.0, 7.0], [5.0, 5.0]])


def test_none_is_the_sparse_average_and_every_choice_has_a_merge():
    assert tuple(AGGREGATIONS) == ROBUST_AGGREGATIONS
    merged, plain = _merge("none"), sparse_average(GLOBAL, REPLIES, MASKS)
    for name in GLOBAL:
        np.testing.assert_array_equal(merged[name], plain[name])


# SHA-256 (first 32 hex digits) of the global model after tests.test_hostile_supernet's two honest rounds, taken on the
# tree before the relative screen and the robust merges: the default path's arithmetic is unchanged
HONEST_DIGESTS = {
    "deepfednas": "b052053f1dcc6be300c429d3f008cda9",
    "feast": "5e3f0af1c6c5d7ff10acb282fc52cec9",
    "fedavg-min": "6df538e31029d87e9cdc4fcdde0b7868",
    "fedrolex": "f396055f58f4fa717891f012ef17fee5",
    "fiarse": "22c72fe274ea9a5386a133e5181a3eb7",
    "heterofl": "f4096ba21f4d79ddc122a8195378267f",
    "scalefl": "99b8c180a97719a466895db4ebbec054",
    "superfednas": "6815284530902eea048b366d17aab1cb",
}


@pytest.mark.parametrize("method", METHODS)
def test_honest_runs_are_bit_identical_with_the_option_off(flower_ids, method):
    make_strategy, initial, honest, _ = supernet_setup(method)
    strategy = run_rounds(make_strategy, initial, honest, (0, 1, 2), 2, 1.0)
    assert strategy.robust_aggregation == "none"
    digest = hashlib.sha256()
    for name in sorted(strategy.global_state):
        digest.update(name.encode())
        digest.update(strategy.global_state[name].tobytes())
    assert digest.hexdigest()[:32] == HONEST_DIGESTS[method]


def test_an_unknown_robust_aggregation_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"robust-aggregation='krum': allowed values are \['none', 'clip', "):
        validate_run_config({"robust-aggregation": "krum"})


# -- one poisoning client of eight ---------------------------------------------------------------------------------
CLIENTS, ROUNDS, PER_CLIENT = 8, 10, 40
BUDGETS = {p: CACHE.max_macs for p in range(CLIENTS)}
LABELS = {p: list(range(10)) for p in range(CLIENTS)}
EXAMPLES = {p: PER_CLIENT for p in range(CLIENTS)}


def _images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten classes, each a fixed 8x8 pattern seen through noise: the honest federation learns it in ten rounds."""
    patterns = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    return patterns[labels] + 0.6 * torch.randn(n, 3, 8, 8, generator=gen), labels


DATA = {p: _images(PER_CLIENT, 1 + p) for p in range(CLIENTS)}
TEST = _images(400, 99)


def _honest(msg: Message, pid: int) -> RecordDict:
    """Ten SGD steps on the client's images from the model it was sent."""
    received = record_to_state(msg.content.array_records["arrays"])
    model = ElasticResNet(TINY)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in received.items()}, strict=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = DATA[pid]
    gen = torch.Generator().manual_seed(pid * 1000 + msg.content.config_records["config"]["server-round"])
    model.train()
    for _ in range(10):
        batch = torch.randperm(len(labels), generator=gen)[:20]
        optimizer.zero_grad()
        F.cross_entropy(model(images[batch]), labels[batch]).backward()
        optimizer.step()
    trained = {k: v.detach().numpy() for k, v in model.state_dict().items() if k in received}
    metrics = {"num-examples": PER_CLIENT, "labels": LABELS[pid], "train-loss": 1.0, "client-seconds": 0.1}
    return RecordDict({"arrays": state_to_record(trained), "metrics": MetricRecord(metrics)})


def _poison(content: RecordDict, msg: Message) -> RecordDict:
    """The honest update turned around and scaled as far as the screen lets it (90% of each tensor's bound);
    running variances, which may not be negative, at 90% of theirs."""
    sent = record_to_state(msg.content.array_records["arrays"])
    trained = record_to_state(content.array_records["arrays"])
    poisoned = {}
    for name, value in trained.items():
        base = sent[name][prefix_region(value.shape)]
        room = 0.9 * slice_relative_bound(name, base)
        if name.endswith("running_var"):
            poisoned[name] = np.full_like(value, room)
            continue
        step = value - base
        scale = (room - np.abs(base).max()) / max(float(np.abs(step).max()), 1e-12)
        poisoned[name] = (base - scale * step).astype(np.float32)
    copy = RecordDict(dict(content))
    copy["arrays"] = state_to_record(poisoned)
    return copy


def _accuracy(robust: str, poisoned: bool) -> float:
    def make_strategy(min_reply_fraction):
        run = validate_run_config(
            {
                "method": "feast",
                "seed": 0,
                "num-server-rounds": ROUNDS,
                "clients-per-round": CLIENTS,
                "robust-aggregation": robust,
                "min-reply-fraction": min_reply_fraction,
            }
        )
        setup = SimpleNamespace(cfg=TINY, cache=CACHE)
        return make_supernet_strategy(run, setup, BUDGETS, {p: node_of(p) for p in BUDGETS}, EXAMPLES, LABELS)

    torch.manual_seed(0)
    initial = {k: v for k, v in ElasticResNet(TINY).state_dict().items() if not k.endswith("num_batches_tracked")}
    attack = dict(hostile=0, corruption=Corruption("poison", _poison)) if poisoned else {}
    # a poisoned model's activations blow up the honest clients' BatchNorm variances past the screen: a round then
    # goes on with fewer replies
    strategy = run_rounds(make_strategy, state_to_record(initial), _honest, range(CLIENTS), ROUNDS, 0.1, **attack)
    assert 0 in strategy.rounds[1].accepted  # the poison passes screening
    model = ElasticResNet(TINY)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in strategy.global_state.items()}, strict=False)
    model.eval()
    with torch.no_grad():
        return float((model(TEST[0]).argmax(1) == TEST[1]).float().mean()) * 100


@pytest.fixture(scope="module")
def honest_accuracy():
    with message_identity():
        return _accuracy("none", poisoned=False)


def test_the_attack_hurts_the_plain_average(flower_ids, honest_accuracy):
    assert honest_accuracy > 90  # the federation learns
    assert _accuracy("none", poisoned=True) < honest_accuracy - 50


@pytest.mark.parametrize("robust", ["clip", "trimmed-mean", "median"])
def test_a_robust_merge_keeps_accuracy_within_two_points(flower_ids, honest_accuracy, robust):
    assert _accuracy(robust, poisoned=True) >= honest_accuracy - 2


def _at_the_bound(payload: str) -> Corruption:
    """Every element at 99% of its tensor's bound, with the sign of the honest value: the most one reply may move
    the model in one round, sent every round."""

    def corrupt(content: RecordDict, msg: Message) -> RecordDict:
        sent = record_to_state(msg.content.array_records["arrays"], payload)
        trained = record_to_state(content.array_records["arrays"], payload)
        bound = {k: 0.99 * slice_relative_bound(k, sent[k][prefix_region(v.shape)]) for k, v in trained.items()}
        signs = {k: np.where((v < 0) & ~k.endswith("running_var"), -1.0, 1.0) for k, v in trained.items()}
        copy = RecordDict(dict(content))
        copy["arrays"] = state_to_record({k: (signs[k] * bound[k]).astype(np.float32) for k in trained}, payload)
        return copy

    return Corruption("at-the-bound", corrupt)


def _largest_after_six_rounds(method: str, robust: str, hostile: bool) -> float:
    from tests.test_hostile_supernet import BUDGETS as THREE
    from tests.test_hostile_supernet import EXAMPLES as SIZES
    from tests.test_hostile_supernet import LABELS as HELD

    _, initial, honest, payload = supernet_setup(method)

    def make_strategy(min_reply_fraction):
        run = validate_run_config(
            {"method": method, "seed": 0, "num-server-rounds": 6, "clients-per-round": 3}
            | {"payload-dtype": payload, "robust-aggregation": robust}
        )
        setup = SimpleNamespace(cfg=TINY, cache=CACHE)
        return make_supernet_strategy(run, setup, THREE, {p: node_of(p) for p in THREE}, SIZES, HELD)

    attack = dict(hostile=0, corruption=_at_the_bound(payload)) if hostile else {}
    strategy = run_rounds(make_strategy, initial, honest, (0, 1, 2), 6, 1.0, **attack)
    trained = [k for k in strategy.global_state if not k.endswith(("running_mean", "running_var"))]
    return max(float(np.abs(strategy.global_state[k]).max()) for k in trained)


@pytest.mark.parametrize("method, robust", [("fedavg-min", "median"), ("fedavg-min", "clip"), ("heterofl", "clip")])
def test_a_client_at_the_bound_every_round_compounds_unless_the_merge_is_robust(flower_ids, method, robust):
    """The relative screen bounds one round's step, not six in a row: a client always at 99% of it still grows the
    plain average's weights round after round (FedAvg-min's went from 1 to 3.7e5 in six rounds under the absolute
    bound alone). The median of the three replies covering each element, or updates clipped to the median update
    size, keep them where the honest run has them. (HeteroFL counts a classifier row only for the clients holding
    its label: rows held by two clients, the poisoner one of them, have no median to protect them; clipping does.)"""
    honest = _largest_after_six_rounds(method, "none", hostile=False)
    assert _largest_after_six_rounds(method, "none", hostile=True) > 100 * honest
    assert _largest_after_six_rounds(method, robust, hostile=True) < 2 * honest
