"""The gRPC front end whole, in-process: GrpcServer + GrpcInferenceService + DataPlane +
BrokerLink on an event loop of their own thread, a real TCP port, and a scripted broker
behind them. The client speaks raw HTTP/2; the scripted broker holds the INFERs it reads and
answers them when and how the test says, so that what a client gets when answers and
failures meet inside the gateway is asserted on its bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable

import numpy as np
import pytest
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.e2e.rawh2 import DATA, END_STREAM, INITIAL_WINDOW_SIZE, SETTINGS, WINDOW_UPDATE, Answer, RawH2, grpc_message
from tests.scripted_peers import Received, ScriptedBroker, attached_gateway_link
from tritium.errors import InvalidArgument
from tritium.gateway import broker_link
from tritium.gateway.dataplane import DataPlane
from tritium.gateway.grpc_api import GrpcInferenceService
from tritium.gateway import grpc_http2
from tritium.gateway.grpc_http2 import REFUSED_STREAM
from tritium.gateway.grpc_server import bind_grpc_tritium
from tritium.gateway.send_ring import SendRing
from tritium.gateway.turn_sends import TurnSends
from tritium.protocol import Kind, ModelRow, Models, Response, VersionRow, error_record

HEARTBEAT_S = 0.1
CONFIG = {"name": "m", "backend": "python", "max_batch_size": 0,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]}
TABLE = Models(1, (ModelRow("m", None, (VersionRow(1, "READY", "", True),), CONFIG, None),), True, ())
_names = itertools.count()


class GrpcFront:
    """The gateway's gRPC side (responses compressed at level ``high``) on a loop in a thread;
    ``on_infers`` sees every INFER read so far and returns the broker messages to send now."""

    def __init__(self, on_infers: Callable[[list[Received]], list[tuple[bytes, list[bytes]]]],
                 ring: SendRing | None = None, **server_options) -> None:
        self.on_infers = on_infers
        self.ring = ring   # a ring: each turn's answers in one system call
        self.server_options = server_options
        self.infers: list[Received] = []
        self.broker = ScriptedBroker(f"inproc://grpc-front-{next(_names)}")
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10), "the gRPC front did not start"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.link, self.server, self.port = self.loop.run_until_complete(self._start())
        self._pumping = self.loop.create_task(self._pump())
        started.set()
        self.loop.run_forever()

    async def _start(self):
        link = await attached_gateway_link(self.broker, TABLE, HEARTBEAT_S)
        self.sends = TurnSends(self.loop, self.ring, more_coming=lambda: link.waiting > 0)
        server, port = bind_grpc_tritium(GrpcInferenceService(DataPlane(link)), "127.0.0.1", 0,
                                         compression_level="high", sends=self.sends, **self.server_options)
        await server.start()
        return link, server, port

    async def _pump(self) -> None:
        while True:
            read = [r for r in self.broker.pump() if r.kind == Kind.INFER]
            if read:
                self.infers += read
                for peer, records in self.on_infers(self.infers):
                    self.broker.send(peer, *records)   # one message: the gateway reads them in one turn
            await asyncio.sleep(0.002)

    def close(self) -> None:
        async def stop():
            self._pumping.cancel()
            await self.server.stop(1)
            self.link.close()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
            self.broker.close()


def answer(request: Received, values: np.ndarray) -> bytes:
    return Response(request.header["rid"], [["Y", "FP32", [len(values)], values.nbytes, False]]).encode(
        [values.tobytes()])


def infer(values: np.ndarray, request_id: str) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="m", id=request_id, raw_input_contents=[values.tobytes()])
    request.inputs.add(name="X", datatype="FP32", shape=[len(values)])
    return grpc_message(request.SerializeToString())


def wide_open_client(front: GrpcFront) -> RawH2:
    """A raw HTTP/2 client whose windows take answers of any size used here at once."""
    raw = RawH2(f"127.0.0.1:{front.port}", settings={INITIAL_WINDOW_SIZE: 1 << 30})
    raw.send(WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big"))
    return raw


MAX_FRAME_SIZE = 5   # the HTTP/2 setting
STREAM_COMPRESSED = ("grpc-accept-encoding", "identity,deflate,gzip")
LARGE = np.tile(np.arange(1000, dtype=np.float32), 200)   # 800 KB that compresses: on the zlib threads


def test_an_answer_being_compressed_when_its_stream_fails_goes_out_before_the_error():
    """Two requests on a ModelStreamInfer call with triton_grpc_error: the broker answers the
    first with a large tensor and the second with an error in one message, so the error ends
    the call while the answer is still being compressed: the client gets the answer, then the
    error's status."""
    def both_at_once(infers: list[Received]) -> list[tuple[bytes, list[bytes]]]:
        if len(infers) < 2:
            return []
        first, second = infers
        return [(first.peer, [answer(first, LARGE), error_record(second.header["rid"], InvalidArgument("no"))])]

    front = GrpcFront(both_at_once)
    raw = wide_open_client(front)
    try:
        stream = raw.start_call("ModelStreamInfer", (STREAM_COMPRESSED, ("triton_grpc_error", "true")))
        raw.send(DATA, 0, stream, infer(np.ones(2, np.float32), "big"))
        raw.send(DATA, END_STREAM, stream, infer(np.ones(2, np.float32), "fails"))
        got = raw.wait(stream)
    finally:
        raw.close()
        front.close()
    assert (got.status, got.message) == (3, "no")
    (payload,) = got.messages
    message = service_pb2.ModelStreamInferResponse()
    message.ParseFromString(zlib.decompress(payload))
    assert message.infer_response.id == "big"
    np.testing.assert_array_equal(np.frombuffer(message.infer_response.raw_output_contents[0], np.float32), LARGE)


