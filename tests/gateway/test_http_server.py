"""The gateway's HTTP/1.1 server, driven through a real socket with a scripted application:
keep-alive, pipelining, chunked bodies, Expect: 100-continue, the body limit, timeouts, drain."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time

import pytest

from tritium.gateway import http_server
from tritium.gateway.http_server import (MAX_HEAD_BYTES, MAX_URL_BYTES, HttpRequest, HttpResponse, HttpServer,
                                         HttpSettings, Streaming)


class ScriptedApp:
    """Echoes what it was asked; ``/slow`` answers after a delay, ``/later`` from a callback,
    ``/stream`` in three chunks."""

    def __init__(self) -> None:
        self.seen: list[HttpRequest] = []
        self.given_up: list[str] = []   # paths of requests whose client left before their answer

    def handle(self, request: HttpRequest, answer):
        self.seen.append(request)
        loop = asyncio.get_running_loop()
        body = b"%s %s %d" % (request.method.encode(), request.path.encode(), len(request.body))
        if request.too_large:
            answer(HttpResponse(400, [(b"content-type", b"text/plain")], b"too large %d" % request.too_large))
        elif request.path == "/slow":
            loop.call_later(0.3, answer, HttpResponse(200, [], body))
            return lambda: self.given_up.append(request.path)
        elif request.path == "/huge":
            answer(HttpResponse(200, [], bytes(HUGE)))
        elif request.path == "/stream":
            answer(Streaming(200, [(b"content-type", b"text/event-stream")], _chunks()))
        else:
            loop.call_soon(answer, HttpResponse(200, [(b"content-type", b"text/plain")], body))
        return None


async def _chunks():
    for index in range(3):
        await asyncio.sleep(0.01)
        yield b"data: %d\n\n" % index


HUGE = 8 << 20   # an answer the kernel's buffers cannot take at once


class Running:
    def __init__(self, limits: HttpSettings) -> None:
        self.app = ScriptedApp()
        self.loop = asyncio.new_event_loop()
        self.server = HttpServer(self.app, limits)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(sock), self.loop).result(5)

    def drain(self, timeout_s: float) -> None:
        asyncio.run_coroutine_threadsafe(self.server.drain(timeout_s), self.loop).result(timeout_s + 5)

    def connect(self) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return client

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def running():
    server = Running(HttpSettings(max_body_bytes=1000, keep_alive_timeout_s=0.5, stalled_request_timeout_s=0.5))
    yield server
    server.stop()


def read_responses(client: socket.socket, count: int) -> list[tuple[int, dict, bytes]]:
    """Read ``count`` responses (content-length or chunked) from a raw socket."""
    data = b""
    responses = []
    while len(responses) < count:
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            assert chunk, f"connection closed after {len(responses)} responses: {data!r}"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
        if status == 100:
            continue
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            while len(data) < length:
                data += client.recv(65536)
            body, data = data[:length], data[length:]
        else:
            body = b""
            while True:
                while b"\r\n" not in data:
                    data += client.recv(65536)
                size_line, data = data.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(data) < size + 2:
                    data += client.recv(65536)
                body, data = body + data[:size], data[size + 2:]
                if size == 0:
                    break
        responses.append((status, headers, body))
    return responses


def test_keep_alive_serves_several_requests_on_one_connection(running):
    client = running.connect()
    for index in range(3):
        client.sendall(b"GET /v2/%d HTTP/1.1\r\nHost: x\r\n\r\n" % index)
        ((status, headers, body),) = read_responses(client, 1)
        assert (status, body) == (200, b"GET /v2/%d 0" % index)
        assert headers[b"content-length"] == str(len(body)).encode()
        assert b"connection" not in headers


def test_pipelined_requests_are_answered_in_order(running):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    responses = read_responses(client, 3)
    assert [body for _, _, body in responses] == [b"GET /slow 0", b"GET /a 0", b"POST /b 3"]


def test_a_chunked_body_is_joined(running):
    client = running.connect()
    client.sendall(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    ((status, _, body),) = read_responses(client, 1)
    assert (status, body) == (200, b"POST /c 5")
    assert running.app.seen[-1].body == b"abcde"


def test_expect_100_continue_is_answered_before_the_body(running):
    client = running.connect()
    client.sendall(b"POST /e HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert client.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    client.sendall(b"wxyz")
    ((status, _, body),) = read_responses(client, 1)
    assert (status, body) == (200, b"POST /e 4")


def test_a_pipelined_expectation_gets_its_continue_after_the_answers_before_it(running):
    """A 1xx answers the oldest request not yet answered: sent at once, the 100 would read as the
    slow request's interim answer."""
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nPOST /e HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    seen = b""
    while b"100 Continue" not in seen:
        chunk = client.recv(1000)
        assert chunk, seen
        seen += chunk
    assert seen.startswith(b"HTTP/1.1 200 OK") and seen.endswith(b"GET /slow 0HTTP/1.1 100 Continue\r\n\r\n")
    client.sendall(b"wxyz")
    ((status, _, body),) = read_responses(client, 1)
    assert (status, body) == (200, b"POST /e 4")


