"""Tensor datatypes: protocol names, config enum names, numpy dtypes and sizes in one table."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DataType:
    name: str            # protocol name, e.g. "FP32"
    config_name: str     # model config enum name, e.g. "TYPE_FP32"
    itemsize: int        # bytes per element; 0 for the variable-size BYTES
    numpy: np.dtype | None  # None where numpy has no native type (BF16)
    json_allowed: bool = True

    @property
    def is_bytes(self) -> bool:
        return self.itemsize == 0


_LE = "<"

DATATYPES: tuple[DataType, ...] = (
    DataType("BOOL", "TYPE_BOOL", 1, np.dtype(np.bool_)),
    DataType("UINT8", "TYPE_UINT8", 1, np.dtype(np.uint8)),
    DataType("UINT16", "TYPE_UINT16", 2, np.dtype(_LE + "u2")),
    DataType("UINT32", "TYPE_UINT32", 4, np.dtype(_LE + "u4")),
    DataType("UINT64", "TYPE_UINT64", 8, np.dtype(_LE + "u8")),
    DataType("INT8", "TYPE_INT8", 1, np.dtype(np.int8)),
    DataType("INT16", "TYPE_INT16", 2, np.dtype(_LE + "i2")),
    DataType("INT32", "TYPE_INT32", 4, np.dtype(_LE + "i4")),
    DataType("INT64", "TYPE_INT64", 8, np.dtype(_LE + "i8")),
    DataType("FP16", "TYPE_FP16", 2, np.dtype(_LE + "f2"), json_allowed=False),
    DataType("FP32", "TYPE_FP32", 4, np.dtype(_LE + "f4")),
    DataType("FP64", "TYPE_FP64", 8, np.dtype(_LE + "f8")),
    DataType("BYTES", "TYPE_STRING", 0, np.dtype(np.object_)),
    DataType("BF16", "TYPE_BF16", 2, None, json_allowed=False),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in DATATYPES}
BY_CONFIG_NAME: dict[str, DataType] = {d.config_name: d for d in DATATYPES}


_ELEMENT_LENGTH = struct.Struct("<I")


def pack_bytes(items: Iterable[bytes]) -> bytes:
    """BYTES tensor data as Triton lays it out: each element's 4-byte little-endian length, then the element."""
    return b"".join(_ELEMENT_LENGTH.pack(len(item)) + item for item in items)


def fits(dtype: np.dtype | None, values) -> bool:
    """Whether every number of ``values`` (Python numbers) fits an integer ``dtype`` (any other: True).
    Checked before converting: numpy 1 wraps what numpy 2 refuses."""
    if dtype is None or dtype.kind not in "iu" or not values:
        return True
    info = np.iinfo(dtype)
    return info.min <= min(values) and max(values) <= info.max


def from_name(name: str) -> DataType | None:
    return BY_NAME.get(name)


def from_config_name(config_name: str) -> DataType | None:
    return BY_CONFIG_NAME.get(config_name)


def is_bf16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16. ``kind`` first: numpy computes ``name`` in Python
    (about 1.7 us a look, on the path of every request's inputs)."""
    return dtype.kind == "V" and dtype.name == "bfloat16"


def _lookup_numpy(dtype: np.dtype) -> DataType | None:
    if dtype.kind in "OSU":
        return BY_NAME["BYTES"]
    if is_bf16(dtype):
        return BY_NAME["BF16"]
    for d in DATATYPES:
        if d.numpy is not None and d.numpy.kind == dtype.kind and d.numpy.itemsize == dtype.itemsize:
            return d
    return None


_BY_NUMPY: dict[np.dtype, DataType | None] = {}


def from_numpy(dtype) -> DataType | None:
    """The protocol datatype of a numpy dtype (object and bytes/str arrays are BYTES)."""
    try:
        return _BY_NUMPY[dtype]
    except (KeyError, TypeError):
        pass
    found = _lookup_numpy(np.dtype(dtype))
    try:
        _BY_NUMPY[dtype] = found  # on the output path of every request: look each dtype up once
    except TypeError:
        pass
    return found


def numpy_dtype(d: DataType) -> np.dtype:
    """The numpy dtype used to view a tensor of datatype ``d`` (BF16 needs ml_dtypes)."""
    if d.numpy is not None:
        return d.numpy
    import ml_dtypes  # only instance processes that see BF16 pay for the import

    return np.dtype(ml_dtypes.bfloat16)
