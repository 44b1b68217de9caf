"""gRPC served on the gateway's own event loop: an asyncio Protocol over the HTTP/2 of
gateway/grpc_http2.py, as gateway/http_server.py serves HTTP/1.1 on httptools.

Each HTTP/2 stream is one call, dispatched by ``:path`` to the servicer in
gateway/grpc_api.py. ModelInfer takes the callback path (``infer_then``: no task, no
future; the answer is written in the event-loop turn that reads the broker's reply);
the other unary RPCs run the servicer's coroutine in a task; ModelStreamInfer sends each
request as it is read and each answer as it comes, from callbacks too (``open_stream``). What a gRPC server owes its
clients is kept: message size limits checked from the length prefix, gzip/deflate
request messages, ``grpc-timeout`` deadlines, flow control both ways (received data
acknowledged as it is taken; responses wait for the client's window), PING acks, and a
graceful drain (GOAWAY, calls in flight finished, then the connections closed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, cast

import grpc

from tritium.gateway.compression import OFF_LOOP_BYTES
from tritium.gateway.connections import OpenConnections
from tritium.gateway.grpc_api import (MAX_MESSAGE_BYTES, SERVICE, GrpcInferenceService, InferStream,
                                     health_check_method, never_costly, rpc_methods)
from tritium.gateway.grpc_codec import joined
from tritium.gateway.grpc_http2 import (CANCEL, ENHANCE_YOUR_CALM, LARGE_SEGMENT, NO_ERROR, REFUSED_STREAM,
                                        ConnectionFailure, Headers, Http2Connection, encode_headers)
from tritium.gateway.grpc_keepalive import GrpcKeepalive, KeepaliveTimers, too_many_pings
from tritium.gateway.grpc_tls import GrpcTls
from tritium.gateway.offload import decode_threads, zlib_threads
from tritium.gateway.grpc_wire import (ACCEPTED_ENCODINGS, INTERNAL, OK, STATUS, Compressed, GrpcFailure, MessageReader,
                                      compressed_frame, frame, parse_timeout, prefix, prefix_of, percent_encoded,
                                      response_encoding, too_large)
from tritium.gateway.header_forwarding import binary_metadata_value
from tritium.gateway.turn_sends import TurnSends, ring_socket
from tritium.errors import InvalidArgument, TritiumError
from tritium.ports import PortInUse, bound_socket

log = logging.getLogger(__name__)

_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                     (b"grpc-accept-encoding", ACCEPTED_ENCODINGS)]
_RESPONSE_BLOCK = encode_headers(_RESPONSE_HEADERS)
_COMPRESSED_BLOCKS = {encoding: encode_headers([*_RESPONSE_HEADERS, (b"grpc-encoding", encoding)])
                      for encoding in (b"gzip", b"deflate")}
_INFERENCE = frozenset(("ModelInfer", "ModelStreamInfer"))   # the responses Triton's level compresses
_OK_BLOCK = encode_headers([(b"grpc-status", b"0")])
_NOT_GRPC_BLOCK = encode_headers([(b":status", b"415"), (b"content-type", b"text/plain")])
_WINDOW = 16 * 1024 * 1024         # what a client may send ahead of our acknowledgements
_MAX_FRAME = 1024 * 1024           # the largest DATA frame we take (fewer frames for big tensors)
# Answers a connection holds for a client that does not read them: past this, it takes no new
# calls (and hands back none of its window) until the client has read enough of them.
MAX_HELD_BYTES = 64 * 1024 * 1024
_NOT_METADATA = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))
# The most a call's request headers may hold, each counted as HPACK counts an entry (name, value
# and 32): gRPC C-core's hard limit, which Triton serves with; a call past it fails alone.
MAX_METADATA_BYTES = 16 * 1024
_DEADLINE_EXCEEDED = GrpcFailure(STATUS["DEADLINE_EXCEEDED"], "Deadline Exceeded")


@dataclass(frozen=True)
class Rpc:
    name: str
    streaming: bool
    parse: Callable[[bytes | memoryview], Any]   # bytes -> request message, or UNPARSABLE
    serialize: Callable[[Any], bytes]    # response message -> bytes
    handler: Callable[..., Any]          # the servicer's coroutine function (unary calls)
    costly: Callable[[bytes | memoryview], bool] = never_costly   # see RpcMethod
    read_ahead: Callable[[bytes | memoryview], Any] = bytes

    def request(self, message: Any) -> Any:
        """The request message the servicer takes: bytes parsed here, a read ahead's as it is."""
        return self.parse(message) if isinstance(message, (bytes, memoryview)) else message


