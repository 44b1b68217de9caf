"""The wire protocol's records and the error hierarchy's mapping (reference 2.14)."""

from __future__ import annotations

import struct

import msgpack
import pytest

from tritium.exit_codes import ExitCode
from tritium.errors import (
    AlreadyExists, Cancelled, ErrorCode, InternalError, InvalidArgument, NotFound, ProtocolError,
    TritiumError, Unavailable, Unsupported, error_for_code,
)
from tritium.protocol import INLINE_LIMIT, Kind, decode, encode, error_record, pack_tensors, tensor_views


class Frame:
    """A stand-in for a zmq.Frame: the bytes are behind ``.buffer``."""

    def __init__(self, data) -> None:
        self.buffer = memoryview(data)


# -- records ---------------------------------------------------------------------------------

def test_encode_decode_round_trip():
    header = {"k": Kind.INFER, "rid": 7, "m": "model", "v": 3, "bs": 2, "id": "req-1",
              "inputs": [["A", "FP32", [2, 4], 32, False]], "outputs": None,
              "params": {"s": "x", "i": -5, "f": 0.25, "b": True}}
    record = encode(header)
    decoded, view, offset = decode(record)
    assert decoded == header
    assert decoded["k"] == Kind.INFER
    assert isinstance(view, memoryview)
    assert offset == len(record)
    assert bytes(view) == record


def test_record_layout_is_length_prefix_header_then_inline_bytes():
    header = {"k": Kind.RESPONSE, "rid": 1}
    record = encode(header, [b"abc", memoryview(b"de")])
    (length,) = struct.unpack_from("<I", record, 0)
    assert msgpack.unpackb(record[4:4 + length]) == {"k": int(Kind.RESPONSE), "rid": 1}
    assert record[4 + length:] == b"abcde"
    decoded, view, offset = decode(record)
    assert offset == 4 + length
    assert bytes(view[offset:]) == b"abcde"


def test_decode_reads_zmq_like_frames_without_copying():
    data = bytearray(encode({"k": Kind.HEARTBEAT}, [b"xyz"]))
    header, view, offset = decode(Frame(data))
    assert header == {"k": Kind.HEARTBEAT}
    assert view.obj is data
    decode(memoryview(data))  # a plain memoryview is fine too


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_round_trips(kind):
    header, _, _ = decode(encode({"k": kind}))
    assert header["k"] == kind


def test_byte_strings_and_nested_values_survive():
    header = {"k": Kind.CONTROL, "op": "stats", "blob": b"\x00\xff", "nested": {"a": [1, {"b": None}]},
              "map": {1: "int keys are allowed"}}
    assert decode(encode(header))[0] == header


@pytest.mark.parametrize("raw", [
    b"",
    b"\x01\x00",                                        # shorter than the length prefix
    struct.pack("<I", 100) + b"\x81",                   # header overruns the frame
    struct.pack("<I", 1) + b"\xc1",                     # 0xc1 is never valid msgpack
    struct.pack("<I", 3) + b"\xa3ab",                   # truncated msgpack string
])
def test_undecodable_bytes_raise_protocol_error(raw):
    with pytest.raises(ProtocolError):
        decode(raw)


@pytest.mark.parametrize("header", [
    [1, 2, 3],                    # not a map
    "k",
    {"rid": 1},                   # no kind
    {"k": 999},                   # unknown kind
    {"k": "INFER"},               # kind by name is not a kind
    {"k": None},
])
def test_records_without_a_known_kind_raise_protocol_error(header):
    packed = msgpack.packb(header)
    with pytest.raises(ProtocolError):
        decode(struct.pack("<I", len(packed)) + packed)


def test_protocol_error_is_an_internal_error():
    assert issubclass(ProtocolError, InternalError)
    assert ProtocolError("x").code == ErrorCode.INTERNAL


def test_error_record():
    error = NotFound("Request for unknown model: 'm' is not found")
    header, _, offset = decode(error_record(42, error))
    assert header == {"k": Kind.RESPONSE, "rid": 42,
                      "err": {"code": int(ErrorCode.NOT_FOUND),
                              "message": "Request for unknown model: 'm' is not found"}}
    rebuilt = TritiumError.from_wire(header["err"])
    assert isinstance(rebuilt, NotFound)
    assert rebuilt.message == error.message


# -- tensors inline and external ---------------------------------------------------------------

def test_pack_tensors_puts_small_buffers_inline_and_large_ones_external():
    small, edge, large = b"a" * 10, b"b" * (INLINE_LIMIT - 1), bytearray(INLINE_LIMIT)
    descriptors, inline, external = pack_tensors([("S", "UINT8", [10], small), ("L", "UINT8", [INLINE_LIMIT], large),
                                                  ("E", "UINT8", [INLINE_LIMIT - 1], edge), ("Z", "UINT8", [0], b"")])
    assert descriptors == [["S", "UINT8", [10], 10, False], ["L", "UINT8", [INLINE_LIMIT], INLINE_LIMIT, True],
                           ["E", "UINT8", [INLINE_LIMIT - 1], INLINE_LIMIT - 1, False], ["Z", "UINT8", [0], 0, False]]
    assert inline == [small, edge, b""]
    assert len(external) == 1 and external[0] is large


