"""Which partition a reply is credited to (``fl_app.run.round_log.RoundLog.screen``): only the node a message was sent
to may answer it, and only a message of this round. Replies that answer another round's message (a replay), no message
at all, or another node's message are ignored and logged; they never push the honest reply out as "a second reply".
The SuperLink's own error reply for an undeliverable message (its node id as sender) stays that partition's failure.

Runs use the mocked grid of tests/hostile.py with one extra reply slipped in before the honest ones, for a
supernet-family strategy and a FedTopo-family strategy; each run must end exactly like the run without the
extra reply."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Error
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from experiments.runner.flower_internals import set_message_id
from fl_app.run.payload import state_to_record
from fl_app.run.round_log import RoundLog
from tests.hostile import HostileGrid, _set_values, _with_array, node_of, reply_to
from tests.test_hostile_fedtopo import global_state_of, honest_of, make_strategy_of
from tests.test_hostile_supernet import supernet_setup


class SlippingGrid(HostileGrid):
    """Honest clients; before the honest replies of each training round, ``slip(grid, round, messages,
    honest_replies)`` may add replies of its own (the order a fast attacker's replies would arrive in)."""

    def __init__(self, honest, partitions, slip):
        super().__init__(honest, partitions)
        self.slip, self.round, self.history = slip, 0, {}

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout)
        if not messages or messages[0].metadata.message_type != MessageType.TRAIN:
            return replies
        self.round += 1
        self.history[self.round] = replies
        return self.slip(self, self.round, messages, replies) + replies


def _reply_of(replies, pid: int) -> Message:
    return next(r for r in replies if r.metadata.src_node_id == node_of(pid))


def _poisoned(content: RecordDict) -> RecordDict:
    return _with_array(content, _set_values(np.nan))


def _foreign(grid, server_round, messages, replies):
    """Client 0's node answers a message nobody sent (an id of no round), with a NaN upload."""
    fake = Message(RecordDict({"config": ConfigRecord({})}), message_type=MessageType.TRAIN, dst_node_id=node_of(0))
    set_message_id(fake, uuid.uuid4().hex)
    return [reply_to(fake, _poisoned(_reply_of(replies, 0).content))]


def _replayed(grid, server_round, messages, replies):
    """From round 2 on, client 0's round-1 reply arrives again (valid content, but an answer to another round)."""
    return [_reply_of(grid.history[1], 0)] if server_round > 1 else []


def _cross_node(grid, server_round, messages, replies):
    """Client 1's node answers the message sent to client 0 (its id in reply_to), with a NaN upload."""
    to_zero = next(m for m in messages if m.metadata.dst_node_id == node_of(0))
    return [reply_to(to_zero, (node_of(1), _poisoned(_reply_of(replies, 0).content)))]


def _cross_node_error(grid, server_round, messages, replies):
    """Client 1's node sends an error in answer to the message sent to client 0."""
    to_zero = next(m for m in messages if m.metadata.dst_node_id == node_of(0))
    return [reply_to(to_zero, (node_of(1), Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "raised")))]


def _superlink_content(grid, server_round, messages, replies):
    """A reply with content (not an error) under the SuperLink's node id, answering the message sent to client 0."""
    to_zero = next(m for m in messages if m.metadata.dst_node_id == node_of(0))
    return [reply_to(to_zero, (SUPERLINK_NODE_ID, _poisoned(_reply_of(replies, 0).content)))]


SLIPS = {
    "foreign": (_foreign, "answers no message of this round"),
    "replayed": (_replayed, "answers no message of this round"),
    "cross-node": (_cross_node, "answers the message sent to client 0"),
    "cross-node-error": (_cross_node_error, "answers the message sent to client 0"),
    "superlink-content": (_superlink_content, "answers the message sent to client 0"),
}


def _setups():
    make_strategy, initial, honest, _ = supernet_setup("feast")
    yield "feast", make_strategy, initial, honest, lambda s: s.global_state
    yield "fedtopo", make_strategy_of("fedtopo"), state_to_record({}), honest_of("fedtopo"), global_state_of("fedtopo")


SETUPS = {name: rest for name, *rest in _setups()}


def _run(make_strategy, initial, honest, slip):
    grid = SlippingGrid(honest, (0, 1, 2), slip)
    strategy = make_strategy(1.0)  # every reply is needed: a credited stray would fail the round
    strategy.start(grid, initial_arrays=initial, num_rounds=2, timeout=1.0)
    return strategy


