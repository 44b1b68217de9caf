"""The HTTP front end whole, in-process: HttpServer + HttpApp + DataPlane + BrokerLink on one
event loop, a real TCP port, and a scripted broker behind them.

The client speaks raw HTTP/1.1 over a real connection; the scripted broker answers each
INFER at once (Y = 2X), holds it, or answers with an error record, as the test says, so
that keep-alive, pipelining, error mapping and a broker lost mid-request are asserted
on the bytes a client gets.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import threading
from collections.abc import Callable

import numpy as np
import pytest
import uvloop

from tritium.gateway import broker_link
from tritium.gateway.dataplane import DataPlane
from tritium.gateway.http_api import HttpApp
from tritium.gateway.http_server import HttpSettings, HttpServer
from tritium.gateway.send_ring import SendRing
from tritium.gateway.turn_sends import TurnSends
from tests.scripted_peers import Received, ScriptedBroker, attached_gateway_link
from tritium.errors import ErrorCode, InvalidArgument
from tritium.protocol import Kind, ModelRow, Models, Response, VersionRow, encode, error_record

HEARTBEAT_S = 0.1
CONFIG = {"name": "m", "backend": "python", "max_batch_size": 8,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}
STREAMING = dict(CONFIG, name="d", max_batch_size=0, model_transaction_policy={"decoupled": True},
                 input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
                 output=[{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}])
TABLE = Models(1, tuple(ModelRow(name, None, (VersionRow(1, "READY", "", True),), config, None)
                        for name, config in (("m", CONFIG), ("d", STREAMING))), True, ())
_names = itertools.count()


def doubled(request: Received) -> bytes:
    """The broker's answer to an INFER of model m: Y = 2 X."""
    x = np.frombuffer(request.record[-16:], np.float32)
    return Response(request.header["rid"], [["Y", "FP32", [1, 4], 16, False]]).encode(
        [(x * 2).astype(np.float32).tobytes()])


def counted(request: Received, count: int = 3, error_at: int | None = None) -> list[bytes]:
    """A decoupled model's answers to an INFER of model d, one message each: Y = X * i for
    i in 1..count (the answer ``error_at`` an error instead), then an empty final response."""
    x = np.frombuffer(request.record[-4:], np.float32)
    rid = request.header["rid"]
    answers = [error_record(rid, InvalidArgument(f"no {i} today"))
               if i == error_at else
               Response(rid, [["Y", "FP32", [1], 4, False]], final=False).encode([(x * i).astype(np.float32).tobytes()])
               for i in range(1, count + 1)]
    return [*answers, Response(rid, final=True, empty=True).encode()]


def scripted_answer(request: Received) -> bytes | list[bytes]:
    """What the broker answers by default: model m doubles, model d streams."""
    return counted(request) if request.header["m"] == "d" else doubled(request)


class Front:
    """The gateway's HTTP side on a loop of its own; ``answer`` decides the broker's reply to
    each INFER: a record, several (each a message of its own), or None to hold it in ``held``."""

    def __init__(self, max_body_bytes: int = 1 << 20, ring: SendRing | None = None) -> None:
        self.max_body_bytes = max_body_bytes
        # With a ring, the gateway's own loop (uvloop), whose transports the ring writes behind.
        self.loop = uvloop.new_event_loop() if ring is not None else asyncio.new_event_loop()
        self.ring = ring   # a ring: each turn's answers in one system call
        self.broker = ScriptedBroker(f"inproc://http-front-{next(_names)}")
        self.answer: Callable[[Received], bytes | list[bytes] | None] = scripted_answer
        self.held: list[Received] = []
        self.infers: list[Received] = []
        self.cancels: list[Received] = []
        self.link, self.server, self.port = self.loop.run_until_complete(self._start())
        self._pumping = self.loop.create_task(self._pump())

    async def _start(self):
        link = await attached_gateway_link(self.broker, TABLE, HEARTBEAT_S)
        self.sends = TurnSends(self.loop, self.ring, more_coming=lambda: link.waiting > 0)
        server = HttpServer(HttpApp(DataPlane(link), max_body_bytes=self.max_body_bytes),
                            HttpSettings(max_body_bytes=self.max_body_bytes), self.sends)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        await server.start(sock)
        return link, server, sock.getsockname()[1]

    async def _pump(self) -> None:
        while True:
            for record in self.broker.pump():
                if record.kind == Kind.CANCEL:
                    self.cancels.append(record)
                if record.kind != Kind.INFER:
                    continue
                self.infers.append(record)
                reply = self.answer(record)
                if reply is None:
                    self.held.append(record)
                for message in [reply] if isinstance(reply, bytes) else reply or ():
                    self.broker.send(record.peer, message)
            await asyncio.sleep(0.002)

    async def until(self, condition, timeout_s: float = 5.0) -> None:
        async def wait():
            while not condition():
                await asyncio.sleep(0.002)
        await asyncio.wait_for(wait(), timeout_s)

    def run(self, coroutine, timeout_s: float = 10.0):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))

    def close(self) -> None:
        self._pumping.cancel()
        self.loop.run_until_complete(self.server.drain(1))
        self.link.close()
        self.broker.close()
        self.loop.close()


