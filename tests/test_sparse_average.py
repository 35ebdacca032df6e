"""Sparse aggregation against hand computations."""

from __future__ import annotations

import numpy as np

from strategies.sparse import sparse_average, update_problem


def test_overlapping_slices_hand_computation():
    global_state = {"w": np.zeros((3, 4), dtype=np.float32), "b": np.full(3, 7.0, dtype=np.float32)}
    a = {"w": np.full((1, 2), 1.0), "b": np.array([1.0])}
    b = {"w": np.full((2, 3), 4.0), "b": np.array([4.0, 4.0])}
    c = {"w": np.full((3, 1), 10.0)}
    result = sparse_average(global_state, [(a, 1.0), (b, 2.0), (c, 1.0)])
    expected_w = np.array(
        [
            # (0,0): a,b,c -> (1 + 8 + 10) / 4; (0,1): a,b -> (1 + 8) / 3; (0,2): b; (0,3): nobody
            [19 / 4, 9 / 3, 4, 0],
            [(8 + 10) / 3, 4, 4, 0],
            [10, 0, 0, 0],
        ]
    )
    np.testing.assert_allclose(result["w"], expected_w, rtol=1e-6)
    np.testing.assert_allclose(result["b"], [(1 + 8) / 3, 4, 7])  # last element uncovered keeps 7


def test_uniform_weights_and_untouched_global():
    g = {"w": np.arange(4, dtype=np.float32)}
    out = sparse_average(g, [({"w": np.array([10.0, 10.0])}, 1), ({"w": np.array([0.0])}, 1)])
    np.testing.assert_allclose(out["w"], [5, 10, 2, 3])
    np.testing.assert_array_equal(g["w"], [0, 1, 2, 3])  # the input is not modified


def test_malformed_updates_are_rejected_and_do_not_touch_the_result():
    g = {"w": np.zeros((2, 2), dtype=np.float32)}
    good = {"w": np.ones((1, 1))}
    bad = [
        {"unknown": np.ones(1)},
        {"w": np.ones((3, 2))},  # larger than the global tensor
        {"w": np.ones((2,))},  # wrong rank
        {"w": np.array([[np.nan]])},
        {"w": np.array([[np.inf]])},
    ]
    reference = sparse_average(g, [(good, 1.0)])
    mixed = sparse_average(g, [(good, 1.0)] + [(b, 5.0) for b in bad] + [(good, 0.0), (good, float("nan"))])
    np.testing.assert_array_equal(mixed["w"], reference["w"])
    assert reference["w"][0, 0] == 1 and reference["w"][1, 1] == 0


def test_update_problem_reasons():
    g = {"w": np.zeros((2, 2))}
    assert "unknown" in update_problem(g, {"x": np.ones(1)}, 1)
    assert "prefix" in update_problem(g, {"w": np.ones((3, 1))}, 1)
    assert "NaN" in update_problem(g, {"w": np.array([[np.nan]])}, 1)
    assert "routed" in update_problem(g, {"w": np.ones((1, 1))}, 1, expected_shapes={"w": (2, 1)})
    assert "missing" in update_problem(g, {}, 1, expected_shapes={"w": (2, 1)})
    assert update_problem(g, {"w": np.ones((2, 1))}, 3, expected_shapes={"w": (2, 1)}) is None


def test_checked_updates_are_read_once_and_their_weights_still_checked():
    class Counting(dict):
        reads = 0

        def __getitem__(self, name):
            Counting.reads += 1
            return dict.__getitem__(self, name)

    g = {"w": np.zeros(3, dtype=np.float32), "b": np.zeros(2, dtype=np.float32)}
    updates = [
        (Counting(w=np.ones(2, dtype=np.float32), b=np.ones(1, dtype=np.float32)), 1.0),
        (Counting(w=np.full(3, 4.0, dtype=np.float32)), 3.0),
        (Counting(w=np.full(3, 9.0, dtype=np.float32)), 0.0),
    ]  # weight 0: rejected either way
    checked = sparse_average(g, updates, tensors_checked=True)
    assert Counting.reads == 3  # one read per tensor of the two valid updates, none for validation
    unchecked = sparse_average(g, updates)
    for name in g:
        np.testing.assert_array_equal(checked[name], unchecked[name])
    np.testing.assert_allclose(checked["w"], [(1 + 12) / 4, (1 + 12) / 4, 4.0])