@pytest.mark.parametrize("count", [1, 3])
def test_answers_compressed_on_threads_keep_their_order(count):
    """Large and small answers of one stream, all in one broker message: the small ones wait
    behind the large ones being compressed."""
    values = [LARGE + i if i % 2 == 0 else np.full(256, i, np.float32) for i in range(2 * count)]

    def all_at_once(infers: list[Received]) -> list[tuple[bytes, list[bytes]]]:
        if len(infers) < len(values):
            return []
        return [(infers[0].peer, [answer(r, v) for r, v in zip(infers, values)])]

    front = GrpcFront(all_at_once)
    raw = wide_open_client(front)
    try:
        stream = raw.start_call("ModelStreamInfer", (STREAM_COMPRESSED,))
        for i in range(len(values)):
            raw.send(DATA, END_STREAM if i == len(values) - 1 else 0, stream, infer(np.ones(1, np.float32), str(i)))
        got = raw.wait(stream)
    finally:
        raw.close()
        front.close()
    assert got.status == 0
    ids = []
    for payload, expected in zip(got.messages, values, strict=True):
        message = service_pb2.ModelStreamInferResponse()
        message.ParseFromString(zlib.decompress(payload))
        ids.append(message.infer_response.id)
        np.testing.assert_array_equal(np.frombuffer(message.infer_response.raw_output_contents[0], np.float32),
                                      expected)
    assert ids == [str(i) for i in range(len(values))]


def test_a_deadline_passing_while_an_answer_is_compressed_sends_nothing_more():
    """The broker answers at once with 16 MB that take far longer to compress than the call's
    200 ms deadline: the client gets DEADLINE_EXCEEDED and no message after it."""
    big = np.random.default_rng(1).standard_normal(4_000_000).astype(np.float32)
    front = GrpcFront(lambda infers: [(r.peer, [answer(r, big)]) for r in infers[-1:]])
    raw = wide_open_client(front)
    try:
        stream = raw.start_call("ModelStreamInfer", (STREAM_COMPRESSED, ("grpc-timeout", "200m")))
        raw.send(DATA, 0, stream, infer(np.ones(2, np.float32), "late"))
        got = raw.wait(stream)
    finally:
        raw.close()
        front.close()
    assert (got.status, got.messages) == (4, [])


@pytest.mark.parametrize("max_frame", [None, (1 << 24) - 1], ids=["client-frames-16k", "client-frames-16m"])
@pytest.mark.parametrize("method", ["ModelInfer", "ModelStreamInfer"])
def test_a_large_answer_arrives_whole_in_frames_the_client_takes(method, max_frame):
    """An 800 KB answer is written without being copied behind its headers and prefix: it must
    still arrive byte for byte, in DATA frames no larger than the client's frame size, the
    unary call's in one piece when the client takes frames that large."""
    values = np.random.default_rng(5).standard_normal(200_000).astype(np.float32)
    front = GrpcFront(lambda infers: [(r.peer, [answer(r, values)]) for r in infers[-1:]])
    settings = {INITIAL_WINDOW_SIZE: 1 << 30} | ({MAX_FRAME_SIZE: max_frame} if max_frame else {})
    raw = RawH2(f"127.0.0.1:{front.port}", settings=settings)
    raw.send(WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big"))
    try:
        stream = raw.start_call(method)
        raw.send(DATA, END_STREAM if method == "ModelInfer" else 0, stream, infer(np.ones(2, np.float32), "big"))
        if method == "ModelInfer":
            got = raw.wait(stream)
        else:
            deadline = time.monotonic() + 10
            while len(raw.answers.get(stream, Answer()).data) < values.nbytes and time.monotonic() < deadline:
                raw.read_some()
            got = raw.answers[stream]
    finally:
        raw.close()
        front.close()
    (message,) = got.messages
    response = service_pb2.ModelInferResponse.FromString(message) if method == "ModelInfer" else \
        service_pb2.ModelStreamInferResponse.FromString(message).infer_response
    assert np.array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), values)
    sizes = [len(payload) for kind, _, sid, payload in raw.frames if kind == DATA and sid == stream]
    assert max(sizes) <= (max_frame or 16384)
    if method == "ModelInfer" and max_frame:
        assert len(sizes) == 1