@pytest.fixture
def front():
    front = Front()
    yield front
    front.close()


def infer_request(values: list[float], request_id: str = "", close: bool = False) -> bytes:
    document = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": values}]}
    if request_id:
        document["id"] = request_id
    body = json.dumps(document).encode()
    return (b"POST /v2/models/m/infer HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n%s" % (len(body), b"connection: close\r\n" if close else b"", body))


def get_request(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % path.encode()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def read_chunked(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], list[bytes]]:
    """A response with chunked transfer encoding: (status, headers, its chunks)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines)}
    assert headers.get("transfer-encoding") == "chunked", headers
    chunks = []
    while size := int(await reader.readuntil(b"\r\n"), 16):
        chunks.append((await reader.readexactly(size + 2))[:-2])
    assert await reader.readexactly(2) == b"\r\n"
    return int(status_line.split()[1]), headers, chunks


def generate_stream_request(value: float, action: bytes = b"generate_stream") -> bytes:
    body = json.dumps({"X": value, "id": "g-1"}).encode()
    return (b"POST /v2/models/d/%s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s"
            % (action, len(body), body))


def events(chunks: list[bytes]) -> list[dict]:
    """The server-sent events' JSON documents, in order."""
    text = b"".join(chunks).decode()
    assert text.endswith("\n\n"), text
    return [json.loads(event.removeprefix("data: ")) for event in text[:-2].split("\n\n")]


def outputs(response: tuple[int, dict, bytes]) -> list[float]:
    status, _, body = response
    assert status == 200, body
    return json.loads(body)["outputs"][0]["data"]


def error_of(response: tuple[int, dict, bytes]) -> tuple[int, str]:
    status, _, body = response
    return status, json.loads(body)["error"]


def test_a_keep_alive_connection_serves_request_after_request_until_the_client_asks_to_close(front):
    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        answers = []
        for values, close in (([1, 2, 3, 4], False), ([5, 6, 7, 8], False), ([0, 0, 0, 1], True)):
            writer.write(infer_request(values, close=close))
            answers.append(await read_response(reader))
        closed = await asyncio.wait_for(reader.read(), 2)   # the server closes after the last one
        writer.close()
        return answers, closed

    answers, closed = front.run(scenario())
    assert [outputs(a) for a in answers] == [[2, 4, 6, 8], [10, 12, 14, 16], [0, 0, 0, 2]]
    assert ["connection" in a[1] for a in answers] == [False, False, True] and answers[2][1]["connection"] == "close"
    assert closed == b""


def test_pipelined_requests_are_answered_in_order_one_inference_at_a_time(front):
    front.answer = lambda request: None   # the broker holds every request until the test answers it

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 1, 1, 1]) + get_request("/v2/models/m") + infer_request([3, 3, 3, 3]))
        await front.until(lambda: front.held)
        await asyncio.sleep(0.05)
        in_flight_at_once = len(front.infers)   # the next one waits for this answer
        front.broker.send(front.held[0].peer, doubled(front.held.pop(0)))
        await front.until(lambda: front.held)
        front.broker.send(front.held[0].peer, doubled(front.held.pop(0)))
        answers = [await read_response(reader) for _ in range(3)]
        writer.close()
        return in_flight_at_once, answers

    in_flight_at_once, (first, metadata, third) = front.run(scenario())
    assert in_flight_at_once == 1
    assert outputs(first) == [2.0] * 4 and outputs(third) == [6.0] * 4
    assert metadata[0] == 200 and json.loads(metadata[2])["name"] == "m"


def test_answers_the_broker_gives_in_reverse_reach_each_connection_its_own(front):
    front.answer = lambda request: None

    async def scenario():
        connections = [await asyncio.open_connection("127.0.0.1", front.port) for _ in range(3)]
        for value, (_, writer) in enumerate(connections, start=1):
            writer.write(infer_request([value] * 4))
        await front.until(lambda: len(front.held) == 3)
        for request in reversed(front.held):
            front.broker.send(request.peer, doubled(request))
        answers = [await read_response(reader) for reader, _ in connections]
        for _, writer in connections:
            writer.close()
        return answers

    assert [outputs(a) for a in front.run(scenario())] == [[2.0] * 4, [4.0] * 4, [6.0] * 4]