@pytest.mark.parametrize("family", sorted(SETUPS))
@pytest.mark.parametrize("kind", sorted(SLIPS))
def test_a_reply_from_the_wrong_node_or_round_is_ignored_and_the_honest_one_counts(flower_ids, caplog, family, kind):
    make_strategy, initial, honest, global_state = SETUPS[family]
    slip, logged = SLIPS[kind]
    reference = _run(make_strategy, initial, honest, lambda grid, r, messages, replies: [])
    with caplog.at_level(logging.WARNING):
        strategy = _run(make_strategy, initial, honest, slip)
    for r in (1, 2):
        log_ = strategy.rounds[r]
        assert log_.accepted == [0, 1, 2] and log_.failed == [] and log_.rejected == [], (kind, r, log_)
    state, wanted = global_state(strategy), global_state(reference)
    assert state.keys() == wanted.keys() and state
    for name in wanted:
        np.testing.assert_array_equal(state[name], wanted[name], err_msg=f"{family} {kind}: {name}")
    ignored = [m for m in caplog.messages if m.endswith(": ignored")]
    assert ignored and all(logged in m for m in ignored), ignored


# -- RoundLog.screen itself: the SuperLink's error replies ------------------------------------------------------
def _sent(pids=(0, 1, 2)) -> dict[int, Message]:
    sent = {}
    for pid in pids:
        msg = Message(
            RecordDict({"config": ConfigRecord({})}), message_type=MessageType.TRAIN, dst_node_id=node_of(pid)
        )
        set_message_id(msg, uuid.uuid4().hex)
        sent[pid] = msg
    return sent


def _ok(msg: Message) -> Message:
    return reply_to(msg, RecordDict({"metrics": MetricRecord({"num-examples": 1})}))


def test_the_superlinks_error_for_a_message_of_this_round_is_that_partitions_failure(flower_ids):
    sent = _sent()
    unavailable = reply_to(sent[1], (SUPERLINK_NODE_ID, Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")))
    log_ = RoundLog(sampled=[0, 1, 2])
    usable = log_.screen(1, [_ok(sent[0]), unavailable, _ok(sent[2])], sent)
    assert [pid for pid, _ in usable] == [0, 2]
    assert log_.failed == [1] and log_.unreached == [1]


def test_the_superlinks_error_for_an_unknown_message_and_a_second_reply_are_ignored(flower_ids, caplog):
    sent = _sent()
    other_round = _sent()  # the same nodes, messages of another round
    stale = reply_to(other_round[1], (SUPERLINK_NODE_ID, Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")))
    log_ = RoundLog(sampled=[0, 1, 2])
    with caplog.at_level(logging.WARNING):
        usable = log_.screen(1, [stale, _ok(sent[0]), _ok(sent[0]), _ok(sent[1]), _ok(sent[2])], sent)
    assert [pid for pid, _ in usable] == [0, 1, 2] and log_.failed == []
    assert any("SuperLink" in m and "ignored" in m for m in caplog.messages)
    assert any("a second reply for client 0" in m for m in caplog.messages)


# -- RoundLog.accept: the skeleton's screen -> reject/accept step, shared by training and evaluation replies --------
def test_accept_rejects_with_the_checks_reason_and_a_raising_check_rejects_only_its_reply(flower_ids, caplog):
    sent = _sent((0, 1, 2, 3))
    replies = [_ok(sent[p]) for p in (3, 2, 1, 0)]  # arrival order is not partition order

    def problem_of(pid, reply):
        if pid == 1:
            return "num-examples too large", None
        if pid == 2:
            raise MemoryError("out of memory")
        return None, {"decoded-for": pid, "examples": reply.content.metric_records["metrics"]["num-examples"]}

    log_ = RoundLog(sampled=[0, 1, 2, 3])
    with caplog.at_level(logging.WARNING):
        usable = log_.accept(5, replies, sent, problem_of, "evaluation reply")
    assert [(pid, decoded) for pid, _, decoded in usable] == [
        (0, {"decoded-for": 0, "examples": 1}),
        (3, {"decoded-for": 3, "examples": 1}),
    ]
    assert [reply.metadata.src_node_id for _, reply, _ in usable] == [node_of(0), node_of(3)]
    assert log_.accepted == [0, 3] and log_.rejected == [1, 2] and log_.failed == []
    assert "round 5: evaluation reply from client 1 rejected: num-examples too large" in caplog.messages
    assert "round 5: evaluation reply from client 2 rejected: checking it raised MemoryError: out of memory" in (
        caplog.messages
    )
