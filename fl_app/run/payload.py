"""Model state on the wire: ArrayRecords in float32 or bfloat16, and the bytes they occupy in a message."""

from __future__ import annotations

import io
from typing import Iterator, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

PAYLOAD_DTYPES = ("float32", "bfloat16")


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
    value = array.numpy()
    # the .npy header inside the data is what numpy trusts; it must agree with the metadata that was screened
    if str(value.dtype) != array.dtype or tuple(value.shape) != tuple(array.shape):
        raise ValueError(
            f"array data holds {value.dtype} {tuple(value.shape)} but its metadata says "
            f"{array.dtype} {tuple(array.shape)}"
        )
    if dtype == "bfloat16" and value.dtype == np.int16:
        value = torch.from_numpy(value.copy()).view(torch.bfloat16).float().numpy()
    return value.astype(np.float32, copy=False)


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


def npy_bytes(shape: tuple, dtype: str) -> int:
    """Serialized size of an array of this shape and dtype as an .npy blob (what ``Array.data`` holds)."""
    np_dtype = np.dtype(dtype)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(np_dtype), "fortran_order": False, "shape": tuple(shape)}
    )
    return header.tell() + int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