def test_the_answers_of_one_broker_message_leave_in_one_system_call_a_closing_ones_before_its_close(monkeypatch):
    monkeypatch.setattr(broker_link, "ANSWER_SLICE_S", 10.0)   # one turn for the message, however slow the machine
    ring = SendRing.open()
    if ring is None:
        pytest.skip("this kernel (or its sandbox) offers no io_uring")
    front = Front(ring=ring)
    front.answer = lambda request: None

    async def scenario():
        connections = [await asyncio.open_connection("127.0.0.1", front.port) for _ in range(4)]
        for value, (_, writer) in enumerate(connections, start=1):
            writer.write(infer_request([value] * 4, close=value == 4))
        await front.until(lambda: len(front.held) == 4)
        front.broker.send(front.held[0].peer, *(doubled(request) for request in front.held))   # one message
        answers = [await read_response(reader) for reader, _ in connections]
        closed = await asyncio.wait_for(connections[3][0].read(), 2)
        for _, writer in connections:
            writer.close()
        return answers, closed

    try:
        answers, closed = front.run(scenario())
        assert [outputs(a) for a in answers] == [[2.0] * 4, [4.0] * 4, [6.0] * 4, [8.0] * 4]
        assert closed == b""   # the closing connection's answer came first, then its end
        # The three kept-alive answers in one call; the closing one went to its transport before the close.
        assert (front.sends.system_calls, front.sends.sends) == (1, 3)
    finally:
        front.close()


@pytest.mark.parametrize("code, status", [
    (ErrorCode.INVALID_ARG, 400), (ErrorCode.NOT_FOUND, 404), (ErrorCode.UNAVAILABLE, 503),
    (ErrorCode.UNSUPPORTED, 501), (ErrorCode.INTERNAL, 500),
    (99, 500),   # a code this gateway does not know
])
def test_an_error_record_from_the_broker_is_answered_with_its_status_and_its_message_as_it_is(front, code, status):
    # Built by hand: no type carries a code this side does not know. The message as the broker
    # words it: Triton adds no request id to the scheduler's or the model's errors.
    front.answer = lambda request: encode({"k": Kind.RESPONSE, "rid": request.header["rid"],
                                           "err": {"code": int(code), "message": "bad input"}})
    message = "bad input"

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 2, 3, 4], request_id="r-1") + infer_request([1, 1, 1, 1], request_id="r-2"))
        first = await read_response(reader)
        front.answer = scripted_answer
        second = await read_response(reader)   # the connection serves on
        writer.close()
        return first, second

    first, second = front.run(scenario())
    assert error_of(first) == (status, message)
    assert first[1]["content-type"] == "application/json"
    assert outputs(second) == [2.0] * 4


def test_a_broker_lost_mid_request_gets_it_exactly_one_answer_and_the_connection_serves_on(front):
    front.answer = lambda request: None
    lost = f"lost contact with the broker at {front.link.address}; the request was not answered"

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 2, 3, 4]))
        await front.until(lambda: front.held)
        front.broker.stop_beating()
        failed = await read_response(reader)
        writer.write(get_request("/v2/health/ready"))
        not_ready = await read_response(reader)
        held = front.held.pop()
        front.broker.send(held.peer, doubled(held))   # the broker's late answer: nobody waits for it
        front.broker.keep_beating(held.peer, 1, HEARTBEAT_S)
        await front.until(lambda: not front.link.broker_lost)
        front.answer = scripted_answer
        writer.write(infer_request([4, 4, 4, 4]))
        served = await read_response(reader)
        writer.close()
        return failed, not_ready, served

    failed, not_ready, served = front.run(scenario())
    assert error_of(failed) == (503, lost)
    assert not_ready[0] == 400
    assert outputs(served) == [8.0] * 4   # the very next bytes: no second answer to the first request
    assert front.link.waiting == 0


