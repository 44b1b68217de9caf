"""The HTTP/2 connection's output: what it hands the transport, frame by frame."""

from __future__ import annotations

import struct
import time

import hpack
import pytest

from tritium.gateway.grpc_http2 import (ACK, DATA, DEFAULT_WINDOW, END_HEADERS, END_STREAM, FLOW_CONTROL_ERROR,
                                        FRAME_SIZE_ERROR, HEADER_TABLE_SIZE, HEADERS, MAX_CONCURRENT_STREAMS, MAX_WINDOW,
                                        PREFACE, PROTOCOL_ERROR, REFUSED_STREAM, RST_STREAM, SETTINGS, STREAM_CLOSED,
                                        WINDOW_UPDATE, ConnectionFailure, Http2Connection, _Stream, frame,
                                        COMPRESSION_ERROR, CONTINUATION, MAX_HEADER_LIST)


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


# -- receiving: large DATA frames handed on as they arrive ------------------------------------

def _receiving(window: int = 1 << 24) -> tuple[Http2Connection, list]:
    """A connection past its preface with stream 1 open; what ``on_data`` is given, in order."""
    got: list = []
    h2 = Http2Connection(lambda *a: None, lambda stream, data, end: got.append((stream, bytes(data), end)),
                         lambda *a: None, lambda *a: None, lambda: None, window=window, max_frame=1 << 20)
    h2._preface = True
    h2.streams[1] = _Stream(65535)
    h2.last_stream_id = 1
    return h2, got


def _in_reads(h2: Http2Connection, wire: bytes, sizes) -> None:
    position = 0
    for size in sizes:
        h2.receive(wire[position:position + size])
        position += size
    h2.receive(wire[position:])


def test_a_large_data_frame_is_handed_on_in_pieces_as_its_reads_arrive():
    payload = bytes(range(250)) * 1200     # 300 KB
    small = b"after"
    wire = _head(len(payload), DATA, 0) + payload + _head(len(small), DATA, END_STREAM) + small
    h2, got = _receiving()
    _in_reads(h2, wire, [5, 60_000, 100_000, 150_000])   # the header split, the frame's end in a read with the next frame
    assert [len(data) for _, data, _ in got] == [59_996, 100_000, 140_004, 5]   # three pieces, then the small frame
    assert b"".join(data for _, data, _ in got[:3]) == payload and got[3] == (1, small, True)
    assert [end for _, _, end in got] == [False, False, False, True]


def test_a_large_frame_ending_the_stream_ends_it_with_its_last_piece():
    payload = bytes(200_000)
    h2, got = _receiving()
    _in_reads(h2, _head(len(payload), DATA, END_STREAM) + payload, [70_000])
    assert [(len(data), end) for _, data, end in got] == [(69_991, False), (130_009, True)]
    assert h2.streams.get(1) is None or h2.streams[1].remote_closed


def test_the_pieces_of_a_large_frame_count_against_the_windows_as_the_frame_would():
    payload = bytes(300_000)
    h2, got = _receiving(window=200_000)
    _in_reads(h2, _head(len(payload), DATA, 0) + payload, [100_009, 100_000])
    updates = h2.data_to_send()
    wire = b"".join(bytes(segment) for segment in updates)
    increments = [struct.unpack(">I", wire[position + 9:position + 13])[0]
                  for position in range(0, len(wire), 13)]   # WINDOW_UPDATE frames only: 9 + 4 bytes each
    assert sum(len(data) for _, data, _ in got) == len(payload)
    assert sum(increments) == 2 * 200_000   # past half the window twice: the connection's and the stream's, each once


def _window_updates(h2: Http2Connection) -> list[tuple[int, int]]:
    """The (stream, increment) of each WINDOW_UPDATE the connection has to send."""
    wire = b"".join(bytes(segment) for segment in h2.data_to_send())
    updates, position = [], 0
    while position < len(wire):
        length_kind, _, stream_id = struct.unpack_from(">IBI", wire, position)
        if length_kind & 0xFF == WINDOW_UPDATE:
            updates.append((stream_id, struct.unpack_from(">I", wire, position + 9)[0]))
        position += 9 + (length_kind >> 8)
    return updates


def test_a_withheld_connection_window_is_handed_back_when_withholding_ends():
    h2, got = _receiving(window=200_000)
    h2.withhold(True)
    for _ in range(3):
        h2.receive(_head(50_000, DATA, 0) + bytes(50_000))
    assert sum(len(data) for _, data, _ in got) == 150_000
    assert _window_updates(h2) == [(1, 150_000)]   # the stream's, not the connection's
    h2.withhold(False)
    assert _window_updates(h2) == [(0, 150_000)]


def test_data_past_the_connection_window_ends_the_connection():
    h2, _ = _receiving(window=200_000)
    h2.withhold(True)
    for _ in range(4):
        h2.receive(_head(50_000, DATA, 0) + bytes(50_000))
    with pytest.raises(ConnectionFailure) as failure:
        h2.receive(_head(1, DATA, 0) + b"x")
    assert failure.value.code == FLOW_CONTROL_ERROR