def test_a_declared_body_over_the_limit_is_refused_at_once_and_the_connection_closed(running):
    """A client waiting for 100 Continue gets the final answer instead, without sending its body
    (RFC 9110 10.1.1): the body never comes, so the connection closes after the answer."""
    client = running.connect()
    client.sendall(b"POST /big HTTP/1.1\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    ((status, headers, body),) = read_responses(client, 1)
    assert (status, body, headers[b"connection"]) == (400, b"too large 5000", b"close")
    assert running.app.seen[-1].body == b""   # never kept
    assert client.recv(10) == b""


def test_a_client_sending_its_body_after_a_refusal_is_not_reset(running):
    """The connection ends with our FIN and reads what still comes: a close with the client's bytes
    unread would reset the connection, and a reset can overtake the answer on its way."""
    client = running.connect()
    client.sendall(b"POST /big HTTP/1.1\r\nContent-Length: 500000\r\nExpect: 100-continue\r\n\r\n")
    ((status, headers, _),) = read_responses(client, 1)
    assert (status, headers[b"connection"]) == (400, b"close")
    for _ in range(10):   # a client that did not wait for the answer: its body still comes
        client.sendall(b"x" * 50000)
        time.sleep(0.02)
    assert client.recv(10) == b""   # a clean end, no reset


def test_a_lingering_connection_whose_client_reads_nothing_ends_after_the_linger(running, monkeypatch):
    """The lingering close waits for the client to end its side, not for it to read: past the
    linger the connection is dropped, its unread answer with it."""
    monkeypatch.setattr(http_server, "LINGER_S", 0.3)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", running.port))
    client.sendall(b"GET /huge HTTP/1.1\r\n\r\nNOT HTTP\r\n\r\n")   # an answer it does not read, then garbage
    time.sleep(1.5)
    client.settimeout(5)
    received = 0
    with contextlib.suppress(ConnectionResetError):
        while chunk := client.recv(1 << 20):
            received += len(chunk)
    assert received < HUGE   # what the kernel held reached it; what waited in the gateway did not


def test_a_refused_expectation_is_answered_after_the_requests_before_it(running):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nPOST /big HTTP/1.1\r\nContent-Length: 5000\r\n"
                   b"Expect: 100-continue\r\n\r\n")
    (first, second) = read_responses(client, 2)
    assert (first[0], first[2]) == (200, b"GET /slow 0")
    assert (second[0], second[2], second[1][b"connection"]) == (400, b"too large 5000", b"close")
    assert client.recv(10) == b""