def test_a_client_that_leaves_gives_up_the_request_after_one_answered_at_once_in_its_pipeline(front):
    """Behind a request in progress wait two: one refused before it is sent (no such model), then
    one the broker holds. The third starts from inside the second's answer, and is still the one
    given up when the client leaves."""
    front.answer = lambda request: None   # held, the first and the third

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        refused = infer_request([1, 2, 3, 4]).replace(b"/v2/models/m/", b"/v2/models/nope/")
        writer.write(infer_request([1, 1, 1, 1]) + refused + infer_request([3, 3, 3, 3]))
        await front.until(lambda: front.held)
        await front.until(lambda: any(len(c.queue) == 2 for c in front.server.connections.open))   # queued behind it
        first = front.held.pop()
        front.broker.send(first.peer, doubled(first))
        answers = [await read_response(reader), await read_response(reader)]
        await front.until(lambda: front.held)
        client = writer.get_extra_info("socket")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await front.until(lambda: front.cancels)
        return answers, front.held[0]

    (first, second), third = front.run(scenario())
    assert outputs(first) == [2.0] * 4
    assert error_of(second) == (404, "Request for unknown model: 'nope' is not found")
    assert [cancel.header["rid"] for cancel in front.cancels] == [third.header["rid"]]


def test_a_client_gone_before_its_answer_costs_nothing_to_the_next_one(front):
    front.answer = lambda request: None

    async def scenario():
        _, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 2, 3, 4]))
        await front.until(lambda: front.held)
        writer.close()
        await asyncio.sleep(0.05)
        held = front.held.pop()
        front.broker.send(held.peer, doubled(held))   # answered after the client left
        await front.until(lambda: front.link.waiting == 0)
        front.answer = scripted_answer
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([2, 2, 2, 2]))
        served = await read_response(reader)
        writer.close()
        return served

    assert outputs(front.run(scenario())) == [4.0] * 4


def test_a_stream_of_answers_is_sent_as_server_sent_events_and_the_connection_serves_on(front):
    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(1.5))
        streamed = await read_chunked(reader)
        writer.write(infer_request([1, 2, 3, 4]))   # a keep-alive connection: the stream ended cleanly
        after = await read_response(reader)
        writer.close()
        return streamed, after

    (status, headers, chunks), after = front.run(scenario())
    assert (status, headers["content-type"]) == (200, "text/event-stream; charset=utf-8")
    assert events(chunks) == [{"id": "g-1", "model_name": "d", "model_version": "1", "Y": 1.5 * i} for i in (1, 2, 3)]
    assert len(chunks) == 3   # each event leaves as it comes
    assert outputs(after) == [2.0, 4.0, 6.0, 8.0]
    assert front.cancels == [], "a stream read to its end gives nothing up"


@pytest.mark.parametrize("error_at, status, expected", [
    (2, 200, [{"id": "g-1", "model_name": "d", "model_version": "1", "Y": 2.0}, {"error": "no 2 today"}]),
    (1, 400, [{"error": "no 1 today"}]),   # refused before anything was streamed: its status says so
])
def test_an_error_in_a_stream_is_its_last_event(front, error_at, status, expected):
    front.answer = lambda request: counted(request, error_at=error_at)

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(2.0))
        streamed = await read_chunked(reader)
        writer.close()
        return streamed

    got_status, _, chunks = front.run(scenario())
    assert got_status == status and events(chunks) == expected


