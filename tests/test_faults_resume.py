"""Faults (hostile replies, clients that fail or never answer) and checkpoint/resume of the supernet strategies
(one strategy restored from its state, and a whole FEAST run resumed in-process with real client training)."""

from __future__ import annotations

import csv
import logging
import random
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Error
from flwr.common.constant import ErrorCode

from experiments.runner import MEASURED
from experiments.runner.flower_internals import set_message_id, set_reply_source
from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet, load_supernet_config
from fl_app.run.checkpoint import (
    capture_rng,
    load_round_checkpoint,
    load_verified,
    restore_rng,
    save_verified,
    supernet_fingerprint,
    write_round_checkpoint,
)
from fl_app.run.config import validate_run_config
from fl_app.run.outputs import CLIENT_RECORDS_KEY
from fl_app.run.payload import record_bytes, record_to_state, state_to_record
from fl_app.run.round_log import round_totals
from fl_app.supernet.slicing import slice_state, slice_subnet, subnet_shapes
from fl_app.supernet_app import run_supernet, train_supernet_client
from strategies.feast import FeastStrategy
from strategies.rounds import sample_partitions
from strategies.superfednas import SuperFedNASStrategy
from tests.hostile import SUPERLINK_NODE_ID, answered_queries, honest_memo, reply_to
from tests.test_hostile_supernet import supernet_setup

EXAMPLES = {0: 50, 1: 70, 2: 90}
CFG = load_supernet_config("cpu")


def _initial(cfg):
    torch.manual_seed(0)
    return {k: v.numpy() for k, v in ElasticResNet(cfg).state_dict().items() if not k.endswith("num_batches_tracked")}


def _feast(cfg, cache, **kw):
    budgets = {0: cache.min_macs, 1: 3e6, 2: cache.max_macs}
    return FeastStrategy(
        cfg,
        cache,
        budgets,
        {p: 100 + p for p in budgets},
        clients_per_round=3,
        seed=0,
        examples_of_partition=EXAMPLES,
        **kw,
    )


def _reply(msg: Message, state: dict | None, metrics: dict) -> Message:
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if state is not None:
        content["arrays"] = state_to_record(state)
    reply = Message(content, reply_to=msg)
    set_reply_source(reply, msg.metadata.dst_node_id)
    return reply


def _trained(msg: Message, server_round: int) -> dict:
    """A deterministic stand-in for local training: pull the received slice toward a client/round constant."""
    pid = msg.metadata.dst_node_id - 100
    received = record_to_state(msg.content.array_records["arrays"])
    config = msg.content.config_records["config"]
    if "arch-d" in config:  # a baseline assigned one subnet: its slice comes back
        arch = Subnet(config["arch-d"], config["arch-e"], config["arch-w"])
        received = slice_state(received, {k: v for k, v in subnet_shapes(CFG, arch).items() if k in received})
    return {k: 0.5 * v + 0.1 * (pid + 1) + 0.01 * server_round for k, v in received.items()}


def _valid(msg: Message, server_round: int = 1) -> Message:
    pid = msg.metadata.dst_node_id - 100
    return _reply(msg, _trained(msg, server_round), {"num-examples": EXAMPLES[pid], "train-loss": 1.0})


def _hostile(kind: str, msg: Message, cfg, full: dict) -> Message | None:
    pid = msg.metadata.dst_node_id - 100
    state, metrics = _trained(msg, 1), {"num-examples": EXAMPLES[pid], "train-loss": 1.0}
    name = next(iter(state))
    if kind == "error":
        reply = Message(error=Error(0, "client raised"), reply_to=msg)
        set_reply_source(reply, msg.metadata.dst_node_id)
        return reply
    if kind == "no-answer":  # timed out or disconnected: the grid returns nothing for it
        return None
    if kind == "wrong-shape":
        state[name] = state[name][..., :1]
    elif kind == "beyond-bounds":
        state = slice_subnet(cfg, full, cfg.max_subnet())
    elif kind == "nan":
        state[name] = state[name].copy()
        state[name].flat[0] = np.nan
    elif kind == "inf":
        state[name] = state[name].copy()
        state[name].flat[-1] = np.inf
    elif kind == "missing-key":
        del state[name]
    elif kind == "no-arrays":
        state = None
    elif kind == "absurd-num-examples":
        metrics["num-examples"] = 10**12
    elif kind == "negative-num-examples":
        metrics["num-examples"] = -5
    elif kind == "wrong-labels":
        metrics["labels"] = [0, 1000]
    return _reply(msg, state, metrics)