def answer_each(values: np.ndarray) -> Callable[[list[Received]], list[tuple[bytes, list[bytes]]]]:
    """A broker that answers every INFER with ``values``, as it reads it."""
    answered = 0

    def on_infers(infers: list[Received]) -> list[tuple[bytes, list[bytes]]]:
        nonlocal answered
        new, answered = infers[answered:], len(infers)
        return [(r.peer, [answer(r, values)]) for r in new]
    return on_infers


def settled_count(front: GrpcFront, quiet_s: float = 0.3) -> int:
    """How many INFERs the broker has read, once no new one came for ``quiet_s``."""
    count, since = len(front.infers), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.02)
        if len(front.infers) != count:
            count, since = len(front.infers), time.monotonic()
    return count


def test_a_client_that_does_not_read_its_answers_gets_no_new_calls_started_until_it_does():
    """Past 1 MB of answers unread, the connection starts no new call (the broker reads no new
    request); once the client reads, the calls held back start, in order, and every one is answered."""
    front = GrpcFront(answer_each(HELD), max_held_bytes=1_000_000)
    raw = RawH2(f"127.0.0.1:{front.port}")
    try:
        streams = unread_answers_past_the_limit(front, raw)
        for i in range(16, 40):
            streams.append(raw.start_call("ModelInfer"))
            raw.send(DATA, END_STREAM, streams[-1], infer(np.ones(1, np.float32), f"r{i}"))
        assert settled_count(front) == 16   # held back: the client has 1.5 MB of answers to read first
        (connection,) = front.server.shared.open
        assert connection.holding and 1_400_000 < connection.pending_bytes < 1_600_000
        reads_again(raw)
        got = [raw.wait(stream) for stream in streams]
        assert (connection.holding, connection.pending_bytes, connection.held_back) == (False, 0, deque())
    finally:
        raw.close()
        front.close()
    assert [r.header["id"] for r in front.infers] == [f"r{i}" for i in range(40)]
    for i, answered in enumerate(got):
        assert answered.status == 0, (i, answered.message)
        (message,) = answered.messages
        np.testing.assert_array_equal(
            np.frombuffer(service_pb2.ModelInferResponse.FromString(message).raw_output_contents[0], np.float32), HELD)


def test_a_client_that_reads_nothing_is_not_read_past_the_bound_whatever_it_sends():
    """Each SETTINGS (as each PING) asks for an answer: from a client that reads nothing, the
    answers would pile up in the gateway without end. Past the bound, the connection is not read
    until the client reads; then it is served again."""
    front = GrpcFront(answer_each(np.ones(4, np.float32)), max_held_bytes=100_000)
    raw = RawH2(f"127.0.0.1:{front.port}", socket_buffers=16384)
    try:
        settled_count(front, quiet_s=0.1)
        (connection,) = front.server.shared.open
        sock = connection.transport.get_extra_info("socket")
        # little kept in the kernel on either side, so that the gateway's own buffer is what fills
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            front.loop.call_soon_threadsafe(sock.setsockopt, socket.SOL_SOCKET, option, 4096)
        one = raw.frame(SETTINGS, 0, 0)
        flood, sent = one * 7000, 0
        raw.sock.settimeout(1)
        with pytest.raises(TimeoutError):   # the gateway stops reading it
            while sent < 1_000_000:
                sent += raw.sock.send(flood[sent % len(flood):])
        buffered = asyncio.run_coroutine_threadsafe(_write_buffer_size(connection), front.loop).result(5)
        # the bound, and what the reads of one turn asked for past it (a read takes 256 KiB at most)
        assert connection.unread and 100_000 < buffered < 100_000 + 2 * 262_144, (sent, buffered)
        raw.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):   # the client reads: the gateway reads it again, and answers the rest
            while True:
                raw.receive_unread()   # (its replies wait: the gateway is not reading it yet)
        assert not connection.unread
        raw.sock.settimeout(10)
        raw.sock.sendall(one[sent % len(one):] if sent % len(one) else b"")   # the frame it was sending
        raw.take_frames()
        stream = raw.start_call("ModelInfer")
        raw.send(DATA, END_STREAM, stream, infer(np.ones(1, np.float32), "after"))
        answered = raw.wait(stream)
        assert answered.status == 0 and answered.messages
    finally:
        raw.close()
        front.close()


