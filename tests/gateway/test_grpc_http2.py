"""The HTTP/2 connection's output: what it hands the transport, frame by frame."""

from __future__ import annotations

import struct

from tritium.gateway.grpc_http2 import DATA, END_HEADERS, END_STREAM, HEADERS, Http2Connection, _Stream


def _connection() -> Http2Connection:
    """A connection with one open stream (1) and windows and a client frame size that take anything used here."""
    h2 = Http2Connection(lambda *a: None, lambda *a: None, lambda *a: None, lambda *a: None, lambda: None)
    h2.streams[1] = _Stream(1 << 30)
    h2.send_window, h2.peer_max_frame = 1 << 30, (1 << 24) - 1
    return h2


def _head(size: int, kind: int, flags: int) -> bytes:
    return struct.pack(">IBI", size << 8 | kind, flags, 1)


def test_a_large_answer_is_handed_on_as_it_is_and_small_frames_around_it_are_joined():
    payload = bytes(range(256)) * 1000   # 256 KB: a tensor
    h2 = _connection()
    assert h2.send_whole_answer(1, b"hdrs", (b"\0" + len(payload).to_bytes(4, "big"), payload), b"trl")
    segments = h2.data_to_send()
    assert any(segment is payload for segment in segments)   # not copied
    assert len(segments) == 3   # what comes before it, it, what comes after it
    assert b"".join(segments) == (_head(4, HEADERS, END_HEADERS) + b"hdrs" + _head(len(payload) + 5, DATA, 0)
                                  + b"\0" + len(payload).to_bytes(4, "big") + payload
                                  + _head(3, HEADERS, END_HEADERS | END_STREAM) + b"trl")


def test_small_frames_are_handed_on_as_one_piece():
    h2 = _connection()
    assert h2.send_whole_answer(1, b"hdrs", (b"\0\0\0\0\2", b"ok"), b"trl")
    h2.send_data(1, b"more")
    (segment,) = h2.data_to_send()
    assert segment == (_head(4, HEADERS, END_HEADERS) + b"hdrs" + _head(7, DATA, 0) + b"\0\0\0\0\2ok"
                       + _head(3, HEADERS, END_HEADERS | END_STREAM) + b"trl" + _head(4, DATA, 0) + b"more")


def test_a_large_data_frame_is_handed_on_as_it_is():
    data = memoryview(bytes(100_000))
    h2 = _connection()
    h2.send_data(1, data)
    segments = h2.data_to_send()
    assert segments[-1] is data and b"".join(segments) == _head(len(data), DATA, 0) + data