class RecordingTrace:
    """What the front end does to a sampled request's trace, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.every_response = False
        self.tensors = False
        self.request_id = None
        self.context = bytes(24)

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.calls.append(name)

    def answered(self, response: Response) -> None:
        self.calls.append("answered")

    def finish(self) -> None:
        self.calls.append("finish")


class SamplingEverything:
    """A tracer that samples every request into one RecordingTrace."""

    on = True

    def __init__(self) -> None:
        self.trace = RecordingTrace()

    def sample(self, model: str, version: int, traceparent=None) -> RecordingTrace:
        return self.trace


def test_a_stream_cut_short_is_given_up_and_ends_its_trace_at_once(front):
    """The client reads the first event and leaves: the request is given up (CANCEL) and its trace
    ends at once; the second event, come after, is not written."""
    tracer = SamplingEverything()
    front.server.app.dataplane.tracer = tracer
    front.answer = lambda request: None   # held: the events are sent below, one at a time

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(2.0))
        await front.until(lambda: front.held)
        held = front.held[0]
        first, second, *_ = counted(held)
        front.broker.send(held.peer, first)
        await reader.readuntil(b"\n\n")   # the first event, written
        client = writer.get_extra_info("socket")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()   # reset, not half-closed: the server sees the client gone
        await front.until(lambda: not front.server.connections.open)   # its connection_lost came
        await front.until(lambda: "finish" in tracer.trace.calls and front.cancels)
        front.broker.send(held.peer, second)
        await asyncio.sleep(0.05)
        return held

    held = front.run(scenario())
    sends = [call for call in tracer.trace.calls if call.startswith("HTTP_SEND")]
    assert sends == ["HTTP_SEND_START", "HTTP_SEND_END"]
    assert tracer.trace.calls.count("finish") == 1
    assert [cancel.header["rid"] for cancel in front.cancels] == [held.header["rid"]]


def test_a_client_that_ends_its_side_during_a_stream_has_left_it_and_its_request_is_given_up_at_once(front):
    """No event more comes for a while: the half-close alone ends the stream, not the next write."""
    front.answer = lambda request: None   # held: the first event is sent below, the rest never

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(2.0))
        await front.until(lambda: front.held)
        held = front.held[0]
        front.broker.send(held.peer, counted(held)[0])
        await reader.readuntil(b"\n\n")   # the first event
        writer.write_eof()
        await front.until(lambda: front.cancels)
        rest = await reader.read()   # the server closed the connection: nothing more comes
        writer.close()
        return held, rest

    held, rest = front.run(scenario())
    assert [cancel.header["rid"] for cancel in front.cancels] == [held.header["rid"]]
    assert b"data" not in rest   # (the first chunk's end only: no event more)


def test_a_client_that_ends_its_side_before_the_first_event_of_its_stream_has_left_it_too(front):
    front.answer = lambda request: None   # held: no event comes

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(2.0))
        await front.until(lambda: front.held)
        writer.write_eof()
        await front.until(lambda: front.cancels)
        rest = await reader.read()
        writer.close()
        return front.held[0], rest

    held, rest = front.run(scenario())
    assert [cancel.header["rid"] for cancel in front.cancels] == [held.header["rid"]]
    assert rest == b"", "no answer: the connection closed"


def test_a_generate_request_whose_client_left_is_given_up_and_its_trace_ends(front):
    tracer = SamplingEverything()
    front.server.app.dataplane.tracer = tracer
    front.answer = lambda request: None   # held: never answered

    async def scenario():
        _, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(generate_stream_request(2.0, b"generate"))
        await front.until(lambda: front.held)
        client = writer.get_extra_info("socket")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await front.until(lambda: front.cancels and "finish" in tracer.trace.calls)
        return front.held[0]

    held = front.run(scenario())
    assert [cancel.header["rid"] for cancel in front.cancels] == [held.header["rid"]]
    assert tracer.trace.calls.count("finish") == 1


def test_a_traced_request_answered_before_it_left_for_the_broker_still_ends_its_trace(front):
    """The broker lost: the request is answered inside the call that would send it, before that
    call returns; its trace still gets the send's stamps and ends."""
    tracer = SamplingEverything()
    front.server.app.dataplane.tracer = tracer
    front.broker.stop_beating()

    async def scenario():
        await front.until(lambda: front.link.broker_lost)
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 2, 3, 4]))
        failed = await read_response(reader)
        writer.close()
        return failed

    assert front.run(scenario())[0] == 503
    assert tracer.trace.calls[-3:] == ["HTTP_SEND_START", "HTTP_SEND_END", "finish"]
    assert tracer.trace.calls.count("finish") == 1


def test_a_request_of_a_megabyte_of_json_or_more_is_decoded_off_the_event_loop(monkeypatch):
    # Decoding it on the loop would hold every other client (and the broker link's heartbeats) as
    # long as it takes; the decode is watched where it runs, then runs as it would.
    decoded_on: list[threading.Thread] = []
    decode = HttpApp._decode

    def watched(self, *args):
        decoded_on.append(threading.current_thread())
        return decode(self, *args)

    monkeypatch.setattr(HttpApp, "_decode", watched)

    async def scenario():
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(infer_request([1, 2, 3, 4]))   # (decoded on the loop: handing it over would cost more)
        small = await read_response(reader)
        writer.write(infer_request([0.5] * 300_000))   # 1.5 MB of JSON numbers, more than its shape says
        large = await read_response(reader)
        writer.close()
        return small, large

    front = Front(max_body_bytes=8 << 20)
    try:
        small, large = front.run(scenario())
    finally:
        front.close()
    assert outputs(small) == [2, 4, 6, 8]
    assert (large[0], json.loads(large[2])["error"]) == (400, "Unable to parse 'data': Shape does not match true "
                                                              "shape of 'data' field")
    loop_thread = threading.current_thread()   # (the front's loop runs in the test's thread)
    assert decoded_on[0] is loop_thread and decoded_on[1] is not loop_thread
    assert decoded_on[1].name.startswith("tritium-decode")