async def _write_buffer_size(connection) -> int:
    return connection.transport.get_write_buffer_size()


def test_a_stream_held_back_keeps_its_order_and_its_end():
    front = GrpcFront(answer_each(HELD), max_held_bytes=1_000_000)
    raw = RawH2(f"127.0.0.1:{front.port}")
    try:
        unread_answers_past_the_limit(front, raw)
        stream = raw.start_call("ModelStreamInfer")
        for i in range(3):
            raw.send(DATA, END_STREAM if i == 2 else 0, stream, infer(np.ones(1, np.float32), f"s{i}"))
        assert settled_count(front) == 16
        reads_again(raw)
        got = raw.wait(stream)
        (connection,) = front.server.shared.open
        assert (connection.holding, connection.pending_bytes) == (False, 0)
    finally:
        raw.close()
        front.close()
    assert got.status == 0
    assert [service_pb2.ModelStreamInferResponse.FromString(m).infer_response.id for m in got.messages] == \
        ["s0", "s1", "s2"]


def test_a_call_held_back_past_its_deadline_ends_without_reaching_the_broker():
    front = GrpcFront(answer_each(HELD), max_held_bytes=1_000_000)
    raw = RawH2(f"127.0.0.1:{front.port}")
    try:
        unread_answers_past_the_limit(front, raw)
        late = raw.start_call("ModelInfer", (("grpc-timeout", "100m"),))
        raw.send(DATA, END_STREAM, late, infer(np.ones(1, np.float32), "late"))
        time.sleep(0.3)
        reads_again(raw)
        got = raw.wait(late)
        assert settled_count(front) == 16
    finally:
        raw.close()
        front.close()
    assert (got.status, got.messages) == (4, [])


def test_calls_held_back_count_against_the_open_streams_limit(monkeypatch):
    """A held call keeps its stream open: past the limit (16 streams with unread answers, three
    held), the next call is refused, and the held ones are served once the client reads."""
    monkeypatch.setattr(grpc_http2, "MAX_OPEN_STREAMS", 19)
    front = GrpcFront(answer_each(HELD), max_held_bytes=1_000_000)
    raw = RawH2(f"127.0.0.1:{front.port}")
    try:
        unread_answers_past_the_limit(front, raw)
        held = []
        for i in range(4):
            held.append(raw.start_call("ModelInfer"))
            raw.send(DATA, END_STREAM, held[-1], infer(np.ones(1, np.float32), f"h{i}"))
        refused = raw.wait(held.pop())
        reads_again(raw)
        got = [raw.wait(stream) for stream in held]
    finally:
        raw.close()
        front.close()
    assert refused.reset == REFUSED_STREAM
    assert [answered.status for answered in got] == [0, 0, 0]
    assert [r.header["id"] for r in front.infers[16:]] == ["h0", "h1", "h2"]


def test_calls_past_the_open_streams_limit_are_refused_and_served_once_one_ends(monkeypatch):
    """A client that opens streams and sends nothing on them (each held by the gateway) gets no
    more than the limit; the calls it opened are still served."""
    monkeypatch.setattr(grpc_http2, "MAX_OPEN_STREAMS", 3)
    front = GrpcFront(answer_each(np.full(2, 7, np.float32)))
    raw = RawH2(f"127.0.0.1:{front.port}")
    try:
        silent = [raw.start_call("ModelInfer") for _ in range(3)]
        refused = raw.wait(raw.start_call("ModelInfer"))
        raw.send(DATA, END_STREAM, silent[0], infer(np.ones(1, np.float32), "first"))
        first = raw.wait(silent[0])
        later = raw.call("ModelInfer", service_pb2.ModelInferRequest(
            model_name="m", id="later", raw_input_contents=[np.ones(1, np.float32).tobytes()],
            inputs=[service_pb2.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1])]
        ).SerializeToString())
    finally:
        raw.close()
        front.close()
    assert refused.reset == REFUSED_STREAM
    assert (first.status, later.status) == (0, 0)
    assert [r.header["id"] for r in front.infers] == ["first", "later"]


