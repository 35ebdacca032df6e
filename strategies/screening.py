"""Screening of client replies: the one path every strategy runs before a reply touches global state.

A reply is untrusted input. Every check returns a reason (a string naming the key or field, what was found and
what is allowed) or None when the input passes; the strategy logs the reason and counts the reply as rejected.

Arrays, in two stages:

1. ``record_problem(record, expected_shapes, payload_dtype)`` reads only each ``flwr.app.Array``'s metadata
   (``stype``, ``dtype``, ``shape``) and the length of its serialized ``data``, so nothing is decoded yet:
   - the key set equals ``expected_shapes``' (missing and unknown keys are named);
   - ``stype`` is ``numpy.ndarray`` and ``dtype`` is the payload's wire dtype (``wire_dtype``: float32, or the
     int16 bit patterns a bfloat16 payload travels as); complex, bool, int8, float16, float64 and every other dtype
     are refused, so nothing is silently cast (complex -> float drops the imaginary part);
   - the shape is exactly the expected one;
   - the serialized size is exactly what an .npy blob of that shape and dtype occupies (``payload.npy_bytes``), so an
     oversized blob (e.g. 256 MiB under a valid key) is refused without being read.
   Decoding (``fl_app.run.payload.array_values``) reads the values from that metadata, never from the .npy header
   inside the data: the header must be byte for byte the one NumPy writes for the screened dtype and shape (a header
   claiming a huge shape once made NumPy allocate it: MemoryError).
2. ``tensor_problem(name, tensor, max_abs)`` on each decoded tensor: every element finite and
   ``max|x| <= max_abs``. ``magnitude_bound(reference)`` is the bound for a tensor that updates a global tensor
   ``reference``:

       max_abs = min(MAX_ABS, RELATIVE_BOUND * max(1, max|reference|))

   i.e. a reply may be at most 1,000 times larger than the global tensor it was sent (or than 1, for tensors that are
   still near zero, e.g. biases at initialisation), and never beyond 1e6. One round of honest local training moves
   weights and BatchNorm statistics by far less; a value of 1e37 (which passes a finiteness check) is refused. The
   ceiling also keeps the aggregation's float32 sums finite: with weights at most ``MAX_WEIGHT`` per reply, a sum over
   K replies is bounded by K * MAX_WEIGHT * MAX_ABS = K * 2.1e15, far below float32's 3.4e38.
   Tensors without a global counterpart (uploaded statistics) pass their own bound, e.g. ``max_abs=1.0`` for
   probabilities.

   tests/test_hostile_supernet.py measures honest training against it: 1.9x at most, at ten times the default lr.

   The supernet family bounds a reply tensor by the routed slice of the global tensor it updates
   (``slice_relative_bound``): a trained tensor by ``magnitude_bound(global_slice, SLICE_RELATIVE_BOUND)``, i.e. 20
   times the slice's max-abs (or 20, for a slice still near zero). One shared formula, two multiples: 1,000 stops
   values that would overflow a sum; 20 stops a client that scales the model it was sent (999x the global was
   accepted), and still leaves honest training (1.9x) a tenfold margin. BatchNorm running statistics keep 1,000:
   they measure the activations of the weights just trained, not the global statistics (honest local training at
   ten times the default lr on the bundled images takes the stem's running variance from 1 to 80 in one round).

   ``variance_problem(name, tensor)``: BatchNorm running variances are never negative.

What the server derives, it checks exactly: each partition's per-class training counts follow from the seed (the
server splits the data as the clients do), so ``counts_problem`` requires the uploaded counts to equal them (FD
reports only the classes it saw in training: each count is 0 or the true one), and ``labels_spec(..., held=...)``
requires a reply's ``labels`` to be the partition's label set.

Metrics: ``metrics_problem(metrics, specs)`` checks a ``MetricRecord`` against a ``MetricSpec`` per key: the value's
kind (``int``, ``float``, ``int-list``, ``float-list``; an int passes where a float is wanted, a bool never passes as
an int, a scalar never passes as a list nor a list as a scalar), finiteness, an inclusive range ``low..high`` for
every element, list length, distinct elements and, with ``equals``, exactly these elements (in any order). Keys
without a spec are ignored (nothing reads them).
Common specs: ``examples_spec(partition_size)`` (num-examples: a positive int, at most the partition's size when the
server knows it, else at most ``MAX_WEIGHT``; with ``exact=True`` equal to it), ``labels_spec(num_classes)``
(distinct ints in 0..C-1), ``TRAIN_LOSS`` (finite, 0..``MAX_TRAIN_LOSS``), ``CLIENT_SECONDS`` (finite,
0..``MAX_CLIENT_SECONDS``), ``reply_cost_specs(max_steps)`` (what a training reply reports of its cost, every
metric a record keeps among them: ``RECORDED_METRICS``).

Order of use in a strategy: metrics, then ``record_problem``, then decode and ``tensor_problem`` / ``state_problem``
and the method's own invariants; see ``skeleton.RoundSkeleton.reply_problem``. Any exception raised while a reply
is decoded or checked rejects that reply, with ``fl_app.run.round_log.raised(error)`` as its reason: it never ends
the round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord

from fl_app.run.payload import NUMPY_STYPE, npy_bytes

RELATIVE_BOUND = 1e3  # a reply's max-abs may be this many times the global tensor's (or 1, if that is smaller)
SLICE_RELATIVE_BOUND = 20.0  # the supernet family: this many times the routed global slice's (or 1, if smaller)
MAX_ABS = 1e6  # and never larger than this
MAX_WEIGHT = 2**31 - 1  # the largest aggregation weight (num-examples) a reply may claim
WIRE_DTYPES = {"float32": "float32", "bfloat16": "int16"}  # payload dtype -> dtype of the arrays on the wire
# Ceilings of reported statistics (they are logged and written to results, never used to weigh anything). A mean
# cross-entropy of 1e4 means a probability of e^-10000 for the true class: only a diverged client gets near it; no
# round of this project waits a week for a client.
MAX_TRAIN_LOSS = 1e4
MAX_CLIENT_SECONDS = 7 * 24 * 3600.0
MAX_MEMORY_MB = float(2**30)  # a PiB: no client process here holds more
MAX_TRAIN_FLOPS = 1e21  # a week at 1e15 FLOP/s (the server computes the FLOPs it records itself: this bounds the claim)


def wire_dtype(payload_dtype: str) -> str:
    """The numpy dtype name arrays of a ``payload_dtype`` payload travel as."""
    if payload_dtype not in WIRE_DTYPES:
        raise ValueError(f"payload-dtype='{payload_dtype}': allowed values are {sorted(WIRE_DTYPES)}")
    return WIRE_DTYPES[payload_dtype]


# -- arrays, from metadata ---------------------------------------------------------------------------------------
def keys_problem(found, expected) -> str | None:
    missing, unknown = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or unknown:
        return f"keys differ from what was expected (missing {missing[:3]}, unknown {unknown[:3]})"
    return None


def array_problem(name: str, array: Any, shape: tuple, dtype: str) -> str | None:
    """Why ``array`` (a ``flwr.app.Array``) is not an ``dtype`` array of exactly ``shape``; metadata only."""
    if not isinstance(array, Array):
        return f"'{name}' is a {type(array).__name__}, not an Array"
    if array.stype != NUMPY_STYPE:
        return f"'{name}' has serialization type {array.stype!r}, allowed: {NUMPY_STYPE!r}"
    if array.dtype != dtype:
        return f"'{name}' has dtype {array.dtype}, allowed: {dtype}"
    if tuple(array.shape) != tuple(shape):
        return f"'{name}' has shape {tuple(array.shape)}, expected {tuple(shape)}"
    size, expected = len(array.data), npy_bytes(shape, dtype)
    if size != expected:
        return f"'{name}' holds {size} bytes, an array of shape {tuple(shape)} and dtype {dtype} holds {expected}"
    return None


def record_problem(record: Any, expected_shapes: Mapping[str, tuple], payload_dtype: str) -> str | None:
    """Why ``record`` is not an ArrayRecord of exactly ``expected_shapes`` in the payload's wire dtype (None when it
    is). Reads metadata only: call it before decoding anything."""
    if not isinstance(record, ArrayRecord):
        return f"arrays are a {type(record).__name__}, not an ArrayRecord"
    dtype = wire_dtype(payload_dtype)
    problem = keys_problem(record.keys(), expected_shapes)
    for name in expected_shapes:
        problem = problem or array_problem(name, record[name], expected_shapes[name], dtype)
    return problem


# -- arrays, decoded ---------------------------------------------------------------------------------------------
def magnitude_bound(reference: np.ndarray | None, relative: float = RELATIVE_BOUND) -> float:
    """Largest max-abs a reply tensor updating ``reference`` may have: ``relative`` times its scale, at least 1
    (see the module docstring)."""
    scale = float(np.max(np.abs(reference))) if reference is not None and np.size(reference) else 0.0
    return min(MAX_ABS, relative * max(1.0, scale if math.isfinite(scale) else MAX_ABS))


MEASURED_SUFFIXES = ("running_mean", "running_var")  # BatchNorm statistics: measured by a client, not trained


def slice_relative_bound(name: str, global_slice: np.ndarray | None) -> float:
    """The supernet family's bound of a reply tensor ``name`` updating ``global_slice`` (see the module docstring)."""
    measured = name.endswith(MEASURED_SUFFIXES)
    return magnitude_bound(global_slice, RELATIVE_BOUND if measured else SLICE_RELATIVE_BOUND)


