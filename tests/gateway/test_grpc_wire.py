"""gRPC's message framing, compression, timeouts and status texts (gateway/grpc_wire.py), and
the HTTP/2 header blocks the server sends (gateway/grpc_http2.py), without a server."""

from __future__ import annotations

import gzip
import os
import zlib

import hpack
import numpy as np
import pytest

from tritium.gateway.grpc_http2 import encode_headers
from tritium.gateway.grpc_wire import (Compressed, GrpcFailure, MessageReader, compressed_frame, frame, parse_timeout,
                                      percent_encoded, response_encoding)

MESSAGES = [b"", b"x", os.urandom(100), os.urandom(70_000), os.urandom(3_000_000)]
WIRE = b"".join(frame(m) for m in MESSAGES)


@pytest.mark.parametrize("chunk, count", [(1, 4), (7, 5), (16384, 5), (len(WIRE), 5)])
def test_messages_come_out_whole_however_the_bytes_are_cut(chunk, count):
    reader = MessageReader(10**8, None)
    got = []
    end = sum(5 + len(m) for m in MESSAGES[:count])   # byte by byte: the small messages only
    for start in range(0, end, chunk):
        got += reader.feed(WIRE[start:min(start + chunk, end)])
    assert got == MESSAGES[:count] and not reader.partial


def test_a_message_over_the_limit_is_refused_from_its_prefix_alone():
    with pytest.raises(GrpcFailure) as failure:
        MessageReader(1000, None).feed(b"\0" + (5000).to_bytes(4, "big"))
    assert failure.value == GrpcFailure(8, "Received message larger than max (5000 vs. 1000)")


@pytest.mark.parametrize("encoding, compress", [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_compressed_messages_are_read_and_a_bomb_is_refused(encoding, compress):
    packed = compress(b"tritium" * 100)
    message = b"\1" + len(packed).to_bytes(4, "big") + packed
    assert MessageReader(10**6, encoding).feed(message) == [b"tritium" * 100]
    bomb = compress(b"\0" * 10**7)
    with pytest.raises(GrpcFailure) as failure:
        MessageReader(10**6, encoding).feed(b"\1" + len(bomb).to_bytes(4, "big") + bomb)
    assert failure.value.code == 8 and failure.value.message.startswith("Received message larger than max (")


def test_a_large_compressed_message_is_left_to_inflate_and_a_large_bomb_fails_there():
    """At 128 KiB compressed and more, ``feed`` leaves the work to ``inflate`` (which the gateway
    runs on a thread); smaller ones come inflated."""
    message = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    packed = gzip.compress(message)
    reader = MessageReader(10**6, b"gzip")
    small = gzip.compress(b"x" * 100)
    got = reader.feed(b"\1" + len(packed).to_bytes(4, "big") + packed + b"\1" + len(small).to_bytes(4, "big") + small)
    assert got == [Compressed(packed), b"x" * 100]
    assert reader.inflate(packed) == message
    bomb = gzip.compress(np.random.default_rng(4).integers(0, 256, 2 * 10**6, dtype=np.uint8).tobytes())
    with pytest.raises(GrpcFailure) as failure:
        reader.inflate(bomb)
    assert failure.value.code == 8 and failure.value.message.startswith("Received message larger than max (")


@pytest.mark.parametrize("encoding, decompress", [(b"gzip", gzip.decompress), (b"deflate", zlib.decompress)])
def test_compressed_responses_are_flagged_and_read_back(encoding, decompress):
    message = b"tensor bytes " * 100
    wire = compressed_frame(message, encoding)
    assert wire[0] == 1 and int.from_bytes(wire[1:5], "big") == len(wire) - 5 < len(message)
    assert decompress(wire[5:]) == message
    assert MessageReader(10**6, encoding).feed(wire) == [message]


def test_a_response_compression_would_not_shrink_goes_uncompressed():
    assert compressed_frame(b"ab", b"gzip") == frame(b"ab")


@pytest.mark.parametrize("level, accepted, chosen", [
    ("none", b"identity,deflate,gzip", None),
    ("low", b"identity,deflate,gzip", b"gzip"), ("low", b"identity, deflate", b"deflate"),
    ("medium", b"identity,deflate,gzip", b"deflate"), ("high", b"identity, deflate, gzip", b"deflate"),
    ("high", b"identity,gzip", b"gzip"), ("high", b"identity", None), ("high", None, None),
])
def test_the_response_encoding_is_the_levels_first_choice_the_client_accepts(level, accepted, chosen):
    """As Triton 2.51 answers: low prefers gzip, medium and high deflate; nothing the client lacks."""
    assert response_encoding(level, accepted) == chosen


def test_a_compressed_message_without_a_known_encoding_is_refused():
    with pytest.raises(GrpcFailure) as failure:
        MessageReader(100, b"br").feed(b"\1\0\0\0\1x")
    assert failure.value == GrpcFailure(12, "a compressed message with grpc-encoding 'br', which this server cannot read")


@pytest.mark.parametrize("value, seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"99999999u", 99.999999), (b"5n", 5e-9),
    (b"", None), (b"S", None), (b"123456789S", None), (b"1x", None), (b"-1S", None),
])
def test_grpc_timeout_values(value, seconds):
    assert parse_timeout(value) == (pytest.approx(seconds) if seconds is not None else None)


def test_grpc_message_is_percent_encoded_utf8():
    assert percent_encoded("plain text: ok") == b"plain text: ok"
    assert percent_encoded("100% sure\nnext é") == b"100%25 sure%0Anext %C3%A9"


def test_header_blocks_decode_to_what_was_encoded():
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-message", b"x" * 300)]
    assert hpack.Decoder().decode(encode_headers(headers), raw=True) == headers


def test_a_large_message_gathered_over_frames_is_handed_on_as_a_view_not_a_copy():
    message = os.urandom(300_000)
    end = 5 + len(message)
    reader = MessageReader(10**6, None)
    got = []
    for start in range(0, end, 16384):   # DATA frames of 16 KB
        got += reader.feed(frame(message)[start:min(start + 16384, end)])
    (whole,) = got
    assert isinstance(whole, memoryview) and whole == message and not reader.partial
    assert reader.feed(frame(b"next")) == [b"next"]   # the buffer starts afresh
    assert whole == message   # and the view still holds the message