def test_a_declared_body_over_the_limit_sent_without_expectation_is_read_and_refused(running):
    client = running.connect()
    client.sendall(b"POST /big HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000 + b"GET /a HTTP/1.1\r\n\r\n")
    (refused, after) = read_responses(client, 2)
    assert (refused[0], refused[2], after[2]) == (400, b"too large 5000", b"GET /a 0")   # the connection goes on


def test_a_chunked_bodys_trailer_fields_are_not_headers(running):
    """A trailer must not pass for a header (RFC 9110 6.5.1): a proxy checks the header section
    only, and an API restricted to a header would open to a trailer. Triton ignores them too."""
    client = running.connect()
    client.sendall(b"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAdmin-Key: wrong\r\n\r\n"
                   b"2\r\n{}\r\n0\r\nAdmin-Key: secret\r\nX-Other: 1\r\n\r\nGET /next HTTP/1.1\r\nX-Next: 2\r\n\r\n")
    assert [body for _, _, body in read_responses(client, 2)] == [b"POST /t 2", b"GET /next 0"]
    trailed, following = running.app.seen[-2:]
    assert trailed.headers[b"admin-key"] == b"wrong" and b"x-other" not in trailed.headers
    assert following.headers[b"x-next"] == b"2"   # the next request's header fields are read again


@pytest.mark.parametrize("pieces", [1, 8])
def test_a_request_whose_header_fields_pass_the_bound_gets_a_431_and_the_connection_closes(running, pieces):
    """Bounded while they arrive, sent at once or in pieces: the memory one client can hold."""
    client = running.connect()
    head = b"GET /big HTTP/1.1\r\n" + b"".join(
        b"X-Field-%d: %s\r\n" % (index, b"v" * 1000) for index in range(2 * MAX_HEAD_BYTES // 1000 + 10))
    step = -(-len(head) // pieces)
    try:
        for start in range(0, len(head), step):
            client.sendall(head[start:start + step])
            time.sleep(0.01)
    except ConnectionError:   # refused before all of it was sent
        pass
    ((status, headers, body),) = read_responses(client, 1)
    assert (status, headers[b"connection"]) == (431, b"close")
    assert body == b'{"error":"request header fields too large: more than %d bytes"}' % MAX_HEAD_BYTES
    assert running.app.seen == []
    other = running.connect()   # the server goes on, and a head within the bound is read
    other.sendall(b"GET /fine HTTP/1.1\r\nX-Big: " + b"v" * (MAX_HEAD_BYTES // 2) + b"\r\n\r\n")
    assert read_responses(other, 1)[0][2] == b"GET /fine 0"


def test_a_request_url_past_the_bound_gets_a_414_after_the_requests_before_it(running):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nGET /" + b"u" * MAX_URL_BYTES + b" HTTP/1.1\r\n\r\n")
    (first, refused) = read_responses(client, 2)
    assert first[2] == b"GET /slow 0"
    assert (refused[0], refused[1][b"connection"]) == (414, b"close")
    assert refused[2] == b'{"error":"request URL too long: more than %d bytes"}' % MAX_URL_BYTES
    assert client.recv(10) == b""
    other = running.connect()
    other.sendall(b"GET /" + b"u" * (MAX_URL_BYTES - 1) + b" HTTP/1.1\r\n\r\n")   # at the bound: served
    assert read_responses(other, 1)[0][2] == b"GET /" + b"u" * (MAX_URL_BYTES - 1) + b" 0"


def test_a_chunked_body_over_the_limit_is_not_kept(running):
    client = running.connect()
    chunk = b"%x\r\n%s\r\n" % (600, b"y" * 600)
    client.sendall(b"POST /big HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2 + b"0\r\n\r\n")
    ((status, _, body),) = read_responses(client, 1)
    assert (status, body) == (400, b"too large 1200")


def test_the_limit_bounds_the_json_header_of_a_binary_request_not_its_binary_data(running):
    """As in Triton, --http-max-input-size bounds the JSON; binary tensor data after it has no limit."""
    client = running.connect()

    def send(path: bytes, json_length: int, body: int) -> None:
        client.sendall(b"POST %s HTTP/1.1\r\nContent-Length: %d\r\nInference-Header-Content-Length: %d\r\n\r\n"
                       % (path, body, json_length) + b"b" * body)

    send(b"/v2/models/m/infer", 20, 5020)
    send(b"/v2/models/m/infer", 1200, 5020)     # its JSON is over the limit
    send(b"/v2/models/m/infer", 0, 5020)        # a raw body: all binary input, not bounded either
    send(b"/v2/models/m/generate", 20, 5020)    # binary data only for inference
    kept, json_too_large, raw, generate_too_large = read_responses(client, 4)
    assert [(status, body) for status, _, body in (kept, raw)] == [(200, b"POST /v2/models/m/infer 5020")] * 2
    assert [(status, body) for status, _, body in (json_too_large, generate_too_large)] == [
        (400, b"too large 1200"), (400, b"too large 5020")]


def test_percent_escapes_in_the_path_are_decoded_and_the_query_dropped(running):
    client = running.connect()
    client.sendall(b"GET /v2/models/a%20b/ready?x=1 HTTP/1.1\r\n\r\n")
    ((_, _, body),) = read_responses(client, 1)
    assert body == b"GET /v2/models/a b/ready 0"


def test_http_1_0_closes_after_the_answer(running):
    client = running.connect()
    client.sendall(b"GET /old HTTP/1.0\r\n\r\n")
    ((status, headers, body),) = read_responses(client, 1)
    assert (status, headers[b"connection"], body) == (200, b"close", b"GET /old 0")
    assert client.recv(10) == b""


def test_garbage_gets_a_400_and_the_connection_closes(running):
    client = running.connect()
    client.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    ((status, headers, body),) = read_responses(client, 1)
    assert status == 400 and headers[b"connection"] == b"close" and b"invalid HTTP request" in body
    assert client.recv(10) == b""
    other = running.connect()   # and the server goes on
    other.sendall(b"GET /fine HTTP/1.1\r\n\r\n")
    assert read_responses(other, 1)[0][2] == b"GET /fine 0"


def test_requests_before_unreadable_bytes_are_answered_then_the_400(running):
    """As Triton answers them: what came before the point the stream cannot be read past is answered
    (one request still being answered, one waiting behind it), then the error, then the close."""
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcnot http\r\n\r\n")
    responses = read_responses(client, 3)
    assert [(status, body) for status, _, body in responses[:2]] == [(200, b"GET /slow 0"), (200, b"POST /b 3")]
    status, headers, body = responses[2]
    assert (status, headers[b"connection"]) == (400, b"close") and b"invalid HTTP request" in body
    assert client.recv(10) == b""
    assert running.app.given_up == []


UPGRADE = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


def test_a_request_asking_for_an_upgrade_is_served_as_http_1_1_with_its_body(running):
    """As Triton serves what curl --http2 sends to an http:// URL: the upgrade is not taken."""
    client = running.connect()
    client.sendall(b"POST /up HTTP/1.1\r\n" + UPGRADE + b"Content-Length: 13\r\n\r\n{\"con")
    time.sleep(0.05)   # the body in two reads, a request pipelined behind it
    client.sendall(b"fig\": 1}GET /after HTTP/1.1\r\n\r\n")
    responses = read_responses(client, 2)
    assert [(status, body) for status, _, body in responses] == [(200, b"POST /up 13"), (200, b"GET /after 0")]
    assert running.app.seen[0].body == b'{"config": 1}'
    bodiless = running.connect()
    bodiless.sendall(b"GET /up HTTP/1.1\r\n" + UPGRADE + b"\r\nGET /next HTTP/1.1\r\n\r\n")
    assert [body for _, _, body in read_responses(bodiless, 2)] == [b"GET /up 0", b"GET /next 0"]


@pytest.mark.parametrize("request_text", [
    b"POST /up HTTP/1.1\r\n" + UPGRADE + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n",
], ids=["chunked", "connect"])
def test_a_request_asking_for_an_upgrade_with_a_chunked_body_or_connect_is_refused(running, request_text):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\n" + request_text)
    (first, _, _), (status, _, body) = read_responses(client, 2)
    assert (first, status) == (200, 400) and b"upgrades are not supported with CONNECT or a chunked body" in body
    assert client.recv(10) == b""
    assert [request.path for request in running.app.seen] == ["/slow"] and running.app.given_up == []


def test_a_request_asking_for_an_upgrade_with_a_url_that_cannot_be_read_gets_a_400_after_those_before(running):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nGET http://a:99999/x HTTP/1.1\r\n" + UPGRADE + b"\r\n")
    (first, _, _), (status, _, body) = read_responses(client, 2)
    assert (first, status) == (200, 400) and b"invalid HTTP request" in body
    assert client.recv(10) == b""


def test_a_connection_its_client_ended_closes_once_its_requests_are_answered(running):
    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\n")
    client.shutdown(socket.SHUT_WR)
    assert [body for _, _, body in read_responses(client, 2)] == [b"GET /slow 0", b"GET /a 0"]
    client.settimeout(0.3)   # (the keep-alive timeout is 0.5 s: closed before it)
    assert client.recv(10) == b""


def test_server_sent_events_are_sent_in_chunks(running):
    client = running.connect()
    client.sendall(b"POST /stream HTTP/1.1\r\n\r\n")
    ((status, headers, body),) = read_responses(client, 1)
    assert (status, headers[b"transfer-encoding"]) == (200, b"chunked")
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


def test_idle_and_stalled_connections_are_closed(running):
    idle, stalled = running.connect(), running.connect()
    stalled.sendall(b"POST /never HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    time.sleep(0.7)
    running.loop.call_soon_threadsafe(running.server._sweep)   # the sweep runs every few seconds; now
    time.sleep(0.2)
    assert idle.recv(10) == b"" and stalled.recv(10) == b""


def test_drain_finishes_the_request_in_flight_and_closes_idle_connections(running):
    busy, idle = running.connect(), running.connect()
    busy.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    time.sleep(0.05)
    started = time.monotonic()
    running.drain(5)
    assert time.monotonic() - started < 2
    ((status, headers, body),) = read_responses(busy, 1)
    assert (status, headers[b"connection"], body) == (200, b"close", b"GET /slow 0")
    assert idle.recv(10) == b""
    with pytest.raises(ConnectionRefusedError):   # no longer accepting
        running.connect()


def test_a_client_that_pipelines_without_end_is_read_again_once_answered(running):
    """Past MAX_PIPELINED parsed requests the connection is not read; it must be read again as
    answers leave, or the later requests (sent after a pause) would never be answered."""
    import tritium.gateway.http_server as module

    client = running.connect()
    client.sendall(b"GET /slow HTTP/1.1\r\n\r\n" + b"GET /p HTTP/1.1\r\n\r\n" * (2 * module.MAX_PIPELINED))
    for _ in range(3):
        time.sleep(0.05)
        client.sendall(b"GET /q HTTP/1.1\r\n\r\n" * module.MAX_PIPELINED)
    count = 2 * module.MAX_PIPELINED + 3 * module.MAX_PIPELINED
    bodies = [body for _, _, body in read_responses(client, count + 1)]
    assert bodies == [b"GET /slow 0"] + [b"GET /p 0"] * (2 * module.MAX_PIPELINED) + \
        [b"GET /q 0"] * (3 * module.MAX_PIPELINED)


def test_a_client_that_resets_its_connection_before_the_answer_gives_its_request_up(running):
    reset = running.connect()
    reset.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    time.sleep(0.05)
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()   # RST
    answered = running.connect()
    answered.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    assert read_responses(answered, 1)[0][2] == b"GET /slow 0"
    half_closed = running.connect()   # a FIN after the request: still answered, nothing given up
    half_closed.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    half_closed.shutdown(socket.SHUT_WR)
    assert read_responses(half_closed, 1)[0][2] == b"GET /slow 0"
    assert running.app.given_up == ["/slow"]


# -- reads of chosen sizes: where one request's bytes end and the next one's begin ---------------

class _Recorded(asyncio.Transport):
    """What the connection writes, as a socket would take it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data) -> None:
        self.written += data

    def writelines(self, pieces) -> None:
        for piece in pieces:
            self.written += piece

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_the_read_a_request_begins_in_does_not_count_against_its_head():
    """A read may hold a large body of the request before; the next request's head is counted
    from the read after, so a head well within the bound is served however the reads fall."""
    from tritium.gateway.connections import OpenConnections
    from tritium.gateway.http_server import HttpConnection
    from tritium.gateway.turn_sends import TurnSends

    async def served() -> tuple[list, bytes]:
        loop = asyncio.get_running_loop()
        app = ScriptedApp()
        connection = HttpConnection(app, HttpSettings(max_body_bytes=300_000), loop, OpenConnections(),
                                    TurnSends(loop, None))
        transport = _Recorded()
        connection.connection_made(transport)
        body = b"x" * (MAX_HEAD_BYTES - 100)
        stream = b"POST /a HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        stream += b"GET /b HTTP/1.1\r\nAuthorization: Bearer " + b"t" * 12000 + b"\r\n\r\n"
        first = MAX_HEAD_BYTES - 20   # the body, then the first bytes of the next request's line
        for start, end in ((0, first), (first, first + 4000), (first + 4000, first + 8000), (first + 8000, None)):
            connection.data_received(stream[start:end])
        await asyncio.sleep(0.05)
        return [(request.method, request.path) for request in app.seen], bytes(transport.written)

    seen, written = asyncio.run(served())
    assert seen == [("POST", "/a"), ("GET", "/b")]
    assert written.count(b"HTTP/1.1 200 OK") == 2 and b"431" not in written