FAULTS = [
    "error",
    "no-answer",
    "wrong-shape",
    "beyond-bounds",
    "nan",
    "inf",
    "missing-key",
    "no-arrays",
    "absurd-num-examples",
    "negative-num-examples",
    "wrong-labels",
]


@pytest.mark.parametrize("kind", FAULTS)
def test_a_faulty_client_is_left_out_and_the_aggregate_equals_that_of_the_valid_replies(
    flower_ids, cpu_cfg, cpu_cache, kind
):
    full = _initial(cpu_cfg)
    strategy = _feast(cpu_cfg, cpu_cache, min_reply_fraction=0.5)
    messages = list(strategy.configure_train(1, state_to_record(full), ConfigRecord(), grid=None))
    bad = next(m for m in messages if m.metadata.dst_node_id == 100)  # the smallest budget: routed a strict slice
    replies = [_valid(m) if m is not bad else _hostile(kind, m, cpu_cfg, full) for m in messages]
    record, metrics = strategy.aggregate_train(1, [r for r in replies if r is not None])

    clean = _feast(cpu_cfg, cpu_cache)
    clean_messages = [
        m
        for m in clean.configure_train(1, state_to_record(full), ConfigRecord(), grid=None)
        if m.metadata.dst_node_id != 100
    ]
    clean.routed.pop(0)
    clean.rounds[1].sampled = [1, 2]
    expected, _ = clean.aggregate_train(1, [_valid(m) for m in clean_messages])

    merged, wanted = record_to_state(record), record_to_state(expected)
    assert merged.keys() == wanted.keys()
    for k in merged:
        np.testing.assert_array_equal(merged[k], wanted[k], err_msg=k)
    counted = "failed" if kind in ("error", "no-answer") else "rejected"
    assert metrics[counted] == 1 and metrics["replies"] == 2
    assert strategy.rounds[1].__dict__[counted] == [0]


def _run_rounds(strategy, initial: dict, first_round: int, last_round: int) -> dict:
    class Grid:  # answers every message at once with the stand-in training
        def get_node_ids(self):
            return list(strategy.node_of_partition.values())

        def send_and_receive(self, messages, timeout):
            return [_valid(m, m.content.config_records["config"]["server-round"]) for m in messages]

    strategy.start(Grid(), state_to_record(initial), num_rounds=last_round, first_round=first_round)
    return strategy.global_state


@pytest.mark.parametrize("kind", ["feast", "deepfednas"])
def test_a_strategy_restored_from_its_checkpoint_state_continues_exactly(flower_ids, cpu_cfg, cpu_cache, kind):
    def make():
        if kind == "feast":
            return _feast(cpu_cfg, cpu_cache)
        budgets = {0: cpu_cache.min_macs, 1: 3e6, 2: cpu_cache.max_macs}
        return SuperFedNASStrategy(
            cpu_cfg,
            cpu_cache,
            budgets,
            {p: 100 + p for p in budgets},
            clients_per_round=2,
            seed=0,
            num_rounds=4,
            subnet_source="cache",
            examples_of_partition=EXAMPLES,
        )

    initial = _initial(cpu_cfg)
    straight = make()
    final = _run_rounds(straight, initial, 1, 4)

    first = make()
    after_two = _run_rounds(first, initial, 1, 2)
    saved = first.checkpoint_state()
    resumed = make()
    resumed.restore_state(saved)
    continued = _run_rounds(resumed, after_two, 3, 4)

    for k in final:
        np.testing.assert_array_equal(continued[k], final[k], err_msg=k)
    assert {r: log_.to_dict() for r, log_ in resumed.rounds.items()} == {
        r: log_.to_dict() for r, log_ in straight.rounds.items()
    }
    assert not np.array_equal(after_two["stem_conv.weight"], final["stem_conv.weight"])  # rounds 3-4 did work


