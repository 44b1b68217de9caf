"""Tensors in Triton's trace file (trace level ``TENSORS``): a request's inputs as it brought them
(``TENSOR_QUEUE_INPUT``) and its outputs as its model gave them (``TENSOR_BACKEND_OUTPUT``),
each as ``{"name", "data", "shape", "dtype"}`` with the values in one comma-separated string,
written as Triton 2.51 writes them: numbers as C++ streams print them (``%g``), booleans as 1
and 0, each BYTES element in double quotes, FP16 and BF16 with no values.

Two deliberate differences keep the file valid JSON: INT8 and UINT8 values are numbers (Triton
writes each as the raw character), and BYTES that are not UTF-8 have the bad bytes replaced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from tritonclient.utils import deserialize_bytes_tensor

from tritium import datatypes
from tritium.protocol import ProtocolError, tensor_views

log = logging.getLogger(__name__)

TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"
_FLOATS = ("FP32", "FP64")


def tensor_record(name: str, datatype: str, shape: list[int], data: bytes | memoryview) -> dict:
    """The ``tensor`` of one trace record; ``data`` in Triton's binary layout."""
    return {"name": name, "data": _values(datatype, data), "shape": ",".join(map(str, shape)), "dtype": datatype}


def raw_tensors(descriptors: Sequence[list], datas: Iterable) -> list[list]:
    """Tensors as a trace carries them to the trace file, unformatted: [name, datatype, shape,
    bytes] from their wire descriptors and data (bytes, a view or a ZeroMQ frame, copied: the
    memory it lies in may be reused). Formatting waits for the file's writer thread, so that a
    large tensor does not hold up the loop that serves requests."""
    return [[d[0], d[1], list(d[2]), bytes(memoryview(data))] for d, data in zip(descriptors, datas)]


def raw_answer_tensors(descriptors: Sequence[list], view, offset: int, frames: Sequence) -> list[list]:
    """An answer's output tensors (its descriptors, its record's ``view`` from ``offset`` and its
    external frames) as ``raw_tensors``; none when the answer is malformed, which its reader reports."""
    try:
        return raw_tensors(descriptors, tensor_views(descriptors, view, offset, frames))
    except ProtocolError:
        return []


def formatted(tensors: Sequence, model: str) -> list[dict]:
    """The records of a trace's tensors, raw (``raw_tensors``) or already formatted; none when one
    cannot be written: that costs the trace its tensors, never the file its other records."""
    try:
        return [t if isinstance(t, dict) else tensor_record(t[0], t[1], t[2], t[3]) for t in tensors]
    except Exception:
        log.exception("the tensors of a traced request for model '%s' are not written", model)
        return []


def _values(datatype: str, data: bytes | memoryview) -> str:
    if datatype == "BYTES":
        return ",".join(f'"{element.decode("utf-8", "replace")}"' for element in deserialize_bytes_tensor(bytes(data)))
    if datatype in ("FP16", "BF16"):
        return ""   # Triton has no formatter for them
    array = np.frombuffer(data, datatypes.numpy_dtype(datatypes.BY_NAME[datatype]))
    if datatype == "BOOL":
        return ",".join("1" if value else "0" for value in array.tolist())
    if datatype in _FLOATS:
        return ",".join("%g" % value for value in array.tolist())
    return ",".join(map(str, array.tolist()))
