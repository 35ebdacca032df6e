"""strategies/screening.py: the reasons it gives, and the edges the hostile matrix does not reach."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord

from fl_app.run.payload import state_to_record
from strategies.screening import (
    MAX_WEIGHT,
    NON_NEGATIVE,
    MetricSpec,
    examples_spec,
    labels_spec,
    magnitude_bound,
    metrics_problem,
    record_problem,
    wire_dtype,
)
from strategies.sparse import sparse_average, update_problem

SHAPES = {"w": (2, 3), "b": (3,)}


def test_metadata_checks_pass_both_payload_dtypes_and_name_what_is_wrong():
    for dtype in ("float32", "bfloat16"):
        assert record_problem(state_to_record({"w": np.ones((2, 3)), "b": np.ones(3)}, dtype), SHAPES, dtype) is None
    good = state_to_record({"w": np.ones((2, 3)), "b": np.ones(3)})
    assert record_problem(good, SHAPES, "bfloat16") == "'w' has dtype float32, allowed: int16"
    assert "not an ArrayRecord" in record_problem({"w": 1}, SHAPES, "float32")
    big_endian = ArrayRecord({"w": Array(np.ones((2, 3), ">f4")), "b": Array(np.ones(3, np.float32))})
    assert "dtype >f4" in record_problem(big_endian, SHAPES, "float32")
    other_stype = ArrayRecord({"w": Array("float32", (2, 3), "torch.Tensor", good["w"].data), "b": good["b"]})
    assert "serialization type 'torch.Tensor'" in record_problem(other_stype, SHAPES, "float32")
    with pytest.raises(ValueError, match="payload-dtype='float16'"):
        wire_dtype("float16")


def test_metric_specs_kinds_ranges_and_bools():
    specs = {"n": examples_spec(100), "labels": labels_spec(4), "loss": NON_NEGATIVE}
    assert metrics_problem(MetricRecord({"n": 60, "labels": [0, 3], "loss": 2}), specs) is None  # an int loss is fine
    assert metrics_problem(MetricRecord({"n": 101}), specs) == "metric 'n'=101 outside 1..100"
    assert metrics_problem(MetricRecord({"n": 60, "labels": [0, 4]}), specs) == "metric 'labels'=[0, 4] outside 0..3"
    assert metrics_problem(MetricRecord({"n": 60, "labels": [0, 1, 2, 3, 3]}), specs).endswith(
        "has 5 elements, allowed at most 4"
    )
    assert metrics_problem(MetricRecord({"n": MAX_WEIGHT}), {"n": examples_spec()}) is None
    assert (
        metrics_problem(MetricRecord({"n": 60}), {"n": examples_spec(100, exact=True)})
        == "metric 'n'=60 outside 100..100"
    )
    assert MetricSpec("int").problem("flag", True) == "metric 'flag'=True is not an int"  # a bool is not a count
    assert MetricSpec("float-list", low=0).problem("xs", [0.5, -1.0]) == "metric 'xs'=[0.5, -1.0] outside 0..inf"
    assert "not a MetricRecord" in metrics_problem({"n": 1}, specs)
    with pytest.raises(ValueError, match="kind='str'"):
        MetricSpec("str")


def test_magnitude_bound_scales_with_the_global_tensor_up_to_a_ceiling():
    assert magnitude_bound(np.zeros(3)) == 1e3  # tensors near zero: 1000 x 1
    assert magnitude_bound(np.array([-5.0, 2.0])) == 5e3
    assert magnitude_bound(np.full(2, 1e9)) == 1e6
    assert magnitude_bound(np.array([np.inf])) == 1e6  # a non-finite global tensor gets the ceiling, not inf
    assert magnitude_bound(None) == 1e3


def test_aggregation_weights_beyond_max_weight_are_refused():
    g = {"w": np.zeros(2, dtype=np.float32)}
    assert "weight" in update_problem(g, {"w": np.ones(2)}, MAX_WEIGHT + 1)
    out = sparse_average(g, [({"w": np.ones(2)}, 1.0), ({"w": np.full(2, 9.0)}, float(MAX_WEIGHT) * 2)])
    np.testing.assert_array_equal(out["w"], [1.0, 1.0])