def test_checkpoint_round_trip_restores_state_metrics_and_rng(tmp_path, cpu_cfg):
    run = validate_run_config({"num-server-rounds": 4, "output-dir": str(tmp_path / "a")})
    state = _initial(cpu_cfg)
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    np.random.normal()  # numpy now holds a cached Gaussian, part of its state
    rng = capture_rng()
    path = write_round_checkpoint(
        tmp_path,
        2,
        run,
        8,
        state,
        {"rounds": {1: {"x": [1, 2]}}},
        {"rows": [{"round": 2, "test_accuracy": 0.5}], "last": {}},
    )
    expected_draws = (torch.rand(3), np.random.normal(size=3), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)

    # resuming with another output folder and checkpoint cadence is allowed
    resumed_run = validate_run_config(
        {"num-server-rounds": 4, "output-dir": str(tmp_path / "b"), "checkpoint-every": 1, "resume-from": str(tmp_path)}
    )
    blob = load_round_checkpoint(tmp_path, resumed_run, 8)
    assert blob["round"] == 2 and blob["metrics"]["rows"][0]["test_accuracy"] == 0.5
    assert blob["strategy"] == {"rounds": {1: {"x": [1, 2]}}}
    for k in state:
        np.testing.assert_array_equal(blob["global_state"][k], state[k])
    restore_rng(blob["rng"])
    assert torch.equal(torch.rand(3), expected_draws[0])
    np.testing.assert_array_equal(np.random.normal(size=3), expected_draws[1])
    assert random.random() == expected_draws[2]
    assert rng["python"][1] == blob["rng"]["python"][1]
    assert path == tmp_path / "checkpoint.pt"


def test_resume_refuses_a_different_run_and_bad_files(tmp_path, cpu_cfg):
    run = validate_run_config({"num-server-rounds": 4})
    write_round_checkpoint(tmp_path, 2, run, 8, _initial(cpu_cfg), {}, {})
    with pytest.raises(ValueError, match=r"lr: checkpoint 0.05 vs now 0.1"):
        load_round_checkpoint(tmp_path, validate_run_config({"num-server-rounds": 4, "lr": 0.1}), 8)
    with pytest.raises(ValueError, match="8 clients, this one 4"):
        load_round_checkpoint(tmp_path, run, 4)
    with pytest.raises(ValueError, match="no checkpoint.pt"):
        load_round_checkpoint(tmp_path / "nowhere", run, 8)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_round_checkpoint(tmp_path / "broken", run, 8)
    with pytest.raises(ValueError, match="resume-from='relative': must be an absolute path"):
        validate_run_config({"resume-from": "relative"})


