"""gRPC's rules over HTTP/2, without the HTTP/2: length-prefixed messages, their compression,
``grpc-timeout``, status codes and the percent-encoded ``grpc-message``.

Texts a client may match on are grpc-core's (``Received message larger than max (N vs. M)``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import grpc

from tritium.gateway.compression import OFF_LOOP_BYTES, WBITS, compress

# Status numbers by name, as grpc.StatusCode holds them (OK=0 ... UNAUTHENTICATED=16).
STATUS = {code.name: code.value[0] for code in grpc.StatusCode}
OK = STATUS["OK"]
INTERNAL = STATUS["INTERNAL"]

_PREFIX = 5   # compressed flag (1 byte) + big-endian length (4 bytes)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
ACCEPTED_ENCODINGS = b"identity,deflate,gzip"


@dataclass(frozen=True)
class GrpcFailure(Exception):
    """A call ends with this status (a number from STATUS) and text."""

    code: int
    message: str


def too_large(direction: str, size: int, limit: int) -> GrpcFailure:
    return GrpcFailure(STATUS["RESOURCE_EXHAUSTED"], f"{direction} message larger than max ({size} vs. {limit})")


def frame(message: bytes) -> bytes:
    """One uncompressed message with its prefix."""
    return prefix(message) + message


def prefix(message: bytes | memoryview) -> bytes:
    """An uncompressed message's prefix (flag 0, its length), to be sent before it."""
    return prefix_of(len(message))


def prefix_of(size: int) -> bytes:
    """The prefix of an uncompressed message of ``size`` bytes."""
    return b"\0" + size.to_bytes(4, "big")


def compressed_frame(message: bytes, encoding: bytes) -> bytes:
    """One message compressed with ``encoding`` (gzip or deflate), with its prefix; as gRPC does,
    one that compression would not make smaller goes as it is (flag 0, the call's encoding aside)."""
    packed = compress(message, encoding)
    if len(packed) >= len(message):
        return frame(message)
    return b"\1" + len(packed).to_bytes(4, "big") + packed


# Triton's --grpc-infer-response-compression-level: gRPC picks, among the encodings the client
# accepts, the first of the level's order (low: the lighter gzip framing first).
_LEVEL_ORDER = {"low": (b"gzip", b"deflate"), "medium": (b"deflate", b"gzip"), "high": (b"deflate", b"gzip")}


def response_encoding(level: str, accepted: bytes | None) -> bytes | None:
    """The encoding an inference response goes out in, given the client's grpc-accept-encoding;
    None: uncompressed (level none, or the client accepts neither)."""
    order = _LEVEL_ORDER.get(level)
    if order is None or not accepted:
        return None
    offered = {name.strip() for name in accepted.split(b",")}
    return next((encoding for encoding in order if encoding in offered), None)


@dataclass(frozen=True, slots=True)
class Compressed:
    """A compressed message large enough to be inflated off the event loop (``MessageReader.inflate``)."""

    data: bytes


class MessageReader:
    """Cuts a request stream's bytes into messages, refusing one over ``limit`` from its prefix
    (before its bytes are held) and decompressing those flagged compressed. A message split
    over many DATA frames is gathered in one growing buffer, read once it is whole."""

    __slots__ = ("limit", "encoding", "_buffer", "_wanted")

    def __init__(self, limit: int, encoding: bytes | None) -> None:
        self.limit = limit
        self.encoding = encoding
        self._buffer = bytearray()
        self._wanted = _PREFIX   # bytes the buffer must hold before it is worth reading again

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished message are held."""
        return bool(self._buffer)

    def feed(self, data: bytes | memoryview) -> list[bytes | memoryview | Compressed]:
        """The messages ``data`` completes, a large compressed one left for ``inflate``;
        GrpcFailure for one the call cannot take."""
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._wanted:
                return []
            buffer: bytes | bytearray | memoryview = self._buffer
        else:
            buffer = data
        messages: list[bytes | memoryview | Compressed] = []
        position, size = 0, len(buffer)
        self._wanted = _PREFIX
        while size - position >= _PREFIX:
            flag, length = buffer[position], int.from_bytes(buffer[position + 1:position + _PREFIX], "big")
            if length > self.limit:
                raise too_large("Received", length, self.limit)
            if flag > 1:
                raise GrpcFailure(INTERNAL, f"invalid message flag {flag}: expected 0 or 1")
            end = position + _PREFIX + length
            if end > size:
                self._wanted = end - position
                break
            if buffer is self._buffer and position == 0 and end == size and not flag:
                # One message gathered over many frames fills the buffer: it is handed on as a
                # view, not copied twice more (a 600 KB tensor), and the buffer starts afresh.
                messages.append(memoryview(buffer)[_PREFIX:end])
                self._buffer = bytearray()
                return messages
            message = bytes(buffer[position + _PREFIX:end])
            position = end
            if not flag:
                messages.append(message)
            elif length >= OFF_LOOP_BYTES and self.encoding in WBITS:
                messages.append(Compressed(message))
            else:
                messages.append(self.inflate(message))
        if buffer is self._buffer:
            del self._buffer[:position]
        elif position < size:
            self._buffer = bytearray(buffer[position:])
        return messages

    def inflate(self, message: bytes) -> bytes:
        """A compressed message's bytes (safe on any thread: it reads only the call's settings)."""
        wbits = WBITS.get(self.encoding or b"identity")
        if wbits is None:
            name = (self.encoding or b"identity").decode("latin-1")
            raise GrpcFailure(STATUS["UNIMPLEMENTED"] if self.encoding else INTERNAL,
                              f"a compressed message with grpc-encoding '{name}', which this server cannot read")
        inflater = zlib.decompressobj(wbits)
        try:
            plain = inflater.decompress(message, self.limit + 1)
        except zlib.error as exc:
            raise GrpcFailure(INTERNAL, f"the message cannot be decompressed: {exc}") from None
        if len(plain) > self.limit or inflater.unconsumed_tail:
            raise too_large("Received", len(plain) + len(inflater.unconsumed_tail), self.limit)
        return plain


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; None when it is no such value."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def percent_encoded(message: str) -> bytes:
    """``grpc-message``: UTF-8, with '%' and bytes outside printable ASCII as %XX."""
    raw = message.encode()
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in raw)
