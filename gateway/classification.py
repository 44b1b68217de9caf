"""Triton's classification extension: an output's top-k classes instead of its values.

An output requested with the ``classification: k`` parameter comes back as a BYTES tensor
of ``"<value>:<index>"`` strings (``"<value>:<index>:<label>"`` where the output's
``label_filename`` has a line for that index), highest value first, ties by index; shape
``[batch, k]`` for a batching model, ``[k]`` otherwise. Values print as C's ``%f`` for
floating-point outputs and as integers for integer outputs, as Triton prints them.
"""

from __future__ import annotations

import numpy as np

from tritium.gateway.inference import OutputTensor
from tritium import datatypes
from tritium.errors import InvalidArgument

# The types Triton ranks: integers and FP32/FP64 (not FP16 or BF16, not BOOL or BYTES).
_CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def classification_count(owner: str, parameters: dict) -> int | None:
    """The k an output asks for, or None; 0 means no classification, as in Triton."""
    value = parameters.get("classification")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"Unable to set 'classification' of {owner}: expected an unsigned integer")
    return value or None


def classify(output: OutputTensor, count: int, labels: tuple[str, ...], batched: bool) -> OutputTensor:
    dt = datatypes.from_name(output.datatype)
    if dt is None or dt.numpy is None or dt.name not in _CLASSIFIABLE:
        # Triton's words, then the output they leave unnamed.
        raise InvalidArgument(f"class result not available for output due to unsupported type "
                              f"'{output.datatype}' (output '{output.name}')")
    values = np.frombuffer(output.data, dtype=dt.numpy)
    rows = values.reshape(output.shape[0] if batched and output.shape else 1, -1)
    k = min(count, rows.shape[1])
    integer = dt.numpy.kind in "iu"
    indexes = np.arange(rows.shape[1])
    entries = []
    for row in rows:
        # Highest value first, equal values by index (np.lexsort sorts by its last key first).
        order = np.lexsort((indexes, -row.astype(np.float64)))[:k]
        for index in order:
            value = f"{int(row[index])}" if integer else f"{float(row[index]):f}"
            label = f":{labels[index]}" if index < len(labels) else ""
            entries.append(f"{value}:{index}{label}".encode())
    data = datatypes.pack_bytes(entries)
    shape = [rows.shape[0], k] if batched else [k]
    return OutputTensor(output.name, "BYTES", shape, data)