class ChurnGrid:
    """A deployment in miniature. ``nodes``: node id -> partition. Before round r, ``events[r](grid)`` may change
    the nodes; ``killed_in`` (round -> node) dies after the round's messages are built, so the SuperLink answers its
    message with NODE_UNAVAILABLE under its own node id, and the node is gone from ``get_node_ids()`` afterwards.
    Nodes answer the partition query with ``num_partitions`` (per node, default 3)."""

    def __init__(self, honest, nodes: dict[int, int], events=None, killed_in=None, num_partitions=None):
        self.honest, self.nodes = honest_memo(honest), dict(nodes)
        self.events, self.killed_in = dict(events or {}), dict(killed_in or {})
        self.num_partitions = dict(num_partitions or {})
        self.round, self.sent, self.queries = 0, {}, {}

    def get_node_ids(self):
        if self.round + 1 in self.events:
            self.events.pop(self.round + 1)(self)
        return list(self.nodes)

    def push_messages(self, messages):
        answers = answered_queries(messages, lambda node: (self.nodes[node], self.num_partitions.get(node, 3)))
        self.queries.update(answers)
        return list(answers)

    def pull_messages(self, ids):
        return [self.queries.pop(mid) for mid in list(ids) if mid in self.queries]

    def send_and_receive(self, messages, timeout=None):
        self.round += 1
        dead = self.killed_in.get(self.round)
        replies = []
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
            node = msg.metadata.dst_node_id
            self.sent[(self.round, self.nodes[node])] = (node, record_bytes(msg.content.array_records["arrays"]))
            if node == dead:
                replies.append(
                    reply_to(msg, (SUPERLINK_NODE_ID, Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")))
                )
            else:
                replies.append(reply_to(msg, self.honest(msg, self.nodes[node])))
        if dead is not None:
            del self.nodes[dead]
        return replies


def test_a_node_killed_mid_run_is_counted_once_skipped_while_gone_and_used_when_it_rejoins(flower_ids):
    make_strategy, initial, honest, _ = supernet_setup("feast")
    strategy = make_strategy(0.3)

    def restart_and_intrude(grid):
        grid.nodes[201] = 1  # partition 1 restarted: a new node id
        grid.nodes[300] = 2  # a node set up for another federation
        grid.num_partitions[300] = 5

    grid = ChurnGrid(honest, {100: 0, 101: 1, 102: 2}, events={4: restart_and_intrude}, killed_in={2: 101})
    strategy.start(grid, initial_arrays=initial, num_rounds=4, timeout=1.0)
    rounds = strategy.rounds

    assert [rounds[r].sampled for r in (1, 2, 3, 4)] == [[0, 1, 2], [0, 1, 2], [0, 2], [0, 1, 2]]
    assert rounds[2].failed == [1] and rounds[2].unreached == [1] and rounds[2].accepted == [0, 2]
    assert all(rounds[r].failed == [] and rounds[r].accepted == rounds[r].sampled for r in (1, 3, 4))
    # bytes: what went to the dead node is not delivered
    assert rounds[2].bytes_down_unanswered == grid.sent[(2, 1)][1]
    assert rounds[2].bytes_down == grid.sent[(2, 0)][1] + grid.sent[(2, 2)][1]
    assert grid.sent[(4, 1)][0] == 201  # the restarted node got partition 1's work
    assert rounds[2].row(2)["replies"] == 2 and rounds[2].row(2)["failed"] == 1
    assert round_totals(rounds) == {
        "bytes_down": sum(size for (r, pid), (_, size) in grid.sent.items() if (r, pid) != (2, 1)),
        "bytes_down_unanswered": grid.sent[(2, 1)][1],
        "bytes_up": sum(rounds[r].bytes_up for r in rounds),
        "accepted_replies": 3 + 2 + 2 + 3,
        "failed_replies": 1,
        "rejected_replies": 0,
        "failed_by_partition": {"1": 1},
        "rejected_by_partition": {},
    }
    assert "num-partitions=5" in strategy.nodes.refused[300] and strategy.node_of_partition[2] == 102


def test_with_every_node_present_sampling_is_the_seeds_alone(flower_ids):
    """Following live nodes changes nothing in a simulation: the sample is a function of seed and round."""
    make_strategy, initial, honest, _ = supernet_setup("heterofl")
    strategy = make_strategy(1.0)
    strategy.clients_per_round = 2
    strategy.start(ChurnGrid(honest, {100: 0, 101: 1, 102: 2}), initial_arrays=initial, num_rounds=3, timeout=1.0)
    assert [strategy.rounds[r].sampled for r in (1, 2, 3)] == [sample_partitions(range(3), 2, 0, r) for r in (1, 2, 3)]


def measured_columns_dropped(path: Path) -> list[dict]:
    """A CSV's rows without its time and memory columns (what differs between two runs of the same numbers)."""
    with open(path, newline="") as text:
        return [{k: v for k, v in row.items() if not MEASURED.search(k)} for row in csv.DictReader(text)]


class FeastGrid:
    """Delivers each training message to the real ``train_supernet_client`` of its partition (node id 100 + partition
    id); the server dies when it sends round ``crash_round``'s messages."""

    def __init__(self, run, num_clients: int, crash_round: int | None = None):
        self.run, self.num_clients, self.crash_round = run, num_clients, crash_round

    def nodes(self) -> dict[int, dict]:
        return {pid: {"node_id": 100 + pid} for pid in range(self.num_clients)}

    def get_node_ids(self):
        return [100 + pid for pid in range(self.num_clients)]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if any(m.content.config_records["config"]["server-round"] == self.crash_round for m in messages):
            raise RuntimeError("the server died")
        replies = []
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
            reply = train_supernet_client(msg, self.run, msg.metadata.dst_node_id - 100, self.num_clients, None)
            set_reply_source(reply, msg.metadata.dst_node_id)
            replies.append(reply)
        return replies


def test_a_resumed_feast_run_ends_with_the_uninterrupted_runs_results_and_client_statistics(
    flower_ids, tmp_path, caplog
):
    tiny = {"num-server-rounds": 3, "clients-per-round": 2, "max-local-steps": 1, "batch-size": 8}
    tiny.update({"eval-every": 3, "checkpoint-every": 2})

    def run_of(name: str, **overrides):
        return validate_run_config({**tiny, "output-dir": str(tmp_path / name), **overrides})

    def feast(run, crash_round=None):
        grid = FeastGrid(run, 3, crash_round)
        run_supernet(grid, run, grid.nodes())

    feast(run_of("straight"))
    with pytest.raises(RuntimeError, match="the server died"):
        feast(run_of("crashed"), crash_round=3)
    assert torch.load(tmp_path / "crashed/checkpoint.pt", weights_only=True)["round"] == 2
    feast(run_of("resumed", **{"resume-from": str(tmp_path / "crashed")}))

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert (resumed / "metrics.csv").read_text() == (straight / "metrics.csv").read_text()
    weights = torch.load(straight / "supernet.pt", weights_only=True)["state_dict"]
    continued = torch.load(resumed / "supernet.pt", weights_only=True)["state_dict"]
    assert weights.keys() == continued.keys() and all(torch.equal(weights[k], continued[k]) for k in weights)
    # the clients' statistics count the rounds before the resume too (time and memory aside)
    for name in ("rounds.csv", "clients.csv"):
        assert measured_columns_dropped(resumed / name) == measured_columns_dropped(straight / name), name
    clients = measured_columns_dropped(straight / "clients.csv")
    assert sum(int(row["rounds_answered"]) for row in clients) == 3 * 2  # every sampled client answered

    # a checkpoint written before checkpoints kept the statistics still resumes, from zero, with a warning
    checkpoint = tmp_path / "crashed/checkpoint.pt"
    run = run_of("crashed")
    blob = load_verified(checkpoint, supernet_fingerprint(run))
    assert blob.pop(CLIENT_RECORDS_KEY)["flops_of_round"].keys() == {1, 2}
    checkpoint.unlink()
    save_verified(checkpoint, blob, supernet_fingerprint(run))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        feast(run_of("old", **{"resume-from": str(tmp_path / "crashed")}))
    assert "holds no client statistics" in caplog.text and "count only rounds 3 and later" in caplog.text
    assert (tmp_path / "old/metrics.csv").read_text() == (straight / "metrics.csv").read_text()
    rounds = measured_columns_dropped(tmp_path / "old/rounds.csv")
    assert [float(row["client_train_flops"]) > 0 for row in rounds] == [False, False, True]
    assert sum(int(row["rounds_answered"]) for row in measured_columns_dropped(tmp_path / "old/clients.csv")) == 2