def test_tensor_views_read_inline_and_external_tensors_in_descriptor_order():
    a, b, c = b"\x01" * 8, bytearray(b"\x02" * 16), b"\x03" * 4
    descriptors = [["A", "FP32", [2], len(a), False], ["B", "FP32", [4], len(b), True],
                   ["C", "INT32", [1], len(c), False]]
    record = encode({"k": Kind.INFER, "rid": 1, "inputs": descriptors, "x": 1}, [a, c])
    header, view, offset = decode(record)
    views = tensor_views(header["inputs"], view, offset, [Frame(b)])
    assert [bytes(v) for v in views] == [a, bytes(b), c]
    assert all(isinstance(v, memoryview) for v in views)
    assert views[1].obj is b                      # the external frame, not a copy
    assert views[0].obj is view.obj               # a slice of the record, not a copy


def test_tensor_views_missing_external_frame_or_overrun_raise_protocol_error():
    descriptors = [["A", "FP32", [1], 4, True]]
    record = encode({"k": Kind.INFER, "inputs": descriptors})
    header, view, offset = decode(record)
    with pytest.raises(ProtocolError):
        tensor_views(header["inputs"], view, offset, [])
    descriptors = [["A", "FP32", [2], 8, False]]
    header, view, offset = decode(encode({"k": Kind.INFER, "inputs": descriptors}, [b"\x00" * 4]))
    with pytest.raises(ProtocolError):
        tensor_views(header["inputs"], view, offset, [])


def test_exit_codes_are_distinct():
    codes = [int(c) for c in ExitCode]
    assert len(codes) == len(set(codes))
    assert ExitCode.OK == 0


# -- errors ----------------------------------------------------------------------------------

# reference 2.14: Triton code -> HTTP status, gRPC code
TABLE = {
    ErrorCode.INTERNAL: (500, "INTERNAL"),
    ErrorCode.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorCode.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorCode.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorCode.INVALID_ARG: (400, "INVALID_ARGUMENT"),
    ErrorCode.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    ErrorCode.CANCELLED: (400, "CANCELLED"),
    ErrorCode.UNKNOWN: (400, "UNKNOWN"),
}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_code_maps_to_http_status_and_grpc_code(code):
    assert (code.http_status, code.grpc_code_name) == TABLE[code]


def test_every_error_code_is_in_the_table():
    assert set(ErrorCode) == set(TABLE)


def test_grpc_code_names_are_real_grpc_status_codes():
    grpc = pytest.importorskip("grpc")
    for code in ErrorCode:
        assert hasattr(grpc.StatusCode, code.grpc_code_name)


@pytest.mark.parametrize("cls,code", [
    (InvalidArgument, ErrorCode.INVALID_ARG), (NotFound, ErrorCode.NOT_FOUND),
    (Unavailable, ErrorCode.UNAVAILABLE), (Unsupported, ErrorCode.UNSUPPORTED),
    (InternalError, ErrorCode.INTERNAL), (AlreadyExists, ErrorCode.ALREADY_EXISTS),
    (Cancelled, ErrorCode.CANCELLED), (TritiumError, ErrorCode.UNKNOWN),
])
def test_to_wire_from_wire_round_trip(cls, code):
    error = cls("something 'x' went wrong")
    assert error.code == code
    wire = error.to_wire()
    assert wire == {"code": int(code), "message": "something 'x' went wrong"}
    # It crosses a process boundary inside a msgpack record.
    header, _, _ = decode(encode({"k": Kind.RESPONSE, "rid": 1, "err": wire}))
    rebuilt = TritiumError.from_wire(header["err"])
    assert type(rebuilt) is cls
    assert rebuilt.code == code
    assert rebuilt.message == error.message
    assert str(rebuilt) == error.message


def test_from_wire_with_an_unknown_or_missing_code_is_internal():
    assert isinstance(TritiumError.from_wire({"code": 99, "message": "m"}), InternalError)
    missing = TritiumError.from_wire({"message": "m"})
    assert isinstance(missing, InternalError) and missing.message == "m"
    assert TritiumError.from_wire({}).message == ""


def test_error_for_code():
    assert isinstance(error_for_code(ErrorCode.UNAVAILABLE, "busy"), Unavailable)
    assert error_for_code(ErrorCode.UNKNOWN, "?").code == ErrorCode.UNKNOWN


def test_repr_names_the_class_and_message():
    assert repr(NotFound("no")) == "NotFound('no')"
