"""Hostile-client harness: drive a strategy for a few rounds in-process (a mocked Grid, no Flower runtime) with a few
clients of which one answers every message with a corrupted reply, or with an error, or never, and compare with the
run in which that client never answers at all.

What a method supplies:
- ``make_strategy(min_reply_fraction)``: a fresh strategy whose nodes are ``node_of(pid)`` for the partitions.
- ``honest(msg, pid) -> RecordDict``: the content an honest client ``pid`` sends back for ``msg`` (deterministic, a
  function of the message; a stand-in for local training).
- ``global_state(strategy) -> dict[str, np.ndarray]``: the server state that must stay clean.
- ``initial``: the ArrayRecord ``strategy.start`` begins from.
and a list of ``Corruption`` s (``standard_corruptions()`` or its own).

``check_hostile(...)`` runs both runs (the hostile one and the reference in which the hostile client is silent) and
asserts: the hostile run completes under ``min_reply_fraction``; every tensor of the global state is finite and
EQUAL to the reference's; in every round the hostile partition was sampled it is counted exactly once (in
``rejected`` for a corrupted reply, in ``failed`` for an error or no answer) and never among the accepted partitions.

Messages need a task identity outside a Flower runtime: use the ``flower_ids`` fixture of tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Error
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode  # the SuperLink answers for a dead node under its id

from experiments.runner.flower_internals import set_message_id, set_reply_source
from fl_app.run.node_query import partition_answer
from strategies.screening import MAX_CLIENT_SECONDS, MAX_TRAIN_LOSS

NEVER = object()  # a corruption's result: the client never answers


def node_of(pid: int) -> int:
    return 100 + pid


@dataclass(frozen=True)
class Corruption:
    """``corrupt(content, msg)`` turns the honest reply content into a hostile one: a RecordDict, an ``Error`` (the
    client raised), ``NEVER`` (no answer), or a ``(src_node_id, Error)`` pair (an error sent by someone else on the
    client's behalf, e.g. the SuperLink for a dead node). ``counted`` is where the strategy must count the client:
    ``rejected`` or ``failed``. ``message_types`` are the messages it answers this way (others honestly)."""

    name: str
    corrupt: Callable[[RecordDict, Message], object]
    counted: str = "rejected"
    message_types: tuple[str, ...] = (MessageType.TRAIN,)


class HostileGrid:
    """Answers each message at once with ``honest(msg, pid)``, except the hostile partition's, which ``corruption``
    decides; ``silent`` partitions never answer. Gives each pushed message an id, as Flower's grids do, and replies
    carry it in ``reply_to_message_id``."""

    def __init__(
        self,
        honest,
        partitions: Iterable[int],
        hostile: int | None = None,
        corruption: Corruption | None = None,
        silent: Iterable[int] = (),
    ):
        self.honest, self.partitions = honest_memo(honest), list(partitions)
        self.hostile, self.corruption, self.silent = hostile, corruption, set(silent)
        self.partition_of_node = {node_of(p): p for p in self.partitions}

    def get_node_ids(self) -> list[int]:
        return [node_of(p) for p in self.partitions]

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            set_message_id(msg, uuid.uuid4().hex)
            pid = self.partition_of_node[msg.metadata.dst_node_id]
            if pid in self.silent:
                continue
            content = self.honest(msg, pid)
            if pid == self.hostile and msg.metadata.message_type in self.corruption.message_types:
                content = self.corruption.corrupt(content, msg)
            if content is NEVER:
                continue
            replies.append(reply_to(msg, content))
        return replies


_MEMO: dict = {}


def honest_memo(honest):
    """``honest`` remembered per (function, partition, message content): a run repeats the reference's messages
    whenever screening works, and their honest replies need not be computed again. The key covers every byte of
    the message's records, so a message that differs in anything gets its own reply."""

    def answer(msg: Message, pid: int) -> RecordDict:
        digest = hashlib.blake2b(digest_size=16)
        for name, record in sorted(msg.content.items()):
            digest.update(name.encode())
            if isinstance(record, ArrayRecord):
                for key, array in record.items():
                    digest.update(f"{key}|{array.dtype}|{tuple(array.shape)}|".encode())
                    digest.update(array.data)
            else:
                digest.update(repr(sorted(record.items())).encode())
        key = (honest, pid, msg.metadata.message_type, digest.hexdigest())
        if key not in _MEMO:
            _MEMO[key] = honest(msg, pid)
        return _MEMO[key]

    return answer


def reply_to(msg: Message, content) -> Message:
    """A reply from the message's destination node (or from ``src`` for a ``(src, Error)`` pair)."""
    src = msg.metadata.dst_node_id
    if isinstance(content, tuple):
        src, content = content
    reply = Message(error=content, reply_to=msg) if isinstance(content, Error) else Message(content, reply_to=msg)
    set_reply_source(reply, src)
    return reply


def answered_queries(messages, answer: Callable[[int], tuple[int, int]]) -> dict[str, Message]:
    """Message id -> reply of each partition query in ``messages`` (each given a fresh id), answered as the node
    ``answer(destination node)`` = (partition-id, num-partitions) would answer it."""
    replies = {}
    for msg in messages:
        mid = uuid.uuid4().hex
        set_message_id(msg, mid)
        pid, num = answer(msg.metadata.dst_node_id)
        replies[mid] = reply_to(msg, partition_answer(msg, pid, num).content)
    return replies


def run_rounds(
    make_strategy, initial: ArrayRecord, honest, partitions, num_rounds: int, min_reply_fraction: float, **grid_kwargs
):
    strategy = make_strategy(min_reply_fraction)
    strategy.start(
        HostileGrid(honest, partitions, **grid_kwargs), initial_arrays=initial, num_rounds=num_rounds, timeout=1.0
    )
    return strategy


def check_hostile(
    make_strategy,
    initial: ArrayRecord,
    honest,
    global_state,
    corruption: Corruption,
    *,
    partitions=(0, 1, 2),
    hostile: int = 0,
    num_rounds: int = 2,
    min_reply_fraction: float = 0.6,
    reference=None,
):
    """Run with ``hostile`` corrupted by ``corruption`` and compare with ``reference`` (a strategy that ran with
    ``hostile`` silent; run here when not given). Returns (hostile strategy, reference strategy)."""
    if reference is None:
        reference = run_rounds(
            make_strategy, initial, honest, partitions, num_rounds, min_reply_fraction, silent=[hostile]
        )
    strategy = run_rounds(
        make_strategy,
        initial,
        honest,
        partitions,
        num_rounds,
        min_reply_fraction,
        hostile=hostile,
        corruption=corruption,
    )
    state, wanted = global_state(strategy), global_state(reference)
    assert state.keys() == wanted.keys() and state
    for name in wanted:
        assert np.all(np.isfinite(state[name])), (corruption.name, name)
        np.testing.assert_array_equal(state[name], wanted[name], err_msg=f"{corruption.name}: {name}")
    other = {"rejected": "failed", "failed": "rejected"}[corruption.counted]
    sampled_rounds = [r for r, log_ in strategy.rounds.items() if hostile in log_.sampled]
    assert sampled_rounds, "the hostile client was never sampled: the check proves nothing"
    for r in sampled_rounds:
        log_ = strategy.rounds[r]
        assert getattr(log_, corruption.counted).count(hostile) == 1, (corruption.name, r, log_)
        assert hostile not in getattr(log_, other) and hostile not in log_.accepted, (corruption.name, r, log_)
        assert sorted(log_.accepted) == sorted(reference.rounds[r].accepted), (corruption.name, r)
    return strategy, reference


# -- corruptions of a reply's content ------------------------------------------------------------------------------
HUGE_BYTES = 256 << 20  # the size of the oversized blobs


class Undecodable(Array):
    """An array that fails the test if anyone decodes it: oversized data must be refused from its metadata."""

    def numpy(self):
        raise AssertionError("an oversized array was decoded")


def _first_record(content: RecordDict) -> tuple[str, ArrayRecord]:
    return next(iter(content.array_records.items()))


def _with_array(content: RecordDict, change) -> RecordDict:
    """A copy of ``content`` whose first ArrayRecord has ``change(record)`` applied (arrays are re-wrapped)."""
    key, record = _first_record(content)
    copy = RecordDict(dict(content))
    changed = ArrayRecord({name: array for name, array in record.items()})
    change(changed)
    copy[key] = changed
    return copy


def _first_name(record: ArrayRecord) -> str:
    return next(iter(record.keys()))


def _set_values(value: float, pick: Callable[[ArrayRecord], str] | None = None):
    """Put ``value`` into the first element of the array ``pick(record)`` names (default: the first array;
    bfloat16 payloads: as a bfloat16 bit pattern)."""

    def change(record):
        name = (pick or _first_name)(record)
        data = record[name].numpy().copy()
        if data.dtype == np.int16:  # a bfloat16 payload: the upper half of the float32 bit pattern
            data.flat[0] = np.array([value], dtype=np.float32).view(np.int32)[0] >> 16
        else:
            data.flat[0] = value
        record[name] = Array(data)

    return change


def _as_dtype(dtype):
    def change(record):
        name = _first_name(record)
        record[name] = Array(record[name].numpy().astype(dtype))

    return change


def _reshape(change_shape):
    def change(record):
        name = _first_name(record)
        record[name] = Array(change_shape(record[name].numpy()).copy())  # a copy is C-contiguous, 0-d stays 0-d

    return change


def _drop_first(record):
    del record[_first_name(record)]


def _extra_huge(record):
    record["extra.weight"] = Undecodable("float32", (HUGE_BYTES // 4,), "numpy.ndarray", bytes(HUGE_BYTES))


def _oversized_under_valid_key(record):
    name = _first_name(record)
    array = record[name]
    record[name] = Undecodable(array.dtype, tuple(array.shape), array.stype, bytes(HUGE_BYTES))


def _lying_header(record):
    """Metadata of the expected shape, data of another shape with the same byte count (a flat vector)."""
    name = _first_name(record)
    array = record[name]
    flat = array.numpy().reshape(-1)
    record[name] = Array(array.dtype, tuple(array.shape), array.stype, Array(flat).data)


HUGE_CLAIM = 2**45  # elements a crafted .npy header claims: 128 TiB of float32, more than any address space holds


def crafted_header(array: Array, shape: tuple = (HUGE_CLAIM,)) -> Array:
    """``array`` with its metadata, byte count and values unchanged, but the .npy header inside its data claiming
    ``shape``: a reader that trusts the header (``np.load``, ``Array.numpy``) allocates that shape."""
    header_size = len(array.data) - int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize
    text = f"{{'descr': {np.lib.format.dtype_to_descr(np.dtype(array.dtype))!r}, 'fortran_order': False, "
    text += f"'shape': {tuple(shape)!r}, }}"
    body = text.ljust(header_size - 10 - 1) + "\n"  # after the magic string, the version and the 2-byte length
    assert len(body) + 10 == header_size, "the claim does not fit in the header's room"
    header = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("latin-1")
    return Array(array.dtype, tuple(array.shape), array.stype, header + array.data[header_size:])


def _huge_header(record):
    name = _first_name(record)
    record[name] = crafted_header(record[name])


def _with_metric(key: str, value) -> Callable:
    def corrupt(content: RecordDict, msg: Message) -> RecordDict:
        copy = RecordDict(dict(content))
        name, metrics = next(iter(content.metric_records.items()))
        changed = {k: v for k, v in metrics.items()}
        if value is None:
            changed.pop(key, None)
        else:
            changed[key] = value(changed[key]) if callable(value) else value  # a callable edits the honest value
        copy[name] = MetricRecord(changed)
        return copy

    return corrupt


def set_value_corruption(name: str, value: float, pick: Callable[[ArrayRecord], str]) -> Corruption:
    """A reply whose array ``pick(record)`` has ``value`` as its first element."""
    return array_corruption(name, _set_values(value, pick))


def array_corruption(name: str, change) -> Corruption:
    return Corruption(name, lambda content, msg: _with_array(content, change))


METRIC_KEYS = ("num-examples", "labels", "train-loss", "client-seconds")


def standard_corruptions(
    num_classes: int = 10,
    metric_keys: Iterable[str] = METRIC_KEYS,
    payload_dtype: str = "float32",
    exact_labels: bool = False,
) -> list[Corruption]:
    """Every kind of bad reply for a method whose replies carry an ArrayRecord and a MetricRecord; metric
    corruptions only for the ``metric_keys`` the method's replies use (with ``exact_labels``, also labels that are
    valid classes but not the partition's, which the server knows). Wrong dtypes are every dtype but the payload's
    wire dtype (float32, or int16 for bfloat16)."""
    keys = set(metric_keys)
    wrong_dtypes = [
        np.complex64,
        np.bool_,
        np.int8,
        np.float16,
        np.float64,
        np.int32,
        np.float32 if payload_dtype == "bfloat16" else np.int16,
    ]
    corruptions = [
        Corruption(
            "client-error",
            lambda content, msg: Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "raised"),
            counted="failed",
        ),
        Corruption(
            "node-unavailable",
            lambda content, msg: (SUPERLINK_NODE_ID, Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")),
            counted="failed",
        ),
        Corruption("never-answers", lambda content, msg: NEVER, counted="failed"),
        array_corruption("nan", _set_values(np.nan)),
        array_corruption("inf", _set_values(np.inf)),
        array_corruption("-inf", _set_values(-np.inf)),
        array_corruption("1e37", _set_values(1e37)),
        array_corruption("1e10", _set_values(1e10)),
        *[array_corruption(f"dtype-{np.dtype(d).name}", _as_dtype(d)) for d in wrong_dtypes],
        array_corruption("wrong-shape", _reshape(lambda a: a.reshape(-1)[:-1] if a.size > 1 else np.zeros(2, a.dtype))),
        array_corruption("scalar-array", _reshape(lambda a: np.asarray(a.reshape(-1)[0]))),
        array_corruption("missing-key", _drop_first),
        array_corruption("extra-huge-key", _extra_huge),
        array_corruption("huge-under-valid-key", _oversized_under_valid_key),
        array_corruption("header-disagrees-with-metadata", _lying_header),
        array_corruption("header-claims-a-huge-shape", _huge_header),
        Corruption(
            "no-arrays",
            lambda content, msg: RecordDict({k: v for k, v in content.items() if not isinstance(v, ArrayRecord)}),
        ),
        Corruption(
            "no-metrics",
            lambda content, msg: RecordDict({k: v for k, v in content.items() if not isinstance(v, MetricRecord)}),
        ),
    ]
    metric_cases = {
        "num-examples": [
            ("missing", None),
            ("1e12", 10**12),
            ("negative", -5),
            ("zero", 0),
            ("float", 50.5),
            ("list", [50]),
        ],
        "labels": [
            ("scalar", 3),
            ("out-of-range", [0, num_classes]),
            ("negative", [-1]),
            ("floats", [0.5]),
            ("repeated", [1, 1]),
        ],
        "train-loss": [
            ("list", [1.0, 2.0]),
            ("nan", float("nan")),
            ("negative", -1.0),
            ("inf", float("inf")),
            ("above-ceiling", 10 * MAX_TRAIN_LOSS),
        ],
        "client-seconds": [
            ("list", [1.0]),
            ("negative", -3.0),
            ("nan", float("nan")),
            ("above-ceiling", 10 * MAX_CLIENT_SECONDS),
        ],
    }
    if exact_labels:  # the server knows each partition's labels: in range and distinct, but not the partition's
        metric_cases["labels"] += [
            ("one-class-left-out", lambda held: held[:-1] if len(held) > 1 else [(held[0] + 1) % num_classes]),
            ("a-class-not-held", lambda held: held + [min(set(range(num_classes)) - set(held))]),
        ]
    for key in sorted(keys & set(metric_cases)):
        corruptions += [Corruption(f"{key}-{case}", _with_metric(key, value)) for case, value in metric_cases[key]]
    return corruptions