def status_of(error: TritiumError) -> GrpcFailure:
    return GrpcFailure(STATUS[error.code.grpc_code_name], error.message)


class CallContext:
    """What the servicer's methods ask of grpc.aio's context: the metadata, and abort."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Headers) -> None:
        self._headers = headers

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """Names as text and ``-bin`` values decoded, as grpc.aio gives them; InvalidArgument for a
        ``-bin`` value that is not base64."""
        pairs: list[tuple[str, str | bytes]] = []
        for raw_name, value in self._headers:
            name = raw_name.decode("latin-1")
            pairs.append((name, binary_metadata_value(name, value) if name.endswith("-bin") else value.decode("latin-1")))
        return tuple(pairs)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        raise GrpcFailure(code.value[0], details)


class _RequestHead(NamedTuple):
    """What a call's request headers say; ``metadata`` (read only: calls of the same headers share it)
    is what is not HTTP/2's or gRPC's own."""

    path: bytes
    content_type: bytes | None
    encoding: bytes | None
    timeout: float | None
    accepted: bytes | None
    metadata: Headers
    size: int   # of the whole block, as HPACK counts it

    @classmethod
    def of(cls, headers: Headers) -> _RequestHead:
        path = b""
        content_type = encoding = accepted = None
        timeout: float | None = None
        metadata: Headers = []
        for name, value in headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-timeout":
                timeout = parse_timeout(value)
            elif name == b"grpc-accept-encoding":
                accepted = value
            elif name not in _NOT_METADATA:
                metadata.append((name, value))
        size = 32 * len(headers) + sum(map(len, itertools.chain.from_iterable(headers)))
        return cls(path, content_type, encoding, timeout, accepted, metadata, size)


class _Call:
    """One stream: its request bytes, the work answering it, and what waits on the send window."""

    __slots__ = ("id", "rpc", "headers", "reader", "messages", "stream", "task", "timer", "headers_sent",
                 "done", "remote_closed", "pending", "trailers", "encoding", "cut", "give_up", "preparing")

    def __init__(self, stream_id: int, rpc: Rpc, headers: Headers, reader: MessageReader,
                 encoding: bytes | None = None) -> None:
        self.id, self.rpc, self.headers, self.reader = stream_id, rpc, headers, reader
        self.encoding = encoding   # what its responses are compressed with (None: they are not)
        self.cut = False           # part of a message is sent and the rest waits for the client's window
        self.messages: list[Any] = []   # a unary call's request: bytes, or a read ahead's
        self.stream: InferStream | None = None    # a streaming call's requests and answers
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.headers_sent = False
        self.done = False               # its status is decided (sent, or waiting behind data)
        self.remote_closed = False
        # what the client's window has no room for yet; a future: a large message still being compressed
        self.pending: deque[memoryview | asyncio.Future[bytes]] = deque()
        self.trailers: bytes | None = None     # the trailers' header block, sent after ``pending``
        self.give_up: Callable[[], None] | None = None   # cancels its request, should the call end unanswered
        # requests read but not yet taken, in order, once one is being prepared on a thread
        # (inflated, or read ahead: Rpc.read_ahead)
        self.preparing: deque[Any] = deque()

    def abandon(self) -> None:
        """The client left the call (reset, deadline, connection lost) before its answers: its
        requests still waiting or running are cancelled."""
        if self.done:
            return
        if self.give_up is not None:
            self.give_up()
        if self.stream is not None:
            self.stream.abandon()


class _Shared(OpenConnections["GrpcConnection"]):
    """What every connection of one server shares: the RPCs, the limit, the open connections."""

    def __init__(self, servicer: GrpcInferenceService, rpcs: dict[bytes, Rpc], max_message_bytes: int,
                 keepalive: GrpcKeepalive, compression_level: str, max_held_bytes: int = MAX_HELD_BYTES) -> None:
        super().__init__()
        self.servicer, self.rpcs, self.max_message_bytes = servicer, rpcs, max_message_bytes
        self.max_held_bytes = max_held_bytes
        self.keepalive = keepalive
        self.compression_level = compression_level   # Triton's, for inference responses
        self.sends: TurnSends | None = None   # set by GrpcServer.start: how the connections' bytes go out
        self.tls = False   # TLS connections: their transports encrypt, so their sockets are never written directly


class GrpcConnection(asyncio.Protocol):
    """One client connection: HTTP/2 frames in and out, each stream a call."""

    transport: asyncio.Transport   # set by connection_made, which asyncio calls before any other method

    def __init__(self, shared: _Shared, loop: asyncio.AbstractEventLoop) -> None:
        self.shared, self.loop = shared, loop
        self.http2 = Http2Connection(self._request, self._data, self._reset_by_client, self._window_grew,
                                     self._client_going_away, window=_WINDOW, max_frame=_MAX_FRAME)
        self.http2.on_ping = self._client_pinged
        self.calls: dict[int, _Call] = {}      # streams not yet answered, or answered but still sending
        # The calls whose data waits for the client's window: a connection WINDOW_UPDATE (one
        # per answer read, from most clients) wakes these, not every call on the connection.
        self.blocked: dict[int, _Call] = {}
        # While the client leaves too many answers unread (``holding``), the calls it starts and
        # the requests of its streams wait here, in order, each as (call, what starts it).
        self.holding = False
        self.write_paused = False
        self.pending_bytes = 0   # of answers in the calls' ``pending``, compressed ones once they are
        self.held_back: deque[tuple[_Call, Callable[[], None]]] = deque()
        self.recheck_scheduled = False
        self.last_headers: Headers | None = None   # the last call's header block, and what it says
        self.last_head = _RequestHead(b"", None, None, None, None, [], 0)
        self.flush_scheduled = False
        self.closed = False
        self.unread = False   # not read from: it sends while leaving everything we send unread
        self.aged = False        # past its maximum age: told GOAWAY, closes when its calls are done
        self.timers: KeepaliveTimers | None = None
        self.sends = cast(TurnSends, shared.sends)   # the server starts its connections after setting it
        self.fd: int | None = None   # the socket the turn's sends go to (None: through the transport)

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # a stream server's transports are Transports
        self.fd = ring_socket(transport) if self.sends.batching and not self.shared.tls else None
        self.shared.opened(self)
        settings = self.shared.keepalive
        if settings.time_ms > 0 or settings.max_age_ms > 0:
            self.timers = KeepaliveTimers(settings, self.loop, busy=lambda: bool(self.calls), ping=self._keepalive_ping,
                                          go_away=self._too_old, close=self._abandon)
        self.http2.start()
        if self.shared.draining:   # a TLS handshake that ended after the drain began: no calls here
            self.http2.go_away()
        self._flush()

    def eof_received(self) -> bool:
        """The client ended its side: the loop closes the transport when this returns, after what
        this turn has for the client."""
        self._flush()
        self.sends.release(self.transport)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timers is not None:
            self.timers.cancel()
        for call in list(self.calls.values()):
            call.abandon()
            self._forget(call)
        self.held_back.clear()
        self.shared.lost(self)

    def data_received(self, data: bytes) -> None:
        if self.timers is not None:
            self.timers.heard()
        if self.holding or self.write_paused or self.pending_bytes > self.shared.max_held_bytes:
            self._hold_if_unread()   # before the calls this data starts
        try:
            self.http2.receive(data)
        except ConnectionFailure as failure:
            log.debug("gRPC connection closed: %s", failure)
            self.http2.go_away(failure.code, str(failure))
            self._flush()
            self.close()
            return
        if self.holding:   # what it read (window updates, resets) may have made room
            self._hold_if_unread()
        self._flush()
        if self.holding and self.write_paused and self.transport.get_write_buffer_size() > self.shared.max_held_bytes:
            # Past the bound on its own: what a client that reads nothing asks to be answered at
            # once (SETTINGS, PINGs) would grow without end; it is read again once it reads.
            self.unread = True
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.unread and not self.closed:
            self.unread = False
            self.transport.resume_reading()
        self._room_made()

    # -- HTTP/2 callbacks ----------------------------------------------------------------

    def _request(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        if headers is not self.last_headers:   # (a client's repeated block is decoded to the same list)
            self.last_head, self.last_headers = _RequestHead.of(headers), headers
        path, content_type, encoding, timeout, accepted, metadata, size = self.last_head
        if self.shared.draining or self.aged:
            self.http2.reset(stream_id, REFUSED_STREAM)   # past our GOAWAY: the client may retry
            return
        if size > MAX_METADATA_BYTES:
            self._refuse(stream_id, end_stream, STATUS["RESOURCE_EXHAUSTED"],
                         f"received metadata size exceeds hard limit ({size} vs. {MAX_METADATA_BYTES})")
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            self.http2.send_headers(stream_id, _NOT_GRPC_BLOCK, end_stream=True)
            if not end_stream:
                self.http2.reset(stream_id, NO_ERROR)
            return
        rpc = self.shared.rpcs.get(path)
        if rpc is None:
            self._refuse(stream_id, end_stream, STATUS["UNIMPLEMENTED"], f"unknown RPC {path.decode('latin-1')}")
            return
        compressed = response_encoding(self.shared.compression_level, accepted) if rpc.name in _INFERENCE else None
        call = _Call(stream_id, rpc, metadata, MessageReader(self.shared.max_message_bytes, encoding), compressed)
        call.remote_closed = end_stream
        self.calls[stream_id] = call
        if timeout is not None:
            call.timer = self.loop.call_later(timeout, self._expire, call)
        if rpc.streaming:
            try:
                call.stream = self.shared.servicer.open_stream(
                    CallContext(metadata).invocation_metadata(), partial(self._stream_send, call),
                    partial(self._stream_fail, call), partial(self._stream_finish, call))
            except TritiumError as exc:   # the call ends before its first request is read
                self._fail(call, status_of(exc))
                return
        if end_stream:
            self._ended(call)

    def _refuse(self, stream_id: int, end_stream: bool, code: int, message: str) -> None:
        """Trailers-only, as a call that failed before its first message."""
        self.http2.send_headers(stream_id, _trailers(code, message, headers_sent=False), end_stream=True)
        if not end_stream:   # stop the client sending more of a call that is over
            self.http2.reset(stream_id, NO_ERROR)

    def _data(self, stream_id: int, data: bytes | memoryview, end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.done:
            return
        if end_stream:   # first: a stream's call may end while its last messages are handled
            call.remote_closed = True
        if data:
            try:
                messages = call.reader.feed(data)
            except GrpcFailure as failure:
                self._fail(call, failure)
                return
            rpc = call.rpc
            if call.preparing or any(isinstance(message, Compressed) or rpc.costly(message) for message in messages):
                self._prepare(call, messages)
            else:
                self._take(call, messages)
        if end_stream and not call.done and not call.preparing:
            self._ended(call)

    def _take(self, call: _Call, messages: list[Any]) -> None:
        if call.stream is None:
            call.messages += messages
        elif self.holding or self.held_back:
            for message in messages:
                self.held_back.append((call, partial(call.stream.request, call.rpc.request(message))))
        else:
            for message in messages:
                call.stream.request(call.rpc.request(message))

    def _prepare(self, call: _Call, messages: list[bytes | memoryview | Compressed]) -> None:
        """Large compressed requests are inflated, and requests costly to read are read, on a
        thread; the call's requests after one wait behind it, so that they are taken in order
        (and the call's end after them)."""
        rpc = call.rpc
        for message in messages:
            if isinstance(message, Compressed):
                preparing = zlib_threads.run(_inflated_and_read, call.reader, rpc, message.data)
            elif rpc.costly(message):
                preparing = decode_threads.run(rpc.read_ahead, message)
            else:
                call.preparing.append(message)
                continue
            preparing.add_done_callback(partial(self._prepared, call))
            call.preparing.append(preparing)

    def _prepared(self, call: _Call, _: asyncio.Future | None = None) -> None:
        """Take the call's requests that are ready, up to the first still being prepared."""
        if not call.preparing:   # taken already, by the callback of a message that finished before
            return
        while call.preparing and not call.done:
            head = call.preparing[0]
            if isinstance(head, asyncio.Future):
                if not head.done():
                    return
                try:
                    message = head.result()
                except GrpcFailure as failure:
                    self._fail(call, failure)
                    break
                except Exception as exc:
                    self._fail(call, _internal(call, exc))
                    break
            else:
                message = head
            call.preparing.popleft()
            self._take(call, [message])
        else:
            if call.remote_closed and not call.done:
                self._ended(call)
        self._flush_soon()

    def _ended(self, call: _Call) -> None:
        """The client has sent all of the call's requests."""
        if call.reader.partial:
            self._fail(call, GrpcFailure(INTERNAL, "the request stream ended inside a message"))
        elif len(call.messages) != 1 and call.stream is None:
            self._fail(call, GrpcFailure(INTERNAL, f"a unary call needs one request message, got {len(call.messages)}"))
        elif self.holding or self.held_back:   # after what is held back, in order
            self.held_back.append((call, call.stream.client_done if call.stream is not None else
                                   partial(self._unary, call, call.rpc.request(call.messages.pop()))))
        elif call.stream is not None:
            call.stream.client_done()
        else:
            self._unary(call, call.rpc.request(call.messages.pop()))

    def _reset_by_client(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.abandon()
            self._forget(call)

    def _window_grew(self, stream_id: int) -> None:
        if stream_id:
            call = self.calls.get(stream_id)
            if call is not None and call.pending:
                self._send_pending(call)
        else:
            for call in list(self.blocked.values()):
                self._send_pending(call)

    def _hold_if_unread(self) -> None:
        """Hold back new calls (and the connection's window) while the answers the client has
        not read pass ``max_held_bytes``; start those held back once they no longer do."""
        held = self.transport.get_write_buffer_size() + self.pending_bytes
        holding = held > self.shared.max_held_bytes
        if holding != self.holding:
            self.holding = holding
            self.http2.withhold(holding)
            if holding:
                log.debug("gRPC connection: %d bytes of answers unread, no new calls taken until they are", held)
        while self.held_back and not self.holding and not self.closed:
            call, start = self.held_back.popleft()
            if not call.done:   # not reset, expired or failed meanwhile
                start()

    def _recheck(self) -> None:
        self.recheck_scheduled = False
        self._room_made()

    def _room_made(self) -> None:
        """Unread answers left (read, dropped or written out): the calls held back may start."""
        if self.holding and not self.closed:
            self._hold_if_unread()
            self._flush_soon()

    def _client_going_away(self) -> None:
        if not self.calls:
            self.close()

    # -- calls -------------------------------------------------------------------------

    def _unary(self, call: _Call, request: Any) -> None:
        if call.rpc.name == "ModelInfer":
            try:
                call.give_up = self.shared.servicer.infer_then(request, call.headers,
                                                               lambda answer: self._answered(call, answer))
            except TritiumError as exc:
                self._fail(call, status_of(exc))
            except Exception as exc:
                self._fail(call, _internal(call, exc))
            return
        responses = _one(call.rpc.handler, request, CallContext(call.headers))
        call.task = self.loop.create_task(self._serve(call, responses))

    def _answered(self, call: _Call, answer: tuple[bytes | memoryview, ...] | TritiumError) -> None:
        """ModelInfer's answer (the message's pieces), from the broker link's callback."""
        if call.done:   # the client reset it, or its deadline passed
            return
        try:
            if isinstance(answer, TritiumError):
                self._fail(call, status_of(answer))
            elif not self._answer_at_once(call, answer):
                self._send_message(call, joined(answer))
                self._finish(call, OK, "")
        except GrpcFailure as failure:
            self._fail(call, failure)
        except Exception as exc:
            self._fail(call, _internal(call, exc))
        self._flush_soon()

    def _answer_at_once(self, call: _Call, pieces: tuple[bytes | memoryview, ...]) -> bool:
        """The usual unary answer (uncompressed, nothing sent before it, room in the client's
        windows): headers, message and OK trailers in one go; False when it is not that."""
        size = len(pieces[0]) if len(pieces) == 1 else sum(map(len, pieces))
        if call.encoding is not None or call.headers_sent or size > self.shared.max_message_bytes \
                or not self.http2.send_whole_answer(call.id, _RESPONSE_BLOCK, (prefix_of(size), *pieces), _OK_BLOCK):
            return False
        call.done = call.headers_sent = True
        if not call.remote_closed:   # stop the client sending more of a call that is over
            self.http2.reset(call.id, NO_ERROR)
        self._forget(call)
        return True

    def _stream_send(self, call: _Call, response: bytes) -> None:
        """One answer of a ModelStreamInfer call, its bytes (gateway/grpc_api.InferStream)."""
        if call.done:   # the client reset it, or its deadline passed
            return
        try:
            self._send_message(call, response)
        except GrpcFailure as failure:
            self._fail(call, failure)
        except Exception as exc:   # never back into InferStream, which counts each answer once
            self._fail(call, _internal(call, exc))
        self._flush_soon()

    def _stream_fail(self, call: _Call, error: TritiumError) -> None:
        if not call.done:
            self._fail(call, status_of(error))
            self._flush_soon()

    def _stream_finish(self, call: _Call) -> None:
        if not call.done:
            self._finish(call, OK, "")
            self._flush_soon()

    async def _serve(self, call: _Call, responses: AsyncIterator[Any]) -> None:
        """A call the servicer answers as a coroutine: each response leaves as it comes."""
        try:
            async for response in responses:
                if call.done:
                    return
                self._send_message(call, call.rpc.serialize(response))
                self._flush_soon()
            self._finish(call, OK, "")
        except GrpcFailure as failure:
            self._fail(call, failure)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self._fail(call, _internal(call, exc))
        self._flush_soon()

    def _expire(self, call: _Call) -> None:
        call.timer = None
        if not call.done:
            call.abandon()
            if call.task is not None:
                call.task.cancel()
            if not call.cut:   # past the deadline nothing more goes out, compressed or not
                self._drop_pending(call)
            self._fail(call, _DEADLINE_EXCEEDED)
        elif call.cut:   # answered, but the client's window held the answer back past the deadline
            self._cancel(call)
        elif call.pending:
            self._drop_pending(call)
            call.trailers = _trailers(_DEADLINE_EXCEEDED.code, _DEADLINE_EXCEEDED.message, headers_sent=True)
            self._send_pending(call)
        self._flush_soon()

    # -- sending -----------------------------------------------------------------------

    def _send_message(self, call: _Call, payload: bytes) -> None:
        if len(payload) > self.shared.max_message_bytes:
            raise too_large("Sent", len(payload), self.shared.max_message_bytes)
        if not call.headers_sent:
            call.headers_sent = True
            self.http2.send_headers(call.id, _RESPONSE_BLOCK if call.encoding is None else _COMPRESSED_BLOCKS[call.encoding])
        if call.encoding is not None and len(payload) >= OFF_LOOP_BYTES:
            self._compress_in_thread(call, payload, call.encoding)
            return
        if call.encoding is not None:
            message = memoryview(compressed_frame(payload, call.encoding))
            call.pending.append(message)
            self.pending_bytes += len(message)
        elif len(payload) < LARGE_SEGMENT:
            call.pending.append(memoryview(frame(payload)))   # sliced into DATA frames without copies
            self.pending_bytes += len(payload) + 5
        else:   # a large answer's bytes are not copied behind its prefix
            call.pending += (memoryview(prefix(payload)), memoryview(payload))
            self.pending_bytes += len(payload) + 5
        self._send_pending(call)

    def _compress_in_thread(self, call: _Call, payload: bytes, encoding: bytes) -> None:
        """The message waits in ``pending`` as a future, holding back what follows it (later
        messages, the trailers) until it is compressed."""
        compressing = zlib_threads.run(compressed_frame, payload, encoding)
        call.pending.append(compressing)

        def compressed(done: asyncio.Future[bytes]) -> None:
            if compressing not in call.pending:   # the call failed, was reset or expired meanwhile
                return
            try:
                message = done.result()
            except Exception as exc:
                self._fail_compressing(call, compressing, _internal(call, exc))
            else:
                call.pending[call.pending.index(compressing)] = memoryview(message)
                self.pending_bytes += len(message)
                self._send_pending(call)
            self._flush_soon()

        compressing.add_done_callback(compressed)

    def _send_pending(self, call: _Call) -> None:
        """As much of what waits as the client's windows take; then the trailers, if decided."""
        http2 = self.http2
        while call.pending:
            if isinstance(call.pending[0], asyncio.Future):   # still being compressed
                return
            room = http2.window_for(call.id)
            if room <= 0:
                if http2.is_open(call.id):
                    self.blocked[call.id] = call
                else:
                    self._forget(call)
                return
            data = cast(memoryview, call.pending.popleft())   # a future stops the loop above
            call.cut = len(data) > room
            if call.cut:
                call.pending.appendleft(data[room:])
                data = data[:room]
            self.pending_bytes -= len(data)
            http2.send_data(call.id, data)
        if self.blocked:
            self.blocked.pop(call.id, None)
        if call.trailers is not None:
            if http2.is_open(call.id):
                http2.send_headers(call.id, call.trailers, end_stream=True)
                if not call.remote_closed:   # stop the client sending more of a call that is over
                    http2.reset(call.id, NO_ERROR)
            self._forget(call)

    def _finish(self, call: _Call, code: int, message: str) -> None:
        if call.done:
            return
        call.done = True
        if call.stream is not None:   # its later answers are dropped before they are encoded
            call.stream.over = True
        if code == OK and not message and call.headers_sent:
            call.trailers = _OK_BLOCK
        else:
            call.trailers = _trailers(code, message, call.headers_sent)
            call.headers_sent = True
        self._send_pending(call)

    def _fail(self, call: _Call, failure: GrpcFailure) -> None:
        if call.cut:   # trailers now would end a message midway
            self._cancel(call)
            return
        # A failed call's data waiting for the client's window is dropped, not waited for; but
        # answers still being compressed were sent before the failure, and go first (with what
        # is ahead of them, to keep the order).
        last = max((i for i, item in enumerate(call.pending) if isinstance(item, asyncio.Future)), default=-1)
        while len(call.pending) > last + 1:
            self.pending_bytes -= _size(call.pending.pop())
        self._finish(call, failure.code, failure.message)

    def _fail_compressing(self, call: _Call, compressing: asyncio.Future[bytes], failure: GrpcFailure) -> None:
        """A message that could not be compressed: the call ends with ``failure`` in its place
        (in place of its OK trailers too, when its end was already decided)."""
        while call.pending and call.pending[-1] is not compressing:
            self.pending_bytes -= _size(call.pending.pop())
        call.pending.pop()
        if not call.done:
            self._fail(call, failure)
        else:   # what is ahead of it ends with whole messages: a message being compressed is never cut
            if call.trailers is _OK_BLOCK:   # a failure decided earlier keeps its own status
                call.trailers = _trailers(failure.code, failure.message, headers_sent=True)
            self._send_pending(call)

    def _drop_pending(self, call: _Call) -> None:
        if call.pending:
            self.pending_bytes -= sum(map(_size, call.pending))
            _drop(call.pending)

    def _cancel(self, call: _Call) -> None:
        """End a call whose message is partly sent: its stream is reset (CANCEL) and forgotten."""
        self.http2.reset(call.id, CANCEL)
        self._forget(call)
        self._flush_soon()

    def _forget(self, call: _Call) -> None:
        call.done = True
        if call.stream is not None:
            call.stream.over = True
        self._drop_pending(call)
        _drop(call.preparing)
        self.blocked.pop(call.id, None)
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None and not call.task.done() and call.task is not asyncio.current_task():
            call.task.cancel()
        self.calls.pop(call.id, None)
        if self._closing_when_idle() and not self.calls:
            self._flush_soon()
        if self.holding and not self.recheck_scheduled:   # its unread answers gone (reset, deadline): room, maybe
            self.recheck_scheduled = True
            self.loop.call_soon(self._recheck)

    def _flush_soon(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.sends.before_sending(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.closed:
            return
        segments = self.http2.data_to_send()
        if segments:
            self.sends.writelines(self.transport, self.fd, segments)
        if self._closing_when_idle() and not self.calls:
            self.close()

    # -- keepalive and age (gateway/grpc_keepalive.py) -----------------------------------

    def _keepalive_ping(self) -> bool:
        """Ping the client, unless the pings sent with no data since have reached the limit."""
        limit = self.shared.keepalive.max_pings_without_data
        if self.closed or (limit and self.http2.pings_without_data >= limit):
            return False
        self.http2.ping()
        self._flush()
        return True

    def _client_pinged(self) -> None:
        if too_many_pings(self.shared.keepalive, self.http2, self.loop.time(), bool(self.calls)):
            raise ConnectionFailure(ENHANCE_YOUR_CALM, "too_many_pings")   # GOAWAY with it, then closed

    def _too_old(self) -> None:
        if not self.closed and not self.aged:
            self.aged = True
            self.http2.go_away()
            self._flush()

    def _abandon(self) -> None:
        """Keepalive found the client gone, or the age's grace ran out: close without waiting
        for what it has not read."""
        if not self.closed:
            log.debug("gRPC connection closed by %s", "its age" if self.aged else "keepalive")
            self.closed = True
            self.transport.abort()

    # -- closing -----------------------------------------------------------------------

    def _closing_when_idle(self) -> bool:
        return self.shared.draining or self.http2.going_away or self.aged

    def go_away(self) -> None:
        """Tell the client no new calls are taken here; close once those in flight are answered."""
        if not self.closed:
            self.http2.go_away()
            self._flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sends.release(self.transport)
            self.transport.close()


async def _one(handler: Callable[..., Any], request: Any, context: CallContext) -> AsyncIterator[Any]:
    """A unary RPC's coroutine as the stream of its one response."""
    yield await handler(request, context)


def _trailers(code: int, message: str, headers_sent: bool) -> bytes:
    """The header block that ends a call with ``code`` and ``message``; trailers-only (one HEADERS
    frame) when no response headers were sent."""
    trailers = [(b"grpc-status", b"%d" % code)]
    if message:
        trailers.append((b"grpc-message", percent_encoded(message)))
    if not headers_sent:
        trailers = _RESPONSE_HEADERS + trailers
    return encode_headers(trailers)


def _size(piece: memoryview | asyncio.Future) -> int:
    """Bytes a piece of ``_Call.pending`` holds (a message being compressed: counted once it is)."""
    return 0 if isinstance(piece, asyncio.Future) else len(piece)


def _drop(waiting: deque) -> None:
    """Empty a call's queue, stopping the threads' work for its futures that has not begun
    (work begun runs to its end, its result unused)."""
    for item in waiting:
        if isinstance(item, asyncio.Future):
            item.cancel()
    waiting.clear()


def _internal(call: _Call, exc: Exception) -> GrpcFailure:
    log.error("internal error in %s", call.rpc.name, exc_info=exc)
    return GrpcFailure(INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _inflated_and_read(reader: MessageReader, rpc: Rpc, data: bytes) -> Any:
    """A compressed message inflated, then read ahead too if reading it is costly (on a thread)."""
    message = reader.inflate(data)
    return rpc.read_ahead(message) if rpc.costly(message) else message


class GrpcServer:
    """The listening socket, the connections, and the graceful drain; grpc.aio's start/stop shape."""

    def __init__(self, servicer: GrpcInferenceService, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 keepalive: GrpcKeepalive = GrpcKeepalive(), compression_level: str = "none",
                 tls: ssl.SSLContext | None = None, max_held_bytes: int = MAX_HELD_BYTES,
                 sends: TurnSends | None = None) -> None:
        rpcs = {f"/{SERVICE.full_name}/{m.name}".encode(): Rpc(m.name, m.streaming, m.parse, m.serialize,
                                                               getattr(servicer, m.name), m.costly, m.read_ahead)
                for m in rpc_methods()}
        path, parse, serialize = health_check_method()
        rpcs[path.encode()] = Rpc("Check", False, parse, serialize, servicer.health.Check)
        self.shared = _Shared(servicer, rpcs, max_message_bytes, keepalive, compression_level, max_held_bytes)
        self.shared.sends = sends   # None: each connection writes at once (set in start)
        self.shared.tls = tls is not None
        self._sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tls = tls   # the server's TLS context (None: plain HTTP/2)

    def bind(self, address: str, port: int, reuse_port: bool = False) -> int:
        self._sock = sock = bound_socket("GRPC", address, port, reuse_port)
        sock.listen(2048)
        sock.setblocking(False)
        return sock.getsockname()[1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None, "bind() comes first"   # as bind_grpc_tritium does
        if self.shared.sends is None:
            self.shared.sends = TurnSends(loop, None)
        self._server = await loop.create_server(lambda: GrpcConnection(self.shared, loop), sock=self._sock,
                                                backlog=2048,
                                                ssl=self._tls)

    def stop(self, grace_s: float) -> asyncio.Task:
        """Begin the drain now (GOAWAY on every connection); the task ends when it is done."""
        self.shared.draining = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.shared.open):
            connection.go_away()
        return asyncio.ensure_future(self._drained(grace_s))

    async def _drained(self, grace_s: float) -> None:
        await self.shared.close_when_drained(grace_s, "gRPC")


def bind_grpc_tritium(service: GrpcInferenceService, address: str, port: int,
                      max_message_bytes: int = MAX_MESSAGE_BYTES, reuse_port: bool = False,
                      keepalive: GrpcKeepalive = GrpcKeepalive(), tls: GrpcTls | None = None,
                      compression_level: str = "none", max_held_bytes: int = MAX_HELD_BYTES,
                      sends: TurnSends | None = None) -> tuple[GrpcServer, int]:
    """``bind_grpc``'s counterpart: a server bound to ``address:port``, to be started."""
    context = None
    if tls is not None:   # loaded now: files that cannot serve stop startup with one line, as a taken port does
        try:
            context = tls.server_context()
        except InvalidArgument as exc:
            raise PortInUse("GRPC", address, port, f"cannot serve TLS: {exc.message}") from None
    server = GrpcServer(service, max_message_bytes, keepalive, compression_level, context, max_held_bytes, sends)
    return server, server.bind(address, port, reuse_port)
