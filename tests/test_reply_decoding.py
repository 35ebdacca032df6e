"""Decoding client bytes: values are read from the metadata the server checked (dtype, shape, byte count), never from
the .npy header inside the data, and whatever decoding or checking one reply raises is that reply's rejection, never
the end of the round. The crafted-header reply for every method is in the hostile matrices
(tests/test_hostile_supernet.py, tests/test_hostile_fedtopo.py: ``header-claims-a-huge-shape``)."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

import strategies.multiarch_base as multiarch_base
from fl_app.run.payload import array_values, record_to_state, state_to_record
from strategies.feast import FeastStrategy
from strategies.fedtopo import FedTopoStrategy
from tests.hostile import Corruption, check_hostile, crafted_header, run_rounds
from tests.test_hostile_fedtopo import TEST, TRAIN, global_state_of, honest_of, make_strategy_of
from tests.test_hostile_supernet import supernet_setup

HONEST = [
    np.arange(12, dtype=np.float32).reshape(4, 3) - 5.5,
    np.random.default_rng(0).normal(size=(8, 3, 3, 3)).astype(np.float32),
    np.arange(-6, 6, dtype=np.int16).reshape(3, 4),
    np.array(2.5, dtype=np.float32),
    np.zeros((0, 5), dtype=np.float32),
    np.array([True, False, True]),
    np.arange(5, dtype=np.int64),
]


@pytest.mark.parametrize("value", HONEST, ids=lambda v: f"{v.dtype}{v.shape}")
def test_honest_arrays_decode_exactly_as_numpy_reads_them(value):
    array = Array(value)
    decoded, loaded = array_values(array), np.load(io.BytesIO(array.data), allow_pickle=False)
    assert decoded.dtype == loaded.dtype and decoded.shape == loaded.shape and decoded.flags.writeable
    assert decoded.tobytes() == loaded.tobytes()


@pytest.mark.parametrize("payload", ["float32", "bfloat16"])
def test_honest_records_decode_bit_identically_to_the_old_reader(payload):
    state = {"w": torch.randn(6, 4, generator=torch.Generator().manual_seed(1)), "b": torch.randn(4)}
    record = state_to_record(state, payload)
    for name, decoded in record_to_state(record, payload).items():
        old = record[name].numpy()  # what the decoder read before: numpy's own reader
        if payload == "bfloat16":
            old = torch.from_numpy(old.copy()).view(torch.bfloat16).float().numpy()
        assert decoded.dtype == np.float32 and decoded.tobytes() == old.astype(np.float32).tobytes()


def _fortran_header(array: Array) -> Array:
    """The same bytes, but the header says the data is in Fortran order (same length: 'True' vs 'False ')."""
    data = array.data.replace(b"'fortran_order': False, ", b"'fortran_order': True,  ", 1)
    return Array(array.dtype, tuple(array.shape), array.stype, data)


def _big_endian_header(array: Array) -> Array:
    data = array.data.replace(b"'<f4'", b"'>f4'", 1)
    return Array(array.dtype, tuple(array.shape), array.stype, data)


LYING = {
    "claims-a-huge-shape": crafted_header,
    "claims-another-shape-of-the-same-size": lambda a: crafted_header(a, (12,)),
    "fortran-order": _fortran_header,
    "big-endian": _big_endian_header,
    "not-a-header": lambda a: Array(a.dtype, tuple(a.shape), a.stype, bytes(len(a.data))),
    "one-byte-short": lambda a: Array(a.dtype, tuple(a.shape), a.stype, a.data[:-1]),
}


@pytest.mark.parametrize("lie", sorted(LYING))
def test_a_header_that_is_not_the_metadatas_is_refused_without_reading_it(lie):
    honest = Array(np.arange(12, dtype=np.float32).reshape(4, 3))
    lying = LYING[lie](honest)
    assert lying.dtype == honest.dtype and tuple(lying.shape) == tuple(honest.shape)
    with pytest.raises(ValueError, match=r"array data"):
        record_to_state(ArrayRecord({"w": lying}))


def test_metadata_numpy_cannot_decode_is_refused_with_a_value_error():
    value = Array(np.zeros(3, np.float32))
    for dtype in ("object", "no-such-dtype", "<f4"):
        with pytest.raises(ValueError, match="dtype"):
            array_values(Array(dtype, (3,), value.stype, value.data))
    with pytest.raises(ValueError, match="serialization type"):
        array_values(Array("float32", (3,), "torch.Tensor", value.data))
    with pytest.raises(ValueError, match="shape"):
        array_values(Array("float32", (-3,), value.stype, value.data))


# -- whatever a check raises rejects that reply only ---------------------------------------------------------------
HOSTILE = 0
AS_IS = Corruption("a-check-raises", lambda content, msg: content)  # the reply is honest; checking it raises


def _raise_for_hostile(original, is_hostile):
    def check(*args, **kwargs):
        if is_hostile(*args, **kwargs):
            raise MemoryError("made to raise by the test")
        return original(*args, **kwargs)

    return check


def test_a_check_that_raises_rejects_the_feast_reply_and_the_run_goes_on(flower_ids, monkeypatch, caplog):
    make_strategy, initial, honest, _ = supernet_setup("feast")
    monkeypatch.setattr(
        FeastStrategy,
        "metric_specs",
        _raise_for_hostile(FeastStrategy.metric_specs, lambda self, pid: pid == HOSTILE),
    )
    with caplog.at_level(logging.WARNING):
        check_hostile(make_strategy, initial, honest, lambda s: s.global_state, AS_IS)
    assert any("rejected: checking it raised MemoryError: made to raise" in m for m in caplog.messages)


def test_a_check_that_raises_rejects_the_fedtopo_reply_and_the_run_goes_on(flower_ids, monkeypatch, caplog):
    monkeypatch.setattr(
        FedTopoStrategy,
        "upload_problem",
        _raise_for_hostile(FedTopoStrategy.upload_problem, lambda self, pid, upload: pid == HOSTILE),
    )
    with caplog.at_level(logging.WARNING):
        check_hostile(
            make_strategy_of("fedtopo"), state_to_record({}), honest_of("fedtopo"), global_state_of("fedtopo"), AS_IS
        )
    assert any("rejected: checking it raised MemoryError" in m for m in caplog.messages)


def test_a_check_that_raises_rejects_the_evaluation_reply_and_the_run_goes_on(flower_ids, monkeypatch):
    def is_hostile_evaluation(metrics, specs):
        return "num-test" in specs and metrics.get("num-test") == TEST[HOSTILE]

    monkeypatch.setattr(
        multiarch_base, "metrics_problem", _raise_for_hostile(multiarch_base.metrics_problem, is_hostile_evaluation)
    )
    strategy = run_rounds(make_strategy_of("fedtopo"), state_to_record({}), honest_of("fedtopo"), TRAIN, 2, 0.6)
    for r in (1, 2):
        assert strategy.eval_rounds[r].rejected == [HOSTILE] and strategy.eval_rounds[r].accepted == [1, 2]
        assert strategy.rounds[r].accepted == [0, 1, 2]  # training replies were checked as usual