SLICE_BOUND_BASIS = (
    f" ({SLICE_RELATIVE_BOUND:g}x the max-abs of the global slice it updates, {RELATIVE_BOUND:g}x for BatchNorm "
    "statistics; at least that many)"
)


def tensor_problem(name: str, tensor: np.ndarray, max_abs: float, basis: str = "") -> str | None:
    """Why a decoded tensor cannot be used: a NaN/Inf element or one beyond ``max_abs`` (one pass over it);
    ``basis`` says where the bound comes from."""
    if not np.size(tensor):
        return None
    largest = float(np.max(np.abs(tensor)))  # NaN propagates, Inf stays Inf
    if not math.isfinite(largest):
        return f"'{name}' contains NaN or Inf"
    if largest > max_abs:
        return f"'{name}' has magnitude {largest:.3g}, allowed at most {max_abs:.3g}{basis}"
    return None


def state_problem(
    state: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray] | None = None, max_abs: float | None = None
) -> str | None:
    """``tensor_problem`` for each tensor of ``state``, bounded by ``magnitude_bound(reference[name])`` or by a fixed
    ``max_abs``; each tensor is read once."""
    for name in state:
        bound = max_abs if max_abs is not None else magnitude_bound(None if reference is None else reference.get(name))
        problem = tensor_problem(name, state[name], bound)
        if problem:
            return problem
    return None