def test_a_cached_header_block_is_not_reused_once_the_table_means_something_else():
    """P fills the table, Q (index 63) is cached; R rebuilds the table to the same size with an
    equal first entry: Q must now be decoded afresh, as hpack decodes it."""
    def literal(name: bytes, value: bytes) -> bytes:   # literal with incremental indexing, new name
        return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value

    p, q = literal(b"x-a", b"1") + literal(b"x-b", b"2"), b"\xbf"
    r = b"\x20\x3f\xe1\x1f" + literal(b"x-c", b"3") + literal(b"x-b", b"2")   # size 0, back to 4096, two entries
    h2, reference = Http2Connection(*(lambda *a: None,) * 5), hpack.Decoder()
    for block in (p, q, r, q):
        assert h2._decode(block) == reference.decode(block, raw=True)


# -- how many streams a client may open ------------------------------------------------------

def _frames(wire: bytes) -> list[tuple[int, int, int, bytes]]:
    frames, position = [], 0
    while position < len(wire):
        length_kind, flags, stream_id = struct.unpack_from(">IBI", wire, position)
        payload = wire[position + 9:position + 9 + (length_kind >> 8)]
        frames.append((length_kind & 0xFF, flags, stream_id, payload))
        position += 9 + len(payload)
    return frames


def test_streams_past_the_advertised_limit_are_refused_and_a_closed_one_makes_room():
    opened: list[tuple[int, list]] = []
    h2 = Http2Connection(lambda stream, headers, end: opened.append((stream, headers)), *(lambda *a: None,) * 4)
    h2.max_streams = 2
    h2.start()
    settings = _frames(b"".join(h2.data_to_send()))[0]
    assert settings[0] == SETTINGS and struct.unpack(">HI", settings[3][:6]) == (MAX_CONCURRENT_STREAMS, 2)
    encoder = hpack.Encoder()
    blocks = {stream: encoder.encode([(":method", "POST"), (":path", "/p"), (f"x-{stream}", str(stream))])
              for stream in (1, 3, 5)}   # each adds its own header to the table
    h2.receive(PREFACE + b"".join(struct.pack(">IBI", len(block) << 8 | HEADERS, END_HEADERS, stream) + block
                                  for stream, block in blocks.items()))
    assert [stream for stream, _ in opened] == [1, 3]
    assert _frames(b"".join(h2.data_to_send())) == [(RST_STREAM, 0, 5, struct.pack(">I", REFUSED_STREAM))]
    h2.reset(1, REFUSED_STREAM)   # stream 1 ends: room for one more
    # index 62, the table's newest entry: the refused stream's header, which was decoded all the same
    h2.receive(struct.pack(">IBI", 1 << 8 | HEADERS, END_HEADERS, 7) + b"\xbe")
    assert opened[-1] == (7, [(b"x-5", b"5")]) and sorted(h2.streams) == [3, 7]


# -- the client's HPACK table size, and frames a client may not send ---------------------------

def _client(**calls) -> tuple[Http2Connection, dict[str, list]]:
    """A connection past its preface; every callback's calls, by name."""
    seen: dict[str, list] = {name: [] for name in ("headers", "data", "reset")}
    h2 = Http2Connection(lambda *a: seen["headers"].append(a), lambda *a: seen["data"].append(a),
                         lambda *a: seen["reset"].append(a), lambda *a: None, lambda: None)
    h2.receive(PREFACE)
    return h2, seen


def _sent(h2: Http2Connection) -> list[tuple[int, int, int, bytes]]:
    return _frames(b"".join(h2.data_to_send()))


def _headers_frame(stream: int, block: bytes, flags: int = END_HEADERS) -> bytes:
    return struct.pack(">IBI", len(block) << 8 | HEADERS, flags, stream) + block


REQUEST = hpack.Encoder().encode([(":method", "POST"), (":path", "/p")])   # only static indexes


def test_a_smaller_table_asked_by_the_client_is_signalled_at_the_start_of_our_next_header_block():
    """RFC 7541 4.2: a decoder told to keep a smaller table (nghttp2's, at its client's word)
    takes our next block only if it starts with a size update; one block, not every block."""
    h2, _ = _client()
    h2.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", HEADER_TABLE_SIZE, 0)))
    assert _sent(h2) == [(SETTINGS, ACK, 0, b"")]
    h2.receive(_headers_frame(1, REQUEST) + _headers_frame(3, REQUEST))
    h2.send_headers(1, b"\x88", end_stream=True)
    assert h2.send_whole_answer(3, b"\x88", (b"m",), b"\x00")
    first, second = _frames(b"".join(h2.data_to_send()))[:2]
    assert first[3] == b"\x20\x88" and second[3] == b"\x88"
    decoder = hpack.Decoder()
    decoder.header_table_size = 0   # as the client's decoder after its SETTINGS
    assert decoder.decode(first[3], raw=True) == [(b":status", b"200")]
    h2.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", HEADER_TABLE_SIZE, 100)) + _headers_frame(5, REQUEST))
    assert h2.send_whole_answer(5, b"\x88", (b"m",), b"\x00")
    ack, headers, data, trailers = _sent(h2)
    assert ack[0] == SETTINGS and (headers[0], headers[3], trailers[3]) == (HEADERS, b"\x20\x88", b"\x00")


