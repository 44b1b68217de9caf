"""The gateway's data plane and HTTP routes against a scripted broker, in-process.

The test owns a ROUTER socket on ``inproc://`` that plays the broker: it answers the
gateway's hello with a model table and then answers, delays or drops what the gateway
sends, so that the gateway's side of the protocol (batching per turn, answers matched to
requests, a broker that falls silent or restarts) is tested exactly.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
import pytest
import zmq

from tritium.gateway.broker_link import BrokerLink
from tritium.gateway.dataplane import DataPlane
from tritium.gateway.http_api import HttpApp
from tritium.gateway.http_server import HttpRequest
from tritium.protocol import Heartbeat, Hello, Infer, Message, ModelRow, Models, Response, VersionRow, read_record
from tritium.zmqio import recv_parts, send_parts

HEARTBEAT_S = 0.1
CONFIG = {"name": "m", "backend": "python", "max_batch_size": 8,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}
_names = itertools.count()


class ScriptedBroker:
    def __init__(self, address: str, boot: int = 1) -> None:
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.boot = boot
        self.received: list[tuple[bytes, list[tuple[Message, bytes]]]] = []   # per message: peer, records

    def pump(self) -> list[tuple[bytes, Message, bytes]]:
        """Read what arrived; answer hellos; return the (peer, header, record) of everything else."""
        records = []
        while True:
            try:
                parts = recv_parts(self.sock)
            except zmq.Again:
                return records
            peer, message = parts[0].bytes, [(read_record(p)[0], p.bytes) for p in parts[1:]]
            self.received.append((peer, message))
            for header, raw in message:
                if isinstance(header, Hello):
                    self.hello(peer)
                elif not isinstance(header, Heartbeat):
                    records.append((peer, header, raw))

    def hello(self, peer: bytes) -> None:
        table = Models(1, (ModelRow("m", None, (VersionRow(1, "READY", "", True),), CONFIG, None),), True, ())
        self.send(peer, Heartbeat(self.boot, HEARTBEAT_S).encode(), table.encode())

    def send(self, peer: bytes, *records: bytes) -> None:
        send_parts(self.sock, [peer, *records])

    def answer(self, peer: bytes, header: Infer, raw: bytes, scale: float = 2.0) -> bytes:
        """The RESPONSE record for an INFER: Y = X * scale."""
        x = np.frombuffer(raw[-16:], np.float32)
        return Response(header.rid, [["Y", "FP32", [1, 4], 16, False]]).encode(
            [(x * scale).astype(np.float32).tobytes()])


@pytest.fixture
def gateway():
    """(loop, broker, link, app): a BrokerLink connected to the scripted broker, hello answered."""
    loop = asyncio.new_event_loop()
    address = f"inproc://scripted-broker-{next(_names)}"
    broker = ScriptedBroker(address)

    async def connect():
        link = BrokerLink(address, heartbeat_interval_s=HEARTBEAT_S)
        starting = asyncio.ensure_future(link.start(5))
        while not starting.done():
            broker.pump()
            await asyncio.sleep(0.005)
        await starting
        return link

    link = loop.run_until_complete(connect())
    app = HttpApp(DataPlane(link))
    yield loop, broker, link, app
    link.close()
    broker.sock.close(0)
    loop.close()


def http_infer(app: HttpApp, values: list[float], model: str = "m") -> asyncio.Future:
    """POST /v2/models/m/infer with a JSON body; the future gets the HttpResponse."""
    future = asyncio.get_running_loop().create_future()
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": values}]}).encode()
    app.handle(HttpRequest("POST", f"/v2/models/{model}/infer", {b"content-length": b"%d" % len(body)}, body),
               future.set_result)
    return future


async def serve_until(broker: ScriptedBroker, futures: list, answer=True) -> None:
    while not all(f.done() for f in futures):
        for peer, header, raw in broker.pump():
            if answer and isinstance(header, Infer):
                broker.send(peer, broker.answer(peer, header, raw))
        await asyncio.sleep(0.002)


def outputs(response) -> list[float]:
    assert response.status == 200, response.body
    return json.loads(response.body)["outputs"][0]["data"]


def test_requests_of_one_turn_leave_in_one_message_and_each_gets_its_own_answer(gateway):
    loop, broker, _, app = gateway

    async def scenario():
        futures = [http_infer(app, [i, i, i, i]) for i in range(5)]   # the same event-loop turn
        await serve_until(broker, futures)
        return [f.result() for f in futures]

    responses = loop.run_until_complete(scenario())
    assert [outputs(r) for r in responses] == [[2.0 * i] * 4 for i in range(5)]
    infer_messages = [m for _, m in broker.received if any(isinstance(h, Infer) for h, _ in m)]
    assert len(infer_messages) == 1 and len(infer_messages[0]) == 5
    assert len({h.rid for h, _ in infer_messages[0]}) == 5


def test_answers_out_of_order_reach_the_right_requests(gateway):
    loop, broker, _, app = gateway

    async def scenario():
        futures = [http_infer(app, [i] * 4) for i in (1, 2, 3)]
        pending = []
        while len(pending) < 3:
            pending += broker.pump()
            await asyncio.sleep(0.002)
        for peer, header, raw in reversed(pending):
            broker.send(peer, broker.answer(peer, header, raw, scale=10))
        await serve_until(broker, futures)
        return [outputs(f.result()) for f in futures]

    assert loop.run_until_complete(scenario()) == [[10.0] * 4, [20.0] * 4, [30.0] * 4]


def test_a_bad_request_is_answered_by_the_gateway_without_reaching_the_broker(gateway):
    loop, broker, _, app = gateway

    async def scenario():
        future = asyncio.get_running_loop().create_future()
        body = b'{"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}'
        app.handle(HttpRequest("POST", "/v2/models/m/infer", {}, body), future.set_result)
        unknown = http_infer(app, [1, 2, 3, 4], model="other")
        await asyncio.sleep(0.05)
        broker.pump()
        return await future, await unknown

    bad, unknown = loop.run_until_complete(scenario())
    assert (bad.status, json.loads(bad.body)["error"]) == (400, "unexpected inference input 'NOPE' for model 'm'")
    assert (unknown.status, json.loads(unknown.body)["error"]) == (404, "Request for unknown model: 'other' is not found")
    assert not any(isinstance(h, Infer) for _, m in broker.received for h, _ in m)


def test_a_broker_that_falls_silent_fails_the_waiting_requests_then_new_ones_at_once(gateway):
    loop, broker, link, app = gateway

    async def scenario():
        waiting = http_infer(app, [1, 2, 3, 4])
        await asyncio.wait_for(waiting, HEARTBEAT_S * 3 * 4)   # the broker never answers
        late = http_infer(app, [1, 2, 3, 4])
        return waiting.result(), await late

    waiting, late = loop.run_until_complete(scenario())
    for response in (waiting, late):
        assert response.status == 503
        assert json.loads(response.body)["error"] == (f"lost contact with the broker at {link.address}; "
                                                      "the request was not answered")
    assert link.broker_lost and not app.dataplane.ready()


def test_a_restarted_broker_fails_what_the_old_one_held_and_serves_again(gateway):
    loop, broker, link, app = gateway

    async def scenario():
        held = http_infer(app, [1, 2, 3, 4])
        while not any(isinstance(h, Infer) for _, h, _ in broker.pump()):
            await asyncio.sleep(0.002)
        broker.boot = 2   # a new broker process: it says so in its next heartbeat
        broker.send(link.identity.encode(), Heartbeat(2, HEARTBEAT_S).encode())
        first = await asyncio.wait_for(held, 2)
        fresh = http_infer(app, [3, 3, 3, 3])
        await serve_until(broker, [fresh])
        return first, fresh.result()

    first, fresh = loop.run_until_complete(scenario())
    assert (first.status, json.loads(first.body)["error"]) == (
        503, f"the broker at {link.address} restarted; the request was lost")
    assert outputs(fresh) == [6.0] * 4 and link.broker_boot == 2


def test_a_stream_answers_every_request_once_and_ends_when_the_last_is_answered(gateway):
    from tritonclient.grpc import service_pb2

    from tritium.gateway.grpc_api import GrpcInferenceService

    loop, broker, link, _ = gateway
    sent: list = []
    ended: list = []
    good = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[np.ones(4, np.float32).tobytes()])
    good.inputs.add(name="X", datatype="FP32", shape=[1, 4])

    async def scenario():
        stream = GrpcInferenceService(DataPlane(link)).open_stream((), sent.append, ended.append,
                                                                   lambda: ended.append("finished"))
        stream.request(good)
        for _ in range(3):
            stream.request(b"\xff\xff\xff\xff\x0f")   # no protobuf message
        stream.client_done()
        assert ended == []   # the good request is still out
        while not ended:
            for peer, header, raw in broker.pump():
                if isinstance(header, Infer):
                    broker.send(peer, broker.answer(peer, header, raw))
            await asyncio.sleep(0.002)

    loop.run_until_complete(scenario())
    sent = [service_pb2.ModelStreamInferResponse.FromString(answer) for answer in sent]   # the stream's bytes
    assert [r.error_message for r in sent[:3]] == ["Unable to parse request"] * 3
    assert np.frombuffer(sent[3].infer_response.raw_output_contents[0], np.float32).tolist() == [2.0] * 4
    assert ended == ["finished"] and len(sent) == 4


def test_a_stream_half_closed_by_its_client_ends_with_an_error_answer_when_the_broker_falls_silent(gateway):
    from tritonclient.grpc import service_pb2

    from tritium.gateway.grpc_api import GrpcInferenceService

    loop, broker, link, _ = gateway
    sent: list = []
    ended: list = []
    request = service_pb2.ModelInferRequest(model_name="m", id="held",
                                            raw_input_contents=[np.ones(4, np.float32).tobytes()])
    request.inputs.add(name="X", datatype="FP32", shape=[1, 4])

    async def scenario():
        stream = GrpcInferenceService(DataPlane(link)).open_stream((), sent.append, ended.append,
                                                                   lambda: ended.append("finished"))
        stream.request(request)
        stream.client_done()   # the client sends nothing more; its request is still out
        while not any(isinstance(h, Infer) for _, h, _ in broker.pump()):
            await asyncio.sleep(0.002)
        deadline = loop.time() + HEARTBEAT_S * 3 * 4   # then the broker never answers again
        while not ended and loop.time() < deadline:
            await asyncio.sleep(0.01)

    loop.run_until_complete(scenario())
    assert ended == ["finished"] and len(sent) == 1
    sent = [service_pb2.ModelStreamInferResponse.FromString(answer) for answer in sent]   # the stream's bytes
    assert sent[0].error_message == f"lost contact with the broker at {link.address}; the request was not answered"
    assert sent[0].infer_response.id == "held"