def variance_problem(name: str, tensor: np.ndarray) -> str | None:
    """A BatchNorm running variance (``*running_var``) below zero: no variance is negative."""
    if name.endswith("running_var") and np.size(tensor) and float(np.min(tensor)) < 0:
        return f"'{name}' is a running variance with a negative element ({float(np.min(tensor)):.3g})"
    return None


def counts_problem(
    counts: np.ndarray, known: np.ndarray | None, partition_size: int | None = None, seen_only: bool = False
) -> str | None:
    """Why uploaded per-class counts cannot be trusted: not finite, negative or fractional; not the partition's true
    per-class counts ``known`` (with ``seen_only``: each count 0 or the true one, for clients that report only the
    classes they saw in training). Without ``known``, the counts must sum to at most ``partition_size`` (exactly it
    unless ``seen_only``)."""
    counts = np.asarray(counts)
    if not np.all(np.isfinite(counts)):
        return "'counts' contains NaN or Inf"
    if np.any(counts < 0) or np.any(counts != np.round(counts)):
        return f"'counts' must be non-negative integers, got {_short(counts.tolist())}"
    if known is not None:
        known = np.asarray(known)
        matches = (counts == known) | (counts == 0) if seen_only else counts == known
        if counts.shape != known.shape or not np.all(matches):
            relation = "each 0 or equal to" if seen_only else "equal to"
            return (
                f"'counts' are {_short(counts.tolist())}, must be {relation} the partition's training split's "
                f"{_short(known.tolist())}"
            )
        return None
    total, limit = float(counts.sum()), partition_size if partition_size is not None else MAX_WEIGHT
    exact = partition_size is not None and not seen_only
    if total > limit or (exact and total != partition_size):
        relation = "equal" if exact else "at most"
        return f"'counts' sum to {total:.0f}, must be {relation} {limit} (the partition's training split)"
    return None


def absent_rows_problem(name: str, values: np.ndarray, counts: np.ndarray) -> str | None:
    """Per-class statistics of classes the client does not hold must be zero (nothing was measured)."""
    if np.any(values[counts == 0] != 0):
        return f"'{name}' has non-zero rows for classes with count 0"
    return None


# -- metrics -----------------------------------------------------------------------------------------------------
METRIC_KINDS = ("int", "float", "int-list", "float-list")


