"""The server side of HTTP/2 (RFC 9113) as gRPC uses it: frames in, callbacks out, bytes to send
buffered. No I/O: gateway/grpc_server.py feeds it what the socket reads and writes what it holds.

Written for what gRPC needs, not for the web: no server push, no priorities (read and
ignored), no padding sent. Flow control is kept both ways: received data is handed back
(WINDOW_UPDATE) once half a window is taken, and what we send never passes the client's
windows (``send_window``; the caller waits for ``on_window``). Header blocks are decoded
with ``hpack``; a block seen before whose decoding left the dynamic table as it was (gRPC
clients repeat the same indexed headers on every call) is answered from a small cache.
Headers we send are literals without indexing, so their bytes never depend on the table
and the constant ones are encoded once.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import cast

import hpack
from hpack.exceptions import HPACKError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (RFC 9113 section 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

# Settings identifiers.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
# A header block may start with dynamic table size updates (RFC 7541 section 6.3): 001xxxxx.
_SIZE_UPDATE_MASK, _SIZE_UPDATE = 0xE0, 0x20

DEFAULT_WINDOW = 65535
# A piece at least this large is written as it is (data_to_send); a smaller one is cheaper copied
# into one buffer with its neighbours than written as a segment of its own.
LARGE_SEGMENT = 64 * 1024
DEFAULT_FRAME = 16384
MAX_WINDOW = 2**31 - 1
# Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS). Each costs the gateway
# about 2 KB while it waits for its request; unbounded, one connection's HEADERS alone could fill
# the memory. A client's gRPC library queues calls past it; one that opens more is refused.
MAX_OPEN_STREAMS = 4096
_HEAD = struct.Struct(">IBI")   # length << 8 | type, flags, stream id
_PIECES_FROM = 64 * 1024        # a DATA frame this large is handed on in pieces as it arrives
_VIEW_FROM = 4096               # a DATA payload this large is handed on as a view (a smaller one's copy costs less)
_CACHE_LIMIT = 64
# A header block's bytes at most: room for what decodes to MAX_HEADER_LIST, Huffman's longest codes included.
MAX_HEADER_BLOCK = 1024 * 1024
# What a header block may decode to (each header counted as HPACK counts it) before the connection
# ends: past the per-call limit of gRPC's metadata, which fails the call alone, yet small enough
# that a block of one-byte indexed headers decodes in milliseconds.
MAX_HEADER_LIST = 256 * 1024

Headers = list[tuple[bytes, bytes]]   # a decoded header block: (name, value) pairs as they came


class ConnectionFailure(Exception):
    """The connection cannot go on: a GOAWAY with ``code`` ends it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's prefixed integer (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _check_size_updates(block: bytes) -> None:
    """At most two table size updates may start a block (RFC 7541 section 4.2); a block of many
    would cost the decoder seconds and count for nothing against the header list's bound."""
    position = 0
    for _ in range(3):
        if position >= len(block) or block[position] & _SIZE_UPDATE_MASK != _SIZE_UPDATE:
            return
        position += 1
        if block[position - 1] & 0x1F == 0x1F:   # the size goes on in 7-bit groups (section 5.1)
            while position < len(block) and block[position] & 0x80:
                position += 1
            position += 1
    raise ConnectionFailure(COMPRESSION_ERROR, "a header block starting with more than two table size updates")


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (``:status: 200`` as its static index)."""
    out: list[bytes] = []
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(b"\x88")
            continue
        out += (b"\x00", _integer(len(name), 7), name, _integer(len(value), 7), value)
    return b"".join(out)


class _Stream:
    __slots__ = ("send_window", "unacknowledged", "remote_closed", "local_closed")

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window
        self.unacknowledged = 0      # bytes received and not yet handed back
        self.remote_closed = False
        self.local_closed = False


class Http2Connection:
    """One connection's HTTP/2 state. The callbacks: ``on_headers(stream_id, headers, end_stream)``
    for a new stream's request headers, ``on_data(stream_id, data, end_stream)``,
    ``on_reset(stream_id)``, ``on_window(stream_id)`` (0: the connection's window grew),
    ``on_goaway()``; ``on_ping`` after a client's PING is acknowledged."""

    def __init__(self, on_headers: Callable[[int, Headers, bool], None], on_data: Callable[[int, bytes | memoryview, bool], None],
                 on_reset: Callable[[int], None], on_window: Callable[[int], None], on_goaway: Callable[[], None],
                 window: int = DEFAULT_WINDOW, max_frame: int = DEFAULT_FRAME) -> None:
        self.on_headers, self.on_data, self.on_reset = on_headers, on_data, on_reset
        self.on_window, self.on_goaway = on_window, on_goaway
        self.window, self.max_frame = window, max_frame      # what we take
        self.peer_window = DEFAULT_WINDOW                    # the client's initial stream window
        self.peer_max_frame = DEFAULT_FRAME
        self.send_window = DEFAULT_WINDOW                    # the connection's, for what we send
        self.streams: dict[int, _Stream] = {}
        self.max_streams = MAX_OPEN_STREAMS
        self.last_stream_id = 0
        self.going_away = False
        self._unacknowledged = 0
        self.withholding = False   # the connection's window is not handed back: the client sends no more than it has
        self._buffer = bytearray()
        self._piecing: tuple[int, int, int] | None = None   # a large DATA frame handed on as it comes: stream, flags, to come
        self._preface = False
        self._continuing: tuple[int, int, bytearray] | None = None   # stream, flags, header block so far
        # gRPC's bound on a call's headers is the caller's (it fails the one call); the decoder's,
        # higher, ends the connection, as a block it stops midway leaves its table unsure.
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._table_update = b""   # to start our next header block: the client set its table's size
        self._decoded: dict[bytes, Headers] = {}
        self._out: list[bytes | memoryview] = []
        self._large_out = False   # _out holds a segment data_to_send leaves unjoined
        self.on_ping: Callable[[], None] = lambda: None
        # since the last HEADERS or DATA we sent: our PINGs, and when the client's last came
        # and how many came too soon (gateway/grpc_keepalive.py keeps the policy)
        self.pings_without_data = 0
        self.client_ping_at = float("-inf")
        self.ping_strikes = 0

    def start(self) -> None:
        """Our SETTINGS (the first frame a server sends) and the connection window."""
        settings = struct.pack(">HIHIHI", MAX_CONCURRENT_STREAMS, self.max_streams, INITIAL_WINDOW_SIZE, self.window,
                               MAX_FRAME_SIZE, self.max_frame)
        self._out.append(frame(SETTINGS, 0, 0, settings))
        if self.window > DEFAULT_WINDOW:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.window - DEFAULT_WINDOW)))

    def data_to_send(self) -> list[bytes | memoryview]:
        """What to write, in order: runs of small frames joined, a large message's bytes as they
        are (joining them would copy a 600 KB tensor once more)."""
        out, self._out = self._out, []
        if len(out) < 2:
            return out
        if not self._large_out:
            return [b"".join(out)]
        self._large_out = False
        segments: list[bytes | memoryview] = []
        run: list[bytes | memoryview] = []
        for segment in out:
            if len(segment) < LARGE_SEGMENT:
                run.append(segment)
                continue
            if run:
                segments.append(b"".join(run))
                run = []
            segments.append(segment)
        if run:
            segments.append(b"".join(run))
        return segments

    # -- receiving -----------------------------------------------------------------------

    def receive(self, data: bytes | memoryview) -> None:
        """Every complete frame in what has arrived; ConnectionFailure when the client broke the protocol.

        A DATA frame's payload is handed on as a view of ``data`` (the stream's reader keeps what it
        needs), and a large one that spans reads is handed on piece by piece as it arrives, not
        gathered here first: a 600 KB tensor is copied once on its way to the message, not three times."""
        position = 0
        if self._piecing is not None:
            position = self._next_piece(data)
            if position == len(data):
                return
            data = memoryview(data)[position:]
            position = 0
        if self._buffer:
            self._buffer += data
            buffer: bytes | bytearray | memoryview = self._buffer
        else:
            buffer = data
        if not self._preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ConnectionFailure(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._keep(buffer, 0)
                return
            if buffer[:len(PREFACE)] != PREFACE:
                raise ConnectionFailure(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface, position = True, len(PREFACE)
        size = len(buffer)
        while size - position >= 9:
            length_kind, flags, stream_id = _HEAD.unpack_from(buffer, position)
            length, kind = length_kind >> 8, length_kind & 0xFF
            if length > self.max_frame:
                raise ConnectionFailure(FRAME_SIZE_ERROR, f"a frame of {length} bytes, over {self.max_frame}")
            end = position + 9 + length
            if end > size:
                if kind == DATA and length >= _PIECES_FROM and not flags & PADDED and size - position > 9:
                    piece = memoryview(buffer)[position + 9:size]
                    self._first_piece(flags, stream_id & 0x7FFFFFFF, bytes(piece) if buffer is self._buffer else piece,
                                      end - size)
                    del piece   # a view of the buffer would keep it from being cut below
                    position = size
                break
            if kind == DATA and buffer is data and length >= _VIEW_FROM:   # handed on as a view of the read
                self._data_frame(flags, stream_id & 0x7FFFFFFF, memoryview(data)[position + 9:end])
            else:
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(buffer[position + 9:end]))
            position = end
        self._keep(buffer, position)

    def _first_piece(self, flags: int, stream_id: int, piece: bytes | memoryview, to_come: int) -> None:
        """The start of a large DATA frame not all read yet: handed on now, the rest as it comes."""
        self._piecing = (stream_id, flags, to_come)
        self._data_frame(flags & ~END_STREAM, stream_id, piece)

    def _next_piece(self, data: bytes | memoryview) -> int:
        """Hand on the next piece of the DATA frame being read; how much of ``data`` it took."""
        assert self._piecing is not None
        stream_id, flags, to_come = self._piecing
        taken = min(to_come, len(data))
        to_come -= taken
        self._piecing = (stream_id, flags, to_come) if to_come else None
        piece = data if taken == len(data) else memoryview(data)[:taken]
        self._data(flags if not to_come else flags & ~END_STREAM, stream_id, piece)
        return taken

    def _keep(self, buffer: bytes | bytearray | memoryview, position: int) -> None:
        if buffer is self._buffer:
            del self._buffer[:position]
        elif position < len(buffer):
            self._buffer = bytearray(buffer[position:])

    def _data_frame(self, flags: int, stream_id: int, payload: bytes | memoryview) -> None:
        if self._continuing is not None:
            raise ConnectionFailure(PROTOCOL_ERROR, "a header block was interrupted")
        self._data(flags, stream_id, payload)

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is not None and kind != CONTINUATION:
            raise ConnectionFailure(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ConnectionFailure(FRAME_SIZE_ERROR if stream_id == 0 else PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
                self.on_ping()
        elif kind == RST_STREAM:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise ConnectionFailure(PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, never opened")
            if len(payload) != 4:
                raise ConnectionFailure(FRAME_SIZE_ERROR, "a malformed RST_STREAM")
            if self.streams.pop(stream_id, None) is not None:
                self.on_reset(stream_id)
        elif kind == GOAWAY:
            self.going_away = True
            self.on_goaway()
        elif kind == PUSH_PROMISE:
            raise ConnectionFailure(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 says.

    def _data(self, flags: int, stream_id: int, payload: bytes | memoryview) -> None:
        if stream_id == 0:
            raise ConnectionFailure(PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        self._unacknowledged += length
        if self._unacknowledged > self.window // 2 and not self.withholding:
            self._hand_back()
        elif self._unacknowledged > max(self.window, DEFAULT_WINDOW):   # (a smaller window is never announced)
            raise ConnectionFailure(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        stream = self.streams.get(stream_id)
        if stream is None:   # one we reset or answered: its data is dropped
            if stream_id > self.last_stream_id:
                raise ConnectionFailure(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return
        if stream.remote_closed:   # after the client ended its side (RFC 9113 5.1): its call is over
            self._closed_by_client(stream_id)
            return
        if flags & PADDED:
            payload = self._unpadded(payload)
        end = bool(flags & END_STREAM)
        if end:
            stream.remote_closed = True
            self._forget_if_closed(stream_id, stream)
        else:
            stream.unacknowledged += length
            if stream.unacknowledged > self.window // 2:
                self._out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", stream.unacknowledged)))
                stream.unacknowledged = 0
        self.on_data(stream_id, payload, end)

    def withhold(self, withholding: bool) -> None:
        """While ``withholding``, what the client sends is not handed back on the connection's
        window, so that it can send no more than the window it holds; once that ends, what was
        taken is handed back as it would have been."""
        self.withholding = withholding
        if not withholding and self._unacknowledged > self.window // 2:
            self._hand_back()

    def _hand_back(self) -> None:
        self._out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unacknowledged)))
        self._unacknowledged = 0

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id % 2 == 0:
            raise ConnectionFailure(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, not a client's")
        if flags & PADDED:
            payload = bytes(self._unpadded(payload))
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self._continuing = (stream_id, flags, bytearray(payload))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is None or self._continuing[0] != stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._continuing[2].extend(payload)
        if len(self._continuing[2]) > MAX_HEADER_BLOCK:
            raise ConnectionFailure(PROTOCOL_ERROR, f"a header block over {MAX_HEADER_BLOCK} bytes")
        if flags & END_HEADERS:
            stream_id, first_flags, block = self._continuing
            self._continuing = None
            self._header_block(stream_id, first_flags, bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        end = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:   # trailers from the client: they only end its side
            if not end:
                raise ConnectionFailure(PROTOCOL_ERROR, f"a second header block on stream {stream_id} without END_STREAM")
            if stream.remote_closed:   # it had ended its side already
                self._closed_by_client(stream_id)
                return
            stream.remote_closed = True
            self._forget_if_closed(stream_id, stream)
            self.on_data(stream_id, b"", True)
            return
        if stream_id <= self.last_stream_id:
            if not end:   # a new stream may not take a number below one already used (RFC 9113 5.1.1)
                raise ConnectionFailure(PROTOCOL_ERROR, f"stream {stream_id} opened after stream {self.last_stream_id}")
            return   # trailers of a stream we reset or finished: decoded (for HPACK), then ignored
        self.last_stream_id = stream_id
        if len(self.streams) >= self.max_streams:   # past what we advertised: the client may retry it later
            self.reset(stream_id, REFUSED_STREAM)
            return
        stream = self.streams[stream_id] = _Stream(self.peer_window)
        stream.remote_closed = end
        self.on_headers(stream_id, headers, end)

    def _closed_by_client(self, stream_id: int) -> None:
        """A frame on a stream the client had ended: a stream error, STREAM_CLOSED, that ends its call."""
        self.reset(stream_id, STREAM_CLOSED)
        self.on_reset(stream_id)

    def _decode(self, block: bytes) -> Headers:
        """The block's headers; a repeated block that changed nothing in the table from the cache."""
        if block and block[0] & _SIZE_UPDATE_MASK == _SIZE_UPDATE:   # it sets the table's size: never cached
            _check_size_updates(block)
            self._decoded.clear()
            return self._decode_block(block)
        cached = self._decoded.get(block)
        if cached is not None:
            return cached
        entries = self._decoder.header_table.dynamic_entries
        # An insertion puts a new tuple first (hpack makes one each time): the same length and the
        # same first object (held here, so that no new one can take its place) mean no change.
        size, first = len(entries), entries[0] if entries else None
        headers = self._decode_block(block)
        if size == len(entries) and (entries[0] if entries else None) is first:
            if len(self._decoded) >= _CACHE_LIMIT:
                self._decoded.clear()
            self._decoded[block] = headers
        else:   # the table changed: what was cached may now mean something else
            self._decoded.clear()
        return headers

    def _decode_block(self, block: bytes) -> Headers:
        try:
            return cast(Headers, self._decoder.decode(block, raw=True))   # raw=True: a list of bytes pairs
        except HPACKError as exc:
            raise ConnectionFailure(COMPRESSION_ERROR, f"a header block that cannot be decoded: {exc}") from None

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionFailure(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionFailure(FLOW_CONTROL_ERROR, "the connection window passed 2^31-1")
            self.on_window(0)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionFailure(PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {stream_id}, never opened")
            return
        if increment == 0 or stream.send_window + increment > MAX_WINDOW:
            self.reset(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
            self.on_reset(stream_id)
            return
        stream.send_window += increment
        self.on_window(stream_id)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a malformed SETTINGS")
        grown = False
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFailure(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ConnectionFailure(FLOW_CONTROL_ERROR, "a stream's window passed 2^31-1")
                grown = grown or delta > 0
            elif key == HEADER_TABLE_SIZE:
                # Our blocks use no table; a decoder told to keep a smaller one waits for our size
                # update at the start of the next block (RFC 7541 section 4.2): 0 fits any.
                self._table_update = bytes((_SIZE_UPDATE,))
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 2**24 - 1:
                    raise ConnectionFailure(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self.peer_max_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise ConnectionFailure(PROTOCOL_ERROR, "ENABLE_PUSH other than 0 or 1")
        self._out.append(frame(SETTINGS, ACK, 0))
        if grown:
            self.on_window(0)

    @staticmethod
    def _unpadded(payload: bytes | memoryview) -> bytes | memoryview:
        padding = payload[0] if payload else 0
        if not payload or padding >= len(payload):
            raise ConnectionFailure(PROTOCOL_ERROR, "padding longer than its frame")
        return payload[1:len(payload) - padding]

    # -- sending -------------------------------------------------------------------------

    def window_for(self, stream_id: int) -> int:
        """How many bytes of DATA the stream may send now (0 for a stream that is gone)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        return min(stream.send_window, self.send_window, self.peer_max_frame)

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self.streams

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block (see encode_headers); CONTINUATION frames when it passes the client's frame size."""
        limit = self.peer_max_frame
        flags = END_STREAM if end_stream else 0
        if self._table_update:
            block, self._table_update = self._table_update + block, b""
        if len(block) <= limit:
            self._out.append(frame(HEADERS, flags | END_HEADERS, stream_id, block))
        else:
            chunks = [block[i:i + limit] for i in range(0, len(block), limit)]
            self._out.append(frame(HEADERS, flags, stream_id, chunks[0]))
            for index, chunk in enumerate(chunks[1:], 2):
                self._out.append(frame(CONTINUATION, END_HEADERS if index == len(chunks) else 0, stream_id, chunk))
        if end_stream:
            self._end_local(stream_id)
        self._sent_data()

    def send_whole_answer(self, stream_id: int, headers: bytes, message: tuple[bytes | memoryview, ...],
                          trailers: bytes) -> bool:
        """A call's response headers, its one DATA frame (``message``: its pieces, written one
        after the other) and its trailers (END_STREAM), in one go, when the windows and the
        client's frame size take them as they are; False (nothing sent) when not."""
        stream = self.streams.get(stream_id)
        size = sum(map(len, message))
        limit = self.peer_max_frame
        if self._table_update:
            headers = self._table_update + headers
        if stream is None or size > stream.send_window or size > self.send_window or size > limit \
                or len(headers) > limit or len(trailers) > limit:
            return False
        self._table_update = b""
        stream.send_window -= size
        self.send_window -= size
        pieces = (_HEAD.pack(len(headers) << 8 | HEADERS, END_HEADERS, stream_id), headers,
                  _HEAD.pack(size << 8 | DATA, 0, stream_id), *message,
                  _HEAD.pack(len(trailers) << 8 | HEADERS, END_HEADERS | END_STREAM, stream_id), trailers)
        if size < LARGE_SEGMENT:   # large pieces (an output's data) are written as they are
            self._out.append(b"".join(pieces))
        else:
            self._out += pieces
            self._large_out = True
        self._end_local(stream_id)
        self._sent_data()
        return True

    def send_data(self, stream_id: int, data: bytes | memoryview) -> None:
        """DATA within the windows: the caller asked ``window_for`` first."""
        stream = self.streams[stream_id]
        stream.send_window -= len(data)
        self.send_window -= len(data)
        if len(data) < LARGE_SEGMENT:
            self._out.append(frame(DATA, 0, stream_id, data))
        else:
            self._out += (_HEAD.pack(len(data) << 8 | DATA, 0, stream_id), data)
            self._large_out = True
        self._sent_data()

    def _sent_data(self) -> None:
        self.pings_without_data = 0
        self.client_ping_at = float("-inf")
        self.ping_strikes = 0

    def ping(self) -> None:
        """A PING of our own (keepalive); the client's acknowledgement is just more bytes read."""
        self._out.append(frame(PING, 0, 0, b"tritium\x00"))
        self.pings_without_data += 1

    def reset(self, stream_id: int, code: int) -> None:
        self._out.append(frame(RST_STREAM, 0, stream_id, struct.pack(">I", code)))
        self.streams.pop(stream_id, None)

    def go_away(self, code: int = NO_ERROR, message: str = "") -> None:
        self._out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream_id, code) + message.encode()))

    def _end_local(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.local_closed = True
            self._forget_if_closed(stream_id, stream)

    def _forget_if_closed(self, stream_id: int, stream: _Stream) -> None:
        if stream.local_closed and stream.remote_closed:
            del self.streams[stream_id]
