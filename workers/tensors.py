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
    dtype = datatypes.numpy_dtype(dt)
    if len(buffer) % dtype.itemsize:
        raise InvalidArgument(
            f"input '{name}' has {len(buffer)} bytes, which is not a whole number of {datatype} "
            f"elements ({dtype.itemsize} bytes each)")
    array = np.frombuffer(buffer, dtype=dtype)
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
    return datatypes.pack_bytes(_as_bytes(item) for item in array.reshape(-1))


def _as_bytes(item) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        return item
    return (item if isinstance(item, str) else str(item)).encode("utf-8")


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
    # A uint8 view exports every dtype as bytes (memoryview cannot export bfloat16 itself).
    return dt.name, shape, memoryview(array.reshape(-1).view(np.uint8)) if array.size else b""


def check_tensor_size(name: str, datatype: str, shape: list[int], buffer) -> None:
    """Raise InvalidArgument unless ``buffer`` holds exactly the elements ``shape`` needs."""
    dt = datatypes.from_name(datatype)
    if dt is None:
        raise InvalidArgument(f"input '{name}' has unknown datatype '{datatype}'")
    count = 1
    for dim in shape:
        count *= dim
    if dt.is_bytes:
        found = _count_bytes(buffer, name)
        if found != count:
            raise InvalidArgument(f"input '{name}' holds {found} BYTES elements, but shape "
                                  f"{list(shape)} needs {count}")
        return
    if len(buffer) != count * dt.itemsize:
        raise InvalidArgument(f"input '{name}' has {len(buffer)} bytes, but shape {list(shape)} of "
                              f"{datatype} needs {count * dt.itemsize}")


def _count_bytes(buffer, name: str) -> int:
    view = memoryview(buffer)
    offset, end, count = 0, len(view), 0
    while offset < end:
        if offset + 4 > end:
            raise InvalidArgument(f"input '{name}': truncated BYTES element length")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4 + length
        if offset > end:
            raise InvalidArgument(f"input '{name}': BYTES element overruns the tensor data")
        count += 1
    return count
