"""Tensor frames <-> numpy arrays in the instance process: zero-copy views and Triton's BYTES framing."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from tritium.protocol import INLINE_LIMIT
from tritium.workers.tensors import array_to_frame, deserialize_bytes, frame_to_array, serialize_bytes, writable_rows
from tritium.errors import InvalidArgument


def serialized(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


# -- frame_to_array --------------------------------------------------------------------------

@pytest.mark.parametrize("datatype,dtype", [
    ("BOOL", "?"), ("UINT8", "u1"), ("UINT16", "<u2"), ("UINT32", "<u4"), ("UINT64", "<u8"),
    ("INT8", "i1"), ("INT16", "<i2"), ("INT32", "<i4"), ("INT64", "<i8"),
    ("FP16", "<f2"), ("FP32", "<f4"), ("FP64", "<f8"),
])
def test_frame_to_array_views_the_frame_in_place(datatype, dtype):
    expected = (np.arange(6) % 2 == 0) if datatype == "BOOL" else np.arange(6).astype(dtype)
    frame = bytearray(expected.astype(dtype).tobytes())
    array = frame_to_array(frame, datatype, [2, 3], "x")
    assert array.shape == (2, 3)
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, expected.reshape(2, 3))
    # Zero copy: the array is a view of the frame's memory.
    assert np.shares_memory(array, np.frombuffer(frame, dtype=np.uint8))
    assert array.base is not None
    # ... so a change to the frame shows through the array.
    frame[0] = 0 if datatype == "BOOL" else 1
    assert array[0, 0] != expected.reshape(-1)[0]


def test_frame_to_array_from_a_memoryview_and_bytes():
    raw = np.array([1.5, -2.0], dtype="<f4").tobytes()
    view = memoryview(raw)
    array = frame_to_array(view, "FP32", [2], "x")
    assert array.tolist() == [1.5, -2.0]
    assert np.shares_memory(array, np.frombuffer(raw, dtype=np.uint8))
    # A view of immutable bytes is read-only: a model cannot scribble on the request.
    assert not array.flags.writeable


def test_frame_to_array_bf16():
    values = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    array = frame_to_array(values.tobytes(), "BF16", [2], "x")
    assert array.dtype == np.dtype(ml_dtypes.bfloat16)
    assert array.astype(np.float32).tolist() == [1.0, -2.5]


def test_frame_to_array_scalar_and_empty_shapes():
    assert frame_to_array(struct.pack("<i", 7), "INT32", [], "x").shape == ()
    empty = frame_to_array(b"", "FP32", [0, 4], "x")
    assert empty.shape == (0, 4)


def test_frame_to_array_element_count_must_fit_the_shape():
    with pytest.raises(InvalidArgument) as info:
        frame_to_array(np.zeros(2, "<f4").tobytes(), "FP32", [3], "x")
    assert "'x'" in info.value.message


def test_frame_to_array_unknown_datatype():
    with pytest.raises(InvalidArgument) as info:
        frame_to_array(b"\x00" * 4, "FLOAT", [1], "x")
    assert "'x'" in info.value.message and "FLOAT" in info.value.message


def test_frame_to_array_with_a_partial_element_is_invalid_argument():
    with pytest.raises(InvalidArgument):
        frame_to_array(b"\x00" * 5, "FP32", [1], "x")


# -- BYTES -----------------------------------------------------------------------------------

def test_bytes_round_trip_with_empty_and_non_utf8_elements():
    items = [b"", b"hello", b"\xff\xfe\x00", "é".encode(), b""]
    frame = serialized(*items)
    array = frame_to_array(frame, "BYTES", [5], "s")
    assert array.dtype == np.object_
    assert array.tolist() == items
    assert all(type(item) is bytes for item in array.tolist())
    assert serialize_bytes(array) == frame


def test_bytes_reshape_and_round_trip_2d():
    items = [b"a", b"bb", b"", b"dddd", b"\x00", b"f"]
    array = deserialize_bytes(serialized(*items), [2, 3], "s")
    assert array.shape == (2, 3)
    assert array[1, 0] == b"dddd"
    assert serialize_bytes(array) == serialized(*items)


def test_empty_bytes_tensor():
    array = deserialize_bytes(b"", [0], "s")
    assert array.shape == (0,)
    assert serialize_bytes(array) == b""


@pytest.mark.parametrize("frame", [
    b"\x01\x00",                               # length prefix cut short
    struct.pack("<I", 5) + b"abc",             # element overruns the data
    serialized(b"ok") + b"\x03\x00\x00",       # second prefix cut short
    serialized(b"ok") + struct.pack("<I", 1),  # second element missing
])
def test_malformed_bytes_framing(frame):
    with pytest.raises(InvalidArgument) as info:
        deserialize_bytes(frame, [-1], "s")
    assert "'s'" in info.value.message


def test_bytes_element_count_must_fit_the_shape():
    with pytest.raises(InvalidArgument) as info:
        deserialize_bytes(serialized(b"a", b"b"), [3], "s")
    assert "'s'" in info.value.message


def test_serialize_bytes_accepts_str_and_other_objects():
    array = np.array(["é", b"\xff", 12, bytearray(b"ba")], dtype=object)
    assert serialize_bytes(array) == serialized("é".encode(), b"\xff", b"12", b"ba")


# -- array_to_frame --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,datatype", [
    (np.bool_, "BOOL"), (np.uint8, "UINT8"), (np.uint16, "UINT16"), (np.uint32, "UINT32"),
    (np.uint64, "UINT64"), (np.int8, "INT8"), (np.int16, "INT16"), (np.int32, "INT32"),
    (np.int64, "INT64"), (np.float16, "FP16"), (np.float32, "FP32"), (np.float64, "FP64"),
])
def test_array_to_frame_for_every_fixed_size_dtype(dtype, datatype):
    array = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    name, shape, frame = array_to_frame(array, "o")
    assert name == datatype
    assert shape == [3, 4]
    assert bytes(frame) == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()


def test_array_to_frame_shares_memory_only_of_arrays_too_large_to_go_inline():
    large = np.arange(INLINE_LIMIT // 4, dtype=np.float32)
    _, _, frame = array_to_frame(large, "o")
    assert np.shares_memory(np.frombuffer(frame, dtype=np.uint8), large)   # sent without a copy
    small = np.arange(8, dtype=np.float32)
    _, _, frame = array_to_frame(small, "o")
    small[0] = 5   # an inline frame is a copy: later changes to the array do not reach it
    assert np.frombuffer(frame, dtype=np.float32)[0] == 0


@pytest.mark.parametrize("length", [8, INLINE_LIMIT // 4])
def test_array_to_frame_of_a_strided_array_is_in_c_order(length):
    array = np.arange(length * 2, dtype=np.float32).reshape(2, length).T
    _, shape, frame = array_to_frame(array, "o")
    assert shape == [length, 2]
    assert bytes(frame) == np.ascontiguousarray(array).tobytes()


def test_writable_rows_cut_one_writable_copy_by_first_dimension():
    buffers = [np.arange(n * 3, dtype=np.int32).tobytes() for n in (1, 2)]
    views = [memoryview(b).toreadonly() for b in buffers]
    first, second = writable_rows(views, "INT32", [[1, 3], [2, 3]], "x")
    assert first.tolist() == [[0, 1, 2]] and second.tolist() == [[0, 1, 2], [3, 4, 5]]
    first[0, 0] = 9   # writable, and only its own rows
    assert first[0, 0] == 9 and second[0, 0] == 0
    assert bytes(buffers[0])[:4] == b"\0\0\0\0"   # the received bytes are untouched


def test_writable_rows_use_writable_buffers_in_place():
    """A large tensor arrives in a bytearray of its own: its rows are that memory, not a copy."""
    buffers = [bytearray(np.arange(n * 3, dtype=np.int32).tobytes()) for n in (1, 2)]
    first, second = writable_rows([memoryview(b) for b in buffers], "INT32", [[1, 3], [2, 3]], "x")
    assert first.tolist() == [[0, 1, 2]] and second.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert np.shares_memory(first, buffers[0]) and np.shares_memory(second, buffers[1])
    second[1, 2] = 9
    assert second[1, 2] == 9 and first.tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError):   # the caller then checks each request alone
        writable_rows([memoryview(bytearray(10))], "INT32", [[1, 3]], "x")


def test_array_to_frame_bf16():
    array = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    name, shape, frame = array_to_frame(array, "o")
    assert (name, shape) == ("BF16", [2])
    assert bytes(frame) == array.tobytes()


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">u2", ">f2"])
def test_array_to_frame_writes_big_endian_arrays_little_endian(dtype):
    array = np.array([1, 2, 300], dtype=dtype)
    name, shape, frame = array_to_frame(array, "o")
    little = np.dtype(dtype).newbyteorder("<")
    assert bytes(frame) == array.astype(little).tobytes()
    assert np.frombuffer(frame, dtype=little).tolist() == [1, 2, 300]
    assert shape == [3]


def test_array_to_frame_makes_non_contiguous_arrays_row_major():
    base = np.arange(12, dtype="<i4").reshape(3, 4)
    transposed = base.T
    name, shape, frame = array_to_frame(transposed, "o")
    assert shape == [4, 3]
    assert np.frombuffer(frame, dtype="<i4").tolist() == transposed.reshape(-1).tolist()
    strided = base[:, ::2]
    name, shape, frame = array_to_frame(strided, "o")
    assert shape == [3, 2]
    assert np.frombuffer(frame, dtype="<i4").tolist() == [0, 2, 4, 6, 8, 10]
    fortran = np.asfortranarray(base)
    assert bytes(array_to_frame(fortran, "o")[2]) == base.tobytes()


def test_array_to_frame_big_endian_and_non_contiguous_together():
    array = np.arange(6, dtype=">f4").reshape(2, 3).T
    _, shape, frame = array_to_frame(array, "o")
    assert shape == [3, 2]
    assert np.frombuffer(frame, dtype="<f4").tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


def test_array_to_frame_empty_and_scalar():
    assert array_to_frame(np.zeros((0, 3), np.float32), "o") == ("FP32", [0, 3], b"")
    name, shape, frame = array_to_frame(np.array(2.5, dtype=np.float64), "o")
    assert (name, shape, bytes(frame)) == ("FP64", [], struct.pack("<d", 2.5))


@pytest.mark.parametrize("array", [
    np.array([b"a", b"", b"\xff"], dtype=object),
    np.array(["a", "", "é"]),
    np.array([b"a", b"", b"zz"], dtype="S2"),
])
def test_array_to_frame_bytes(array):
    name, shape, frame = array_to_frame(array, "o")
    assert (name, shape) == ("BYTES", [3])
    expected = [i.encode() if isinstance(i, str) else bytes(i) for i in array.tolist()]
    assert frame == serialized(*expected)
    assert deserialize_bytes(frame, shape, "o").tolist() == expected


def test_array_to_frame_refuses_dtypes_without_a_triton_datatype():
    with pytest.raises(InvalidArgument) as info:
        array_to_frame(np.zeros(2, dtype=np.complex64), "o")
    assert "'o'" in info.value.message
