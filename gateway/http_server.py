"""HTTP/1.1 for the gateway, written directly on httptools' parser: one asyncio Protocol
per connection, no ASGI cycle, no task per request.

A request is parsed into an ``HttpRequest`` and handed to the application's ``handle``,
which answers at once (an ``HttpResponse``), later through a callback (inference: the
broker's answer arrives on the event loop and is written from there), or as a coroutine
for the rare requests that wait on several things (control requests, streams), which
gets a task. What a server owes its clients is kept: keep-alive, pipelined requests
answered in order, chunked request bodies, ``Expect: 100-continue``, a body size limit
checked before the body is read, timeouts for idle and stalled connections, a graceful
drain, and chunked server-sent events for ``generate_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol, cast
from urllib.parse import unquote

import httptools
import msgspec

from tritium.errors import TritiumError
from tritium.gateway.connections import OpenConnections
from tritium.gateway.http_codec import inference_header_length
from tritium.gateway.turn_sends import TurnSends, ring_socket

log = logging.getLogger(__name__)

KEEP_ALIVE_TIMEOUT_S = 75.0    # an idle keep-alive connection is closed after this long
STALLED_REQUEST_TIMEOUT_S = 60.0  # a request whose bytes stop arriving for this long is dropped
_SWEEP_INTERVAL_S = 5.0
MAX_PIPELINED = 32   # requests parsed ahead of their answers; past it the connection is not read
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_C_INT_MAX = 2**31 - 1   # the largest Inference-Header-Content-Length Triton parses
MAX_URL_BYTES = 65535      # the longest request target (httptools' URL parser counts in 16 bits)
MAX_HEAD_BYTES = 256 * 1024   # a request's line and header fields; past it the client is refused (431)
LINGER_S = 5.0   # after an answer that closes a connection its client may still be sending to: bytes read and dropped


class _Lingering(asyncio.Protocol):
    """A closing connection's last bytes from its client, dropped."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        # abort, not close: a close would wait for a client that reads nothing to take the answer
        self._timer = loop.call_later(LINGER_S, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False   # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()


class _Refused(Exception):
    """Raised in a parser callback: the stream is not read past this request, which is answered
    with ``status`` (None: already answered) after those before it, then the connection closes."""

    def __init__(self, status: int | None, message: str = "") -> None:
        super().__init__(message)
        self.status = status


class HttpRequest(msgspec.Struct):
    method: str
    path: str                               # percent-decoded, without the query
    headers: dict[bytes, bytes]             # lower-case names
    body: bytes = b""
    too_large: int = 0                      # the body's size when it passed the limit (not kept)
    began_ns: int = 0                       # monotonic: its first byte was parsed (trace HTTP_RECV_START)
    received_ns: int = 0                    # monotonic: its last byte was parsed (trace HTTP_RECV_END)
    header_lines: list[tuple[bytes, bytes]] | None = None   # as sent, names' case kept: only when asked for


class HttpResponse(msgspec.Struct):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    close: bool = False                     # close the connection once this is written


class Streaming:
    """A response sent in chunks as they come (server-sent events): head, then ``chunks``."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncGenerator[bytes, None]) -> None:
        self.status, self.headers, self.chunks = status, headers, chunks


Answer = Callable[[HttpResponse | Streaming], None]


class HttpApplication(Protocol):
    """What the server hands each request to (gateway/http_api.py's HttpApp)."""

    def handle(self, request: HttpRequest, answer: Answer) -> Callable[[], None] | None:
        """Answer ``request`` through ``answer``, now or later; return what to call should the
        client leave before its answer (an inference request is then cancelled), if anything."""


def encode_head(status: int, headers: list[tuple[bytes, bytes]], length: int | None, close: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    for name, value in headers:
        lines.append(b"%s: %s\r\n" % (name, value))
    lines.append(b"content-length: %d\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n")
    if close:
        lines.append(b"connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


@dataclass
class HttpSettings:
    """The server's limits, and what it keeps of each request."""

    max_body_bytes: int
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    stalled_request_timeout_s: float = STALLED_REQUEST_TIMEOUT_S
    keep_header_lines: bool = False   # every request's headers as sent too (header forwarding reads them)


class HttpConnection(asyncio.Protocol):
    """One client connection: parse, hand each request to the app, write answers in order."""

    __slots__ = ("app", "settings", "loop", "shared", "sends", "transport", "fd", "parser", "queue", "busy", "closing",
                 "last_active", "_url", "_headers", "_body", "_body_size", "_body_limit", "_too_large", "_write_paused",
                 "_reading", "_begun", "_header_lines", "_give_up", "_streaming", "_event_source", "_unreadable",
                 "_ended", "_upgrade", "_starting", "_in_body", "_head_bytes", "_linger", "_continue_due")

    transport: asyncio.Transport   # set by connection_made, which asyncio calls before any other method

    def __init__(self, app: HttpApplication, settings: HttpSettings, loop: asyncio.AbstractEventLoop,
                 shared: OpenConnections[HttpConnection], sends: TurnSends) -> None:
        self.app, self.settings, self.loop, self.shared, self.sends = app, settings, loop, shared, sends
        self.fd: int | None = None     # the socket the turn's sends go to (None: through the transport)
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[tuple[HttpRequest, bool]] = deque()   # parsed, not yet answered (pipelining)
        self.busy = False              # a request is being answered
        self.closing = False
        self.last_active = time.monotonic()
        self._write_paused = False
        self._reading = True
        self._give_up: Callable[[], None] | None = None   # cancels the request being answered
        self._starting = False         # inside _next's loop, handing a request to the app
        self._streaming: asyncio.Task | None = None   # writing a stream of events (generate_stream)
        self._event_source = False     # the request being answered asks for a stream of events
        self._unreadable: tuple[int, str] | None = None   # what cannot be parsed, answered after what came before
        self._ended = False            # the client ended its side: no request comes after those read
        # A request asking for an upgrade (curl --http2 asks for h2c) is read as HTTP/1.1, as Triton
        # reads it: its method and keep-alive, and the bytes of its body still to come.
        self._upgrade: tuple[str, bool, int] | None = None
        self._linger = False           # closed after an answer while the client may still be sending
        self._head_bytes = 0           # of the request being read, while its head is (on_message_begin)
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_lines: list[tuple[bytes, bytes]] | None = [] if self.settings.keep_header_lines else None
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_limit = self.settings.max_body_bytes
        self._too_large = 0
        self._begun = 0
        self._in_body = False   # its header fields are read: a field now is a chunked body's trailer
        self._continue_due = False   # it waits for 100 Continue, once the requests before it are answered

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # a stream server's transports are Transports
        self.fd = ring_socket(transport) if self.sends.batching else None
        self.shared.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._leave()
        self.shared.lost(self)

    def _leave(self) -> None:
        """The client left: its request is given up (Triton documents it for a closed connection)."""
        if self.busy and self._give_up is not None:
            self._give_up()
            self._give_up = None
        if self._streaming is not None:   # now, not when the next event comes: closing its events gives it up
            self._streaming.cancel()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._upgrade is not None:
            data = self._upgrade_body(data)
        while data:
            try:
                self.parser.feed_data(data)
                if self._url:   # a request is partly read: its head is bounded, as its memory
                    self._bound_head(len(data))
                return
            except httptools.HttpParserUpgrade as upgrade:
                if self._upgrade is None:   # (CONNECT, or a chunked body: not read past)
                    self._stop_reading(400, "upgrades are not supported with CONNECT or a chunked body")
                    return
                self.parser = httptools.HttpRequestParser(self)   # the stream goes on as HTTP/1.1
                data = self._upgrade_body(data[upgrade.args[0]:])
            except httptools.HttpParserError as exc:
                refused = exc.__context__
                if not isinstance(refused, _Refused):
                    self._stop_reading(400, f"invalid HTTP request: {exc}")
                elif refused.status is not None:
                    self._stop_reading(refused.status, str(refused))
                else:   # answered (or queued) already, closing the connection: this 400 is never sent
                    self._stop_reading(400, "")
                return

    def _bound_head(self, received: int) -> None:
        if self._in_body:
            return
        if self._head_bytes < 0:   # the read it began in, which may hold the requests before it: not counted
            self._head_bytes = 0
            return
        self._head_bytes += received
        if self._head_bytes > MAX_HEAD_BYTES:
            self._stop_reading(431, f"request header fields too large: more than {MAX_HEAD_BYTES} bytes")

    def _upgrade_body(self, data: bytes) -> bytes:
        """The body of the request that asked for an upgrade, which the parser left unread; what
        comes after it. The request is complete once its body is."""
        assert self._upgrade is not None
        method, keep_alive, left = self._upgrade
        taken = min(left, len(data))
        if taken:
            self.on_body(data if taken == len(data) else data[:taken])
        if taken < left:
            self._upgrade = (method, keep_alive, left - taken)
            return b""
        self._upgrade = None
        self._complete(method, keep_alive)
        return data[taken:]

    def _stop_reading(self, status: int, message: str) -> None:
        """Nothing past this point of the stream can be read: the requests that came before it are
        answered first (as Triton answers them), then the error, then the connection closes."""
        if not self.busy and not self.queue:
            self._fail(status, message)
            return
        self._unreadable = (status, message)
        self._read_when_it_can_keep_up()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._read_when_it_can_keep_up()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._read_when_it_can_keep_up()

    def _read_when_it_can_keep_up(self) -> None:
        """A client that does not read its answers, or pipelines past MAX_PIPELINED requests,
        stops being read from until it catches up: what the connection holds stays bounded."""
        reading = not self._write_paused and len(self.queue) < MAX_PIPELINED and self._unreadable is None
        if reading != self._reading and not self.closing:
            self._reading = reading
            (self.transport.resume_reading if reading else self.transport.pause_reading)()

    def eof_received(self) -> bool:
        # Keep writing what was asked before the client's FIN; but a client that ends its side
        # while a stream of events is asked of it has left (an event source never half-closes to
        # wait for the rest): its request is given up now, whatever is still buffered for it.
        if self.busy and self._event_source and not self.queue:
            self._leave()
            self.close()
            return False
        self._ended = True   # closed once what was asked before is answered
        if self.busy or self.queue:
            return True
        self.sends.release(self.transport)   # the loop closes the transport now: what it answered goes first
        return False

    # -- parser callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begun = time.monotonic_ns()   # a traced request's HTTP_RECV_START
        self._head_bytes = -1   # bytes read while its line and header fields are incomplete (_bound_head)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_URL_BYTES:
            raise _Refused(414, f"request URL too long: more than {MAX_URL_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:   # a trailer: never a header (RFC 9110 6.5.1), as Triton ignores them
            return
        self._headers[name.lower()] = value
        if self._header_lines is not None:
            self._header_lines.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_body = True
        declared = self._headers.get(b"content-length")
        size = int(declared) if declared is not None and declared.isdigit() else None
        # A body within the limit needs no more look (its JSON header is within it too).
        json_length = None if size is not None and size <= self._body_limit else self._json_length_of_binary_infer()
        if json_length is not None:
            # The limit is the JSON header's: the binary tensor data after it is bounded only by
            # what Triton parses as a Content-Length (--http-max-input-size bounds JSON, not
            # binary inputs, in Triton).
            self._body_limit = _C_INT_MAX
            if json_length > self.settings.max_body_bytes:
                self._too_large = json_length
        if not self._too_large and size is not None and size > self._body_limit:
            self._too_large = size
        if self._headers.get(b"expect", b"").lower() == b"100-continue":
            if not self._too_large:
                if self.busy or self.queue:   # a 1xx belongs to the oldest request unanswered: theirs go first
                    self._continue_due = True
                else:
                    self.sends.write(self.transport, self.fd, _CONTINUE)
                return
            # A client waiting to send a body over the limit is refused now, not after it gives up
            # waiting and sends it all (RFC 9110 10.1.1); the body is not read on this connection.
            self._linger = True
            self._complete(self.parser.get_method().decode(), False)
            raise _Refused(None)

    def _json_length_of_binary_infer(self) -> int | None:
        """The JSON header's length of an inference request with binary data after it (0 for a raw
        body, ``Inference-Header-Content-Length: 0``, all binary input); None for any other request
        (a length past the body is refused by the request's decoder)."""
        text = self._headers.get(b"inference-header-content-length")
        if text is None or not self._url.split(b"?", 1)[0].endswith(b"/infer"):
            return None
        try:
            length = inference_header_length(text)   # as the request's decoder will read it
        except TritiumError:
            return None
        declared = self._headers.get(b"content-length")
        if length < 0 or (declared is not None and declared.isdigit() and length > int(declared)):
            return None
        return length

    def on_body(self, chunk: bytes) -> None:
        if self._too_large:
            return
        self._body_size += len(chunk)
        if self._body_size > self._body_limit:
            self._too_large, self._body = self._body_size, []
            return
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        parser = self.parser
        if parser.should_upgrade():   # its body, which the parser leaves unread, is read by data_received
            method = parser.get_method().decode()
            if method != "CONNECT" and b"transfer-encoding" not in self._headers:
                httptools.parse_url(self._url)   # a URL it cannot take fails here, the parser's error (a 400)
                length = self._headers.get(b"content-length", b"0")
                self._upgrade = (method, parser.should_keep_alive(), int(length))
            return
        self._complete(parser.get_method().decode(), parser.should_keep_alive())

    def _complete(self, method: str, keep_alive: bool) -> None:
        url = httptools.parse_url(self._url)
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = HttpRequest(method, unquote(url.path.decode("latin-1")), self._headers, body, self._too_large,
                              self._begun, time.monotonic_ns(), self._header_lines)
        self._reset()
        self.queue.append((request, keep_alive))
        if not self.busy:
            self._next()
        if len(self.queue) >= MAX_PIPELINED:
            self._read_when_it_can_keep_up()

    # -- answering ---------------------------------------------------------------------

    def _next(self) -> None:
        # A request answered inside handle() calls this again from _done; the loop below takes
        # the next one instead, so that each request's give-up is kept by its own iteration.
        if self._starting:
            return
        self._starting = True
        try:
            while self.queue and not self.busy and not self.closing:
                request, keep_alive = self.queue.popleft()
                self.busy = True

                def answer(response: HttpResponse | Streaming, keep_alive: bool = keep_alive) -> None:
                    self._answer(response, keep_alive)

                self._event_source = request.path.endswith("/generate_stream")
                give_up = self.app.handle(request, answer)
                if self.busy:   # not answered at once
                    self._give_up = give_up
        finally:
            self._starting = False

    def _answer(self, answer: HttpResponse | Streaming, keep_alive: bool) -> None:
        if self.closing:
            if isinstance(answer, Streaming):   # its events closed now, its request given up with them
                self.loop.create_task(answer.chunks.aclose())
            return
        if isinstance(answer, Streaming):
            self._streaming = self.loop.create_task(self._stream(answer, keep_alive))
            return
        close = answer.close or not keep_alive or self.shared.draining
        head = encode_head(answer.status, answer.headers, len(answer.body), close)
        if len(answer.body) < 65536:   # one write, one segment; a large body is not copied
            self.sends.write(self.transport, self.fd, head + answer.body)
        else:
            self.sends.writelines(self.transport, self.fd, (head, answer.body))
        self._done(close)

    async def _stream(self, answer: Streaming, keep_alive: bool) -> None:
        close = not keep_alive or self.shared.draining
        self.sends.write(self.transport, self.fd, encode_head(answer.status, answer.headers, None, close))
        try:
            async for chunk in answer.chunks:
                if self.closing:
                    return
                self.sends.write(self.transport, self.fd, b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except Exception:  # the stream's own errors are events; anything else ends the response
            log.exception("server-sent event stream failed")
            close = True
        finally:
            try:   # a stream cut short ends now (its request's trace with it), not when collected
                await answer.chunks.aclose()
            except Exception:
                log.exception("closing a server-sent event stream failed")
        if not self.closing:
            self.sends.write(self.transport, self.fd, b"0\r\n\r\n")
            self._done(close)

    def _done(self, close: bool) -> None:
        self.busy = False
        self._streaming = None
        self._event_source = False
        self._give_up = None
        self.last_active = time.monotonic()
        if close:
            self.close()
        elif self.queue:
            self._next()
            if not self._reading:
                self._read_when_it_can_keep_up()
        elif self._unreadable is not None:
            self._fail(*self._unreadable)
        elif self.shared.draining or self._ended:
            self.close()
        if self._continue_due and not self.busy and not self.queue and not self.closing:
            self._continue_due = False
            self.sends.write(self.transport, self.fd, _CONTINUE)

    def _fail(self, status: int, message: str) -> None:
        """A request that cannot be parsed: answer it and close, as the rest of the stream is unreadable."""
        if not self.busy and not self.closing:
            body = b'{"error":"%s"}' % message.replace('"', "'").encode()
            self.sends.write(self.transport, self.fd,
                             encode_head(status, [(b"content-type", b"application/json")], len(body), True) + body)
        self._linger = True
        self.close()

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.sends.release(self.transport)
        if not self._linger or self._ended or self.transport.is_closing() or not self.transport.can_write_eof():
            self.transport.close()   # (a client that ended its side sends nothing more)
            return
        # Closed with the client's bytes unread, the socket would be reset, and the reset can reach
        # the client before it has read the answer: our side ends (FIN) and what still comes is
        # read and dropped until the client ends its side, or for LINGER_S.
        self.transport.write_eof()
        self.transport.set_protocol(_Lingering(self.transport, self.loop))
        self.transport.resume_reading()
        self.connection_lost(None)   # this connection's part is over: its request given up, its place freed

    def idle_for(self, now: float) -> float:
        return now - self.last_active

    def reading_a_request(self) -> bool:
        """Part of a request has arrived and the rest has not."""
        return bool(self._url or self._headers or self._body)


class HttpServer:
    """The listening socket(s), the connections, their timeouts, and the graceful drain."""

    def __init__(self, app: HttpApplication, settings: HttpSettings, sends: TurnSends | None = None) -> None:
        self.app = app
        self.settings = settings
        self.sends = sends   # None: each write goes to its connection at once
        self.connections: OpenConnections[HttpConnection] = OpenConnections()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        sends = self.sends or TurnSends(loop, None)
        self._server = await loop.create_server(
            lambda: HttpConnection(self.app, self.settings, loop, self.connections, sends), sock=sock, backlog=2048)
        self._sweeper = loop.call_later(_SWEEP_INTERVAL_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle past keep-alive, and those whose request stopped arriving."""
        now = time.monotonic()
        for connection in list(self.connections.open):
            if connection.busy:
                continue
            idle = connection.idle_for(now)
            stalled = connection.reading_a_request()
            if idle > (self.settings.stalled_request_timeout_s if stalled else self.settings.keep_alive_timeout_s):
                connection.close()
        self._sweeper = asyncio.get_running_loop().call_later(_SWEEP_INTERVAL_S, self._sweep)

    @property
    def in_flight(self) -> int:
        return sum(1 for c in self.connections.open if c.busy or c.queue)

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting; finish the requests in flight (within ``timeout_s``); close everything."""
        self.connections.draining = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections.open):
            if not connection.busy and not connection.queue:
                connection.close()
        await self.connections.close_when_drained(timeout_s, "HTTP")
        if self._sweeper is not None:
            self._sweeper.cancel()
