"""Tensors in Triton's trace file: each datatype's values as Triton 2.51 wrote them for the same
tensors (checked side by side), and the two deliberate differences that keep the file JSON."""

from __future__ import annotations

import numpy as np
import pytest

from tritium.datatypes import pack_bytes
from tritium.tracing.tensors import tensor_record


@pytest.mark.parametrize("datatype, array, data", [
    ("FP32", np.array([0.5, 1 / 3, 1e-7, 123456789, -2.5, np.nan, np.inf, 100, 1e20], np.float32),
     "0.5,0.333333,1e-07,1.23457e+08,-2.5,nan,inf,100,1e+20"),
    ("FP64", np.array([0.1, 1 / 3, 1e-300, 2 ** 53]), "0.1,0.333333,1e-300,9.0072e+15"),
    ("INT64", np.array([-2 ** 63, 2 ** 63 - 1], np.int64), "-9223372036854775808,9223372036854775807"),
    ("BOOL", np.array([True, False]), "1,0"),
    ("FP16", np.array([0.1, 65504], np.float16), ""),   # Triton writes no values for FP16
    ("BF16", np.array([16256, 16384], np.uint16), ""),  # nor for BF16 (here its bits: 1.0 and 2.0)
    ("INT8", np.array([-128, 127], np.int8), "-128,127"),   # Triton: the raw characters (not JSON)
    ("UINT8", np.array([255, 0], np.uint8), "255,0"),
])
def test_values_are_written_as_triton_writes_them(datatype, array, data):
    assert tensor_record("T", datatype, list(array.shape), array.tobytes()) == {
        "name": "T", "data": data, "shape": ",".join(map(str, array.shape)), "dtype": datatype}


def test_bytes_elements_are_quoted_and_a_shape_is_comma_separated():
    record = tensor_record("S", "BYTES", [2, 2], pack_bytes([b"ab,c", "\u00e9".encode(), b"", b"\xff"]))
    # Triton writes the raw bytes; bytes that are not UTF-8 are replaced here, so that the file stays JSON.
    assert record == {"name": "S", "data": '"ab,c","\u00e9","","\ufffd"', "shape": "2,2", "dtype": "BYTES"}
