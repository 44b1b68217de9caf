"""Tensor frames <-> numpy arrays inside an instance process.

Fixed-size tensors are viewed in place (``np.frombuffer``, no copy); BYTES tensors are
Triton's serialization, each element a 4-byte little-endian length and its bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from tritium import datatypes
from tritium.errors import InvalidArgument
from tritium.protocol import INLINE_LIMIT

_LENGTH = struct.Struct("<I")

_ITEMSIZES: dict[str, int] = {d.name: d.itemsize for d in datatypes.DATATYPES}
# Fixed-size datatypes' numpy dtypes by protocol name, filled as each is first seen (BF16 imports ml_dtypes).
_DTYPES: dict[str, np.dtype] = {}


def _fixed_dtype(datatype: str, name: str) -> np.dtype | None:
    """The numpy dtype of a fixed-size datatype; None for BYTES."""
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        dt = datatypes.from_name(datatype)
        if dt is None:
            raise InvalidArgument(f"input '{name}' has unknown datatype '{datatype}'")
        if dt.is_bytes:
            return None
        dtype = _DTYPES[datatype] = datatypes.numpy_dtype(dt)
    return dtype


def frame_to_array(buffer, datatype: str, shape: list[int], name: str) -> np.ndarray:
    dtype = _fixed_dtype(datatype, name)
    if dtype is None:
        return deserialize_bytes(buffer, shape, name)
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


def writable_rows(buffers: list, datatype: str, shapes: list[list[int]], name: str) -> list[np.ndarray]:
    """One writable array per buffer (a fixed-size tensor each, of ``shapes`` that differ at most
    in their first dimension): read-only buffers (received bytes) are copied once, together, as
    rows of one array, instead of each becoming an array of its own and then a copy; writable
    ones are used in place."""
    dtype = _fixed_dtype(datatype, name)
    if not any(memoryview(buffer).readonly for buffer in buffers):
        # Each received into a buffer of its own (a large tensor's frame): already writable,
        # and copying 600 KB per request was most of an instance's CPU for an image model.
        return [np.frombuffer(buffer, dtype).reshape(shape) for buffer, shape in zip(buffers, shapes)]
    whole = np.frombuffer(bytearray().join(buffers), dtype).reshape(
        [sum(shape[0] for shape in shapes), *shapes[0][1:]])
    rows, start = [], 0
    for shape in shapes:
        rows.append(whole[start:start + shape[0]])
        start += shape[0]
    return rows


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
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    return bytes(item) if isinstance(item, bytearray) else str(item).encode("utf-8")


def array_to_frame(array: np.ndarray, name: str) -> tuple[str, list[int], bytes | memoryview]:
    """(datatype, shape, frame) for an output array; a frame too large to go inline in a record
    shares the array's memory."""
    dt = datatypes.from_numpy(array.dtype)
    if dt is None:
        raise InvalidArgument(f"output '{name}' has dtype {array.dtype}, which has no Triton datatype")
    shape = list(array.shape)
    if dt.is_bytes:
        return dt.name, shape, serialize_bytes(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.nbytes < INLINE_LIMIT:   # copied into the record anyway: one copy (in C order) costs least
        return dt.name, shape, array.tobytes()
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    # A uint8 view exports every dtype as bytes (memoryview cannot export bfloat16 itself).
    return dt.name, shape, array.reshape(-1).view(np.uint8).data


def check_tensor_size(name: str, datatype: str, shape: list[int], buffer) -> None:
    """Raise InvalidArgument unless ``buffer`` holds exactly the elements ``shape`` needs."""
    itemsize = _ITEMSIZES.get(datatype)
    if itemsize is None:
        raise InvalidArgument(f"input '{name}' has unknown datatype '{datatype}'")
    count = 1
    for dim in shape:
        count *= dim
    if itemsize == 0:   # BYTES
        found = _count_bytes(buffer, name)
        if found != count:
            raise InvalidArgument(f"input '{name}' holds {found} BYTES elements, but shape "
                                  f"{list(shape)} needs {count}")
        return
    if len(buffer) != count * itemsize:
        raise InvalidArgument(f"input '{name}' has {len(buffer)} bytes, but shape {list(shape)} of "
                              f"{datatype} needs {count * itemsize}")


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
