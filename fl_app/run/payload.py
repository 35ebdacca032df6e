"""Model state on the wire: ArrayRecords in float32 or bfloat16, and the bytes they occupy in a message."""

from __future__ import annotations

import io
import math
from typing import Iterator, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

PAYLOAD_DTYPES = ("float32", "bfloat16")
NUMPY_STYPE = "numpy.ndarray"  # the serialization type of Arrays built from NumPy arrays


def state_to_record(state: Mapping[str, np.ndarray | torch.Tensor], dtype: str = "float32") -> ArrayRecord:
    """Encode a name -> tensor mapping. bfloat16 travels as its raw 16-bit pattern (numpy has no bfloat16)."""
    if dtype not in PAYLOAD_DTYPES:
        raise ValueError(f"payload-dtype='{dtype}': allowed values are {list(PAYLOAD_DTYPES)}")
    arrays = {}
    for name, value in state.items():
        tensor = torch.as_tensor(value).detach().cpu()
        if dtype == "bfloat16" and tensor.is_floating_point():
            arrays[name] = Array(tensor.to(torch.bfloat16).view(torch.int16).contiguous().numpy())
        else:
            arrays[name] = Array(
                tensor.float().contiguous().numpy() if tensor.is_floating_point() else tensor.contiguous().numpy()
            )
    return ArrayRecord(arrays)


def record_to_state(record: ArrayRecord, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Decode to float32 numpy arrays."""
    return {name: _decode(array, dtype) for name, array in record.items()}


def _decode(array: Array, dtype: str) -> np.ndarray:
    value = array_values(array)
    if dtype == "bfloat16" and value.dtype == np.int16:
        value = torch.from_numpy(value.copy()).view(torch.bfloat16).float().numpy()
    return value.astype(np.float32, copy=False)


DECODABLE_KINDS = "biuf"  # bool, signed and unsigned integers, floats: what model state travels as


def array_values(array: Array) -> np.ndarray:
    """The values of an ``Array`` read from the dtype and shape of its metadata, never from the .npy header inside
    its data: that header is checked to be byte for byte the one NumPy writes for that dtype and shape, and the data
    to hold exactly that many elements after it, before anything is read. (``Array.numpy()`` allocates whatever
    shape the header claims: a reply whose metadata is right could make the server allocate terabytes.)
    Raises ValueError naming what disagrees."""
    if array.stype != NUMPY_STYPE:
        raise ValueError(f"array has serialization type {array.stype!r}, allowed: {NUMPY_STYPE!r}")
    shape = tuple(array.shape)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"array metadata has shape {shape}: dimensions must be non-negative integers")
    try:
        np_dtype = np.dtype(array.dtype)
    except TypeError:
        raise ValueError(f"array metadata has dtype {array.dtype!r}, which NumPy does not know") from None
    if np_dtype.kind not in DECODABLE_KINDS or str(np_dtype) != array.dtype:
        raise ValueError(f"array metadata has dtype {array.dtype!r}: only plain bool, integer and float dtypes")
    header, count = npy_header(shape, np_dtype), math.prod(shape)
    data = array.data
    if len(data) != len(header) + count * np_dtype.itemsize:
        raise ValueError(
            f"array data holds {len(data)} bytes, an array of shape {shape} and dtype {array.dtype} "
            f"holds {len(header) + count * np_dtype.itemsize}"
        )
    if data[: len(header)] != header:
        raise ValueError(
            f"array data's .npy header {_header_text(data, len(header))} is not the one of its metadata, "
            f"{array.dtype} {shape}"
        )
    # a copy: writable, and independent of the message's buffer (as np.load's result was)
    return np.frombuffer(data, dtype=np_dtype, count=count, offset=len(header)).reshape(shape).copy()


def _header_text(data: bytes, length: int) -> str:
    text = bytes(data[10:length]).decode("latin-1").strip()  # after the magic string and the header length
    return repr(text if len(text) <= 80 else text[:77] + "...")


class RecordState(Mapping):
    """A read-only name -> float32 array view of an ArrayRecord that decodes one array when it is read.

    Aggregating several replies through this view holds one decoded tensor per reply at a time instead of every
    reply's whole decoded model."""

    def __init__(self, record: ArrayRecord, dtype: str = "float32"):
        self.record, self.dtype = record, dtype

    def __getitem__(self, name: str) -> np.ndarray:
        return _decode(self.record[name], self.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.record)

    def __contains__(self, name: object) -> bool:  # Mapping's default would decode the array to answer
        return name in self.record

    def __len__(self) -> int:
        return len(self.record)


def record_bytes(record: ArrayRecord) -> int:
    """Bytes the arrays occupy in a message (serialised data plus keys)."""
    return record.count_bytes()


def payload_bytes(shapes: Mapping[str, tuple], dtype: str = "float32") -> int:
    """Bytes ``state_to_record`` would place in a message for tensors of these shapes, without building it.

    Each array travels as an .npy blob (header + data) plus its key, as ``ArrayRecord.count_bytes`` counts.
    """
    wire = "int16" if dtype == "bfloat16" else "float32"
    return sum(npy_bytes(shape, wire) + len(name) for name, shape in shapes.items())


def npy_header(shape: tuple, dtype) -> bytes:
    """The .npy header (format 1.0) NumPy writes before the data of a C-ordered array of this shape and dtype."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header,
        {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)},
    )
    return header.getvalue()


def npy_bytes(shape: tuple, dtype: str) -> int:
    """Serialized size of an array of this shape and dtype as an .npy blob (what ``Array.data`` holds)."""
    return len(npy_header(shape, dtype)) + math.prod(shape) * np.dtype(dtype).itemsize