@dataclass(frozen=True)
class MetricSpec:
    """What one metric of a reply must be: ``kind`` (see METRIC_KINDS), every element finite and in
    ``low..high`` (inclusive), lists at most ``max_length`` long and, with ``distinct``, without repeats; with
    ``equals``, exactly that value (a list: those elements, in any order)."""

    kind: str
    low: float = -math.inf
    high: float = math.inf
    required: bool = True
    max_length: int = 1 << 16
    distinct: bool = False
    equals: tuple | None = None

    def __post_init__(self):
        if self.kind not in METRIC_KINDS:
            raise ValueError(f"kind='{self.kind}': allowed values are {list(METRIC_KINDS)}")

    def problem(self, key: str, value: Any) -> str | None:
        element_kind = self.kind.removesuffix("-list")
        if self.kind.endswith("-list"):
            if not isinstance(value, list):
                return f"metric '{key}'={_short(value)} is not a list of {element_kind}s"
            if len(value) > self.max_length:
                return f"metric '{key}' has {len(value)} elements, allowed at most {self.max_length}"
            if self.distinct and len(set(value)) != len(value):
                return f"metric '{key}'={_short(value)} has repeated elements"
            elements = value
        else:
            elements = [value]
        article = "an" if element_kind == "int" else "a"
        wanted = f"a list of {element_kind}s" if self.kind.endswith("-list") else f"{article} {element_kind}"
        for element in elements:
            if not _is_kind(element, element_kind):
                return f"metric '{key}'={_short(value)} is not {wanted}"
            if not math.isfinite(element):
                return f"metric '{key}'={_short(value)} is not finite"
            if not self.low <= element <= self.high:
                return f"metric '{key}'={_short(value)} outside {self.low:g}..{self.high:g}"
        if self.equals is not None and sorted(elements) != sorted(self.equals):
            wanted = list(self.equals) if self.kind.endswith("-list") else self.equals[0]
            return f"metric '{key}'={_short(value)}, the server derives {_short(wanted)} for this client"
        return None


def _is_kind(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int" else isinstance(value, (int, float))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def metrics_problem(metrics: Any, specs: Mapping[str, MetricSpec]) -> str | None:
    """Why ``metrics`` (a MetricRecord) does not meet ``specs`` (None when it does)."""
    if not isinstance(metrics, MetricRecord):
        return f"metrics are a {type(metrics).__name__}, not a MetricRecord"
    for key, spec in specs.items():
        if key not in metrics:
            if spec.required:
                return f"metric '{key}' is missing"
            continue
        problem = spec.problem(key, metrics[key])
        if problem:
            return problem
    return None


NON_NEGATIVE = MetricSpec("float", low=0.0, required=False)
TRAIN_LOSS = MetricSpec("float", low=0.0, high=MAX_TRAIN_LOSS, required=False)
CLIENT_SECONDS = MetricSpec("float", low=0.0, high=MAX_CLIENT_SECONDS, required=False)
MEMORY_MB = MetricSpec("float", low=0.0, high=MAX_MEMORY_MB, required=False)
TRAIN_FLOPS = MetricSpec("float", low=0.0, high=MAX_TRAIN_FLOPS, required=False)
# the reply metrics clients.csv keeps (fl_app.run.outputs.CLIENT_METRICS), each screened before it is recorded;
# train-flops and trained-macs are recorded from what the server routed (``RoundSkeleton.routed_work``), not these
RECORDED_METRICS = {
    "train-loss": TRAIN_LOSS,
    "client-seconds": CLIENT_SECONDS,
    "peak-rss-mb": MEMORY_MB,
    "cuda-peak-mb": MEMORY_MB,
}


def reply_cost_specs(max_steps: int | None) -> dict[str, MetricSpec]:
    """What a training reply's cost metrics must be: ``RECORDED_METRICS``, the client's claimed ``train-flops`` and
    ``trained-macs`` (finite, non-negative, bounded; never recorded) and ``local-steps``, an int from 0 to
    ``max_steps`` (the steps the run config allows the partition, ``LocalTraining.steps``; None: unknown, at most
    ``MAX_WEIGHT``). The server's FLOPs are the routed step's MACs times these steps."""
    return {
        **RECORDED_METRICS,
        "train-flops": TRAIN_FLOPS,
        "trained-macs": NON_NEGATIVE,
        "local-steps": MetricSpec("int", low=0, high=MAX_WEIGHT if max_steps is None else max_steps, required=False),
    }


def examples_spec(partition_size: int | None = None, exact: bool = False) -> MetricSpec:
    """num-examples: a positive int, at most the partition's size when the server knows it (with ``exact``, equal
    to it: clients that train on their whole partition)."""
    if partition_size is None:
        return MetricSpec("int", low=1, high=MAX_WEIGHT)
    return MetricSpec("int", low=partition_size if exact else 1, high=partition_size)


def labels_spec(num_classes: int, required: bool = False, held=None) -> MetricSpec:
    """labels: distinct class indices 0..C-1; with ``held`` (the partition's labels, when the server knows them),
    exactly those, and required."""
    return MetricSpec(
        "int-list",
        low=0,
        high=num_classes - 1,
        required=required or held is not None,
        max_length=num_classes,
        distinct=True,
        equals=None if held is None else tuple(int(c) for c in held),
    )
