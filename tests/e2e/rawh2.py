"""A bare HTTP/2 client for gRPC edge cases that real clients never produce (a message larger
than the limit announced in its prefix, a bad prefix, a reset in mid-request, a tiny window).

Frames are written and read as they are, so a test sees exactly what the server sent.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
CANCEL_CODE = 0x8
INITIAL_WINDOW_SIZE = 4
SERVICE = "/inference.GRPCInferenceService/"


@dataclass
class Answer:
    """What one stream got back."""

    headers: list = field(default_factory=list)     # every header block, decoded
    data: bytes = b""
    reset: int | None = None                         # RST_STREAM's error code
    ended: bool = False

    @property
    def status(self) -> int | None:
        for block in self.headers:
            for name, value in block:
                if name == b"grpc-status":
                    return int(value)
        return None

    @property
    def message(self) -> str:
        for block in self.headers:
            for name, value in block:
                if name == b"grpc-message":
                    return value.decode()
        return ""

    @property
    def messages(self) -> list[bytes]:
        out, data = [], self.data
        while len(data) >= 5:
            length = int.from_bytes(data[1:5], "big")
            out.append(data[5:5 + length])
            data = data[5 + length:]
        return out


def grpc_message(payload: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(payload).to_bytes(4, "big") + payload


class RawH2:
    def __init__(self, url: str, settings: dict[int, int] | None = None, timeout_s: float = 10.0,
                 answer_pings: bool = False, socket_buffers: int | None = None) -> None:
        self.answer_pings = answer_pings   # as real clients do; off: a client that went silent
        host, port = url.rsplit(":", 1)
        self.sock = socket.socket()
        if socket_buffers is not None:   # set before connecting, so that the windows start that small
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                self.sock.setsockopt(socket.SOL_SOCKET, option, socket_buffers)
        self.sock.settimeout(timeout_s)
        self.sock.connect((host, int(port)))
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.answers: dict[int, Answer] = {}
        self.frames: list[tuple[int, int, int, bytes]] = []   # every frame read, in order
        self._buffer = b""
        payload = b"".join(struct.pack(">HI", key, value) for key, value in (settings or {}).items())
        self.sock.sendall(PREFACE + self.frame(SETTINGS, 0, 0, payload))
        self.next_stream = 1

    @staticmethod
    def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
        return struct.pack(">IBI", len(payload) << 8 | kind, flags, stream_id) + payload

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.sock.sendall(self.frame(kind, flags, stream_id, payload))

    def start_call(self, method: str, extra_headers: tuple = (), end_stream: bool = False) -> int:
        """HEADERS opening a call; its stream id."""
        stream_id, self.next_stream = self.next_stream, self.next_stream + 2
        headers = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
                   (":authority", "localhost"), ("te", "trailers"), ("content-type", "application/grpc"),
                   *extra_headers]
        self.send(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, self.encoder.encode(headers))
        return stream_id

    def call(self, method: str, payload: bytes, extra_headers: tuple = ()) -> Answer:
        stream_id = self.start_call(method, extra_headers)
        self.send(DATA, END_STREAM, stream_id, grpc_message(payload))
        return self.wait(stream_id)

    def wait(self, stream_id: int, timeout_s: float = 10.0) -> Answer:
        """Read frames until the stream ends or is reset."""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.answers.get(stream_id)
            if answer is not None and (answer.ended or answer.reset is not None):
                return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {stream_id} did not end; frames: {self.frames}")
            self.read_some()

    def read_some(self) -> None:
        self.receive_unread()
        self.take_frames()

    def receive_unread(self) -> None:
        """Bytes read off the socket, their frames not yet taken (nothing sent in reply)."""
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buffer += chunk

    def take_frames(self) -> None:
        while len(self._buffer) >= 9:
            length_kind, flags, stream_id = struct.unpack_from(">IBI", self._buffer)
            length = length_kind >> 8
            if len(self._buffer) < 9 + length:
                break
            payload, self._buffer = self._buffer[9:9 + length], self._buffer[9 + length:]
            self._take(length_kind & 0xFF, flags, stream_id, payload)

    def _take(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        self.frames.append((kind, flags, stream_id, payload))
        if kind == SETTINGS and not flags & ACK:
            self.send(SETTINGS, ACK, 0)
        if kind == PING and not flags & ACK and self.answer_pings:
            self.send(PING, ACK, 0, payload)
        if not stream_id:
            return
        answer = self.answers.setdefault(stream_id, Answer())
        if kind == HEADERS:
            answer.headers.append(self.decoder.decode(payload, raw=True))
        elif kind == DATA:
            answer.data += payload
        elif kind == RST_STREAM:
            answer.reset = int.from_bytes(payload, "big")
        if kind in (HEADERS, DATA) and flags & END_STREAM:
            answer.ended = True

    def read_until_closed(self, timeout_s: float) -> float | None:
        """Read every frame until the server closes the connection: seconds from now until it
        did, or None if it was still open after ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            self.sock.settimeout(max(0.01, timeout_s - (time.monotonic() - start)))
            try:
                self.read_some()
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, TimeoutError):
                    return None
                return time.monotonic() - start
        return None

    def close(self) -> None:
        self.sock.close()
