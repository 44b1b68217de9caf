"""Tensor frames <-> numpy arrays inside an instance process.

Fixed-size tensors are viewed in place (``np.frombuffer``, no copy); BYTES tensors are
Triton's serialization, each element a 4-byte little-endian length and its bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from tritium import datatypes
from tritium.errors import InvalidArgument

_LENGTH = struct.Struct("<I")


def frame_to_array(buffer, datatype: str, shape: list[int], name: str) -> np.ndarray:
    dt = datatypes.from_name(datatype)
    if dt is None:
        raise InvalidArgument(f"input '{name}' has unknown datatype '{datatype}'")
    if dt.is_bytes:
        return deserialize_bytes(buffer, shape, name)
    array = np.frombuffer(buffer, dtype=datatypes.numpy_dtype(dt))
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise InvalidArgument(
            f"input '{name}' holds {array.size} elements of {datatype}, which do not fit shape "
            f"{list(shape)}") from exc


def deserialize_bytes(buffer, shape: list[int], name: str) -> np.ndarray:
    view = memoryview(buffer)
    items = []
    offset, end = 0, len(view)
    while offset < end:
        if offset + 4 > end:
            raise InvalidArgument(f"input '{name}': truncated BYTES element length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise InvalidArgument(f"input '{name}': BYTES element overruns the tensor data")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    try:
        return array.reshape(shape)
    except ValueError as exc:
        raise InvalidArgument(
            f"input '{name}' holds {len(items)} BYTES elements, which do not fit shape "
            f"{list(shape)}") from exc


def serialize_bytes(array: np.ndarray) -> bytes:
    chunks = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        chunks.append(_LENGTH.pack(len(item)))
        chunks.append(item)
    return b"".join(chunks)


def array_to_frame(array: np.ndarray, name: str) -> tuple[str, list[int], object]:
    """(datatype, shape, frame) for an output array; the frame shares the array's memory."""
    dt = datatypes.from_numpy(array.dtype)
    if dt is None:
        raise InvalidArgument(f"output '{name}' has dtype {array.dtype}, which has no Triton datatype")
    shape = list(array.shape)
    if dt.is_bytes:
        return dt.name, shape, serialize_bytes(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return dt.name, shape, memoryview(array).cast("B") if array.size else b""