def test_a_block_that_sets_the_table_size_is_decoded_each_time_it_comes():
    """A cached block answered without the decoder would leave the decoder's table at the size
    the block had set before: the entries the client then adds and uses would not fit."""
    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value

    big, small = b"\x3f\xe1\x1f" + b"\x82", b"\x3f\x45" + b"\x82"   # size 4096, size 100: each then :method GET
    fill = literal(b"x-" + b"a" * 78, b"1") + literal(b"x-" + b"b" * 78, b"2")   # two entries of 113
    h2, reference = Http2Connection(*(lambda *a: None,) * 5), hpack.Decoder()
    for block in (big, small, big, fill, b"\xbf"):   # then index 63: the older of the two
        assert h2._decode(block) == reference.decode(block, raw=True)


def test_frames_a_client_may_not_send_end_the_connection_or_the_stream_as_rfc_9113_says():
    h2, seen = _client()
    h2.receive(_headers_frame(5, REQUEST))
    for wire, code in ((_headers_frame(3, REQUEST), PROTOCOL_ERROR),   # a stream below one opened
                       (frame(RST_STREAM, 0, 9, b"\0\0\0\0"), PROTOCOL_ERROR),   # never opened
                       (frame(WINDOW_UPDATE, 0, 9, b"\0\0\0\1"), PROTOCOL_ERROR),
                       (frame(RST_STREAM, 0, 5, b"\0\0\0\0\0"), FRAME_SIZE_ERROR)):
        with pytest.raises(ConnectionFailure) as failure:
            h2.receive(wire)
        assert failure.value.code == code
        h2, seen = _client()
        h2.receive(_headers_frame(5, REQUEST))
    h2.receive(frame(WINDOW_UPDATE, 0, 5, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW - 5)))   # 5 short of the most
    with pytest.raises(ConnectionFailure) as failure:   # a larger initial window pushes it past 2^31-1
        h2.receive(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, DEFAULT_WINDOW + 10)))
    assert failure.value.code == FLOW_CONTROL_ERROR


@pytest.mark.parametrize("after", ["data", "headers"])
def test_a_frame_after_the_client_ended_its_side_ends_the_stream_not_its_answer(after):
    """RFC 9113 5.1: STREAM_CLOSED for that stream; its call is reset (not ended a second time,
    which would make its answer an error), and the connection goes on."""
    h2, seen = _client()
    h2.receive(_headers_frame(1, REQUEST) + frame(DATA, END_STREAM, 1, b"x"))
    assert seen["data"] == [(1, b"x", True)]
    h2.receive(frame(DATA, END_STREAM, 1, b"y") if after == "data"
               else _headers_frame(1, REQUEST, END_HEADERS | END_STREAM))
    assert seen["data"] == [(1, b"x", True)] and seen["reset"] == [(1,)]
    assert _sent(h2) == [(RST_STREAM, 0, 1, struct.pack(">I", STREAM_CLOSED))]
    h2.receive(_headers_frame(3, REQUEST))
    assert [call[0] for call in seen["headers"]] == [1, 3]


def test_a_header_block_past_what_a_connection_may_decode_ends_it_quickly():
    """One-byte indexed headers decode to 42 bytes each: a block of hundreds of thousands would hold
    the event loop for seconds; the decoder stops at MAX_HEADER_LIST and the connection ends."""
    h2, _ = _client()
    block = b"\x82" * (4 * MAX_HEADER_LIST // 42)   # four times past it
    pieces = [block[start:start + 16384] for start in range(0, len(block), 16384)]
    started = time.monotonic()
    with pytest.raises(ConnectionFailure) as failure:
        h2.receive(_headers_frame(1, pieces[0], 0) + b"".join(
            frame(CONTINUATION, END_HEADERS if index == len(pieces) - 1 else 0, 1, piece)
            for index, piece in enumerate(pieces) if index))
    assert failure.value.code == COMPRESSION_ERROR
    assert time.monotonic() - started < 1.0


def test_a_block_of_more_than_two_table_size_updates_ends_the_connection_at_once():
    """RFC 7541 4.2 allows two; a block of a million would take the decoder seconds, and counts
    for nothing against the header list's bound."""
    h2, _ = _client()
    h2.receive(_headers_frame(1, b"\x3f\xe1\x1f\x20" + REQUEST))   # two: 4096, then 0
    updates = b"\x20" * 16000
    started = time.monotonic()
    with pytest.raises(ConnectionFailure) as failure:
        h2.receive(_headers_frame(3, updates + REQUEST))
    assert failure.value.code == COMPRESSION_ERROR and time.monotonic() - started < 0.1