HELD = np.arange(25_000, dtype=np.float32)   # a 100 KB answer


def unread_answers_past_the_limit(front: GrpcFront, raw: RawH2) -> list[int]:
    """16 calls answered with 100 KB each to a client that never hands back its 64 KB window:
    1.5 MB of answers unread, past a 1 MB limit. Their streams. The calls go in one write, so that
    all start before the first answers come back (after those, the gateway would hold the rest)."""
    streams, frames = [], []
    raw.send = lambda kind, flags, stream_id, payload=b"": frames.append(raw.frame(kind, flags, stream_id, payload))
    try:
        for i in range(16):
            streams.append(raw.start_call("ModelInfer"))
            raw.send(DATA, END_STREAM, streams[-1], infer(np.ones(1, np.float32), f"r{i}"))
    finally:
        del raw.send   # the class's again
    raw.sock.sendall(b"".join(frames))
    assert settled_count(front) == 16
    return streams


def reads_again(raw: RawH2) -> None:
    """The client opens its windows wide: every answer can come."""
    raw.send(SETTINGS, 0, 0, INITIAL_WINDOW_SIZE.to_bytes(2, "big") + (1 << 30).to_bytes(4, "big"))
    raw.send(WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big"))


def test_a_request_of_a_megabyte_of_typed_values_or_more_is_read_off_the_event_loop(monkeypatch):
    # Reading protobuf's typed contents goes value by value: on the loop it would hold every other
    # call; where each request's reading runs is watched, then it runs as it would.
    from tritium.gateway.grpc_codec import ReadAhead

    read_on: list[threading.Thread] = []
    read_ahead = ReadAhead.of.__func__

    def watched(cls, data):
        read_on.append(threading.current_thread())
        return read_ahead(cls, data)

    monkeypatch.setattr(ReadAhead, "of", classmethod(watched))
    front = GrpcFront(answer_each(np.ones(2, np.float32)))
    typed = service_pb2.ModelInferRequest(model_name="m", id="typed")
    typed.inputs.add(name="X", datatype="FP32", shape=[300_000]).contents.fp32_contents.extend([0.5] * 300_000)
    small = service_pb2.ModelInferRequest(model_name="m", id="small", raw_input_contents=[np.ones(2, np.float32).tobytes()])
    small.inputs.add(name="X", datatype="FP32", shape=[2])
    channel = grpc.insecure_channel(f"127.0.0.1:{front.port}")
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(small, timeout=10).id == "small"   # its reading not handed over
        assert stub.ModelInfer(typed, timeout=10).id == "typed"
    finally:
        channel.close()
        front.close()
    assert len(read_on) == 1 and read_on[0] is not front.thread and read_on[0].name.startswith("tritium-decode")


def test_the_answers_of_one_broker_message_to_several_connections_leave_in_one_system_call(monkeypatch):
    monkeypatch.setattr(broker_link, "ANSWER_SLICE_S", 10.0)   # one turn for the message, however slow the machine
    ring = SendRing.open()
    if ring is None:
        pytest.skip("this kernel (or its sandbox) offers no io_uring")

    before: list[tuple[int, int]] = []   # the sends made until then (each connection's setup among them)

    def all_three_at_once(infers: list[Received]) -> list[tuple[bytes, list[bytes]]]:
        if len(infers) != 3:
            return []
        before.append((front.sends.system_calls, front.sends.sends))
        return [(infers[0].peer, [answer(r, np.full(2, float(r.header["id"][1:]), np.float32)) for r in infers])]

    front = GrpcFront(all_three_at_once, ring=ring)
    clients = [wide_open_client(front) for _ in range(3)]
    try:
        calls = []
        for i, raw in enumerate(clients):
            calls.append(raw.start_call("ModelInfer"))
            raw.send(DATA, END_STREAM, calls[-1], infer(np.ones(1, np.float32), f"r{i}"))
        got = [raw.wait(call) for raw, call in zip(clients, calls)]
    finally:
        for raw in clients:
            raw.close()
        front.close()
    for i, answered in enumerate(got):
        assert answered.status == 0
        response = service_pb2.ModelInferResponse()
        response.ParseFromString(answered.messages[0])
        assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [float(i)] * 2
    (calls_before, sends_before), = before
    assert (front.sends.system_calls - calls_before, front.sends.sends - sends_before) == (1, 3)
