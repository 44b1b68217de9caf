"""The gateway's own CPU per inference request, HTTP and gRPC, in-process and without sockets.

The gateway's front end (tritium's HTTP server or gRPC server, the service, the DataPlane and
a BrokerLink) runs on an event loop in this process. Sixteen clients' requests, made as
perf_analyzer makes add_sub's (FP32 [1,16] x2 in binary, both outputs named), are handed to
the connections' ``data_received`` in turns of sixteen (HTTP: one per connection; gRPC: four
calls on each of four connections; gRPC streaming: one request on each of sixteen
ModelStreamInfer calls, four calls on each of four connections); the requests the link sends are taken
from it and answered at once with RESPONSE records, which the link dispatches as it does the
broker's; the answers are written to transports that only count. What is measured is the
process's CPU time for everything the gateway does per request (parsing, decoding,
validation, the INFER record, reading the answer, encoding and framing the response) less the
benchmark's own making of the answers; system calls and the broker are not in it (the whole
gateway under load: ``bench.versus_triton``). The deterministic figure to compare builds with.

    python -m bench.gateway_cpu [--turns 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable

import hpack
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2

from tests.scripted_peers import ScriptedBroker, attached_gateway_link
from tritium.gateway.connections import OpenConnections
from tritium.gateway.dataplane import DataPlane
from tritium.gateway.grpc_api import GrpcInferenceService
from tritium.gateway.grpc_server import GrpcConnection, GrpcServer
from tritium.gateway.http_api import HttpApp
from tritium.gateway.http_server import HttpConnection, HttpSettings
from tritium.gateway.turn_sends import TurnSends
from tritium.protocol import Infer, ModelRow, Models, Response, VersionRow, read_record

CLIENTS = 16            # requests in flight: each HTTP one on a connection of its own, as perf_analyzer's
GRPC_CONNECTIONS = 4    # the gRPC ones on four connections (perf_analyzer's 16 share three or four)
WARM_TURNS = 50
CONFIG = {"name": "add_sub", "backend": "python", "max_batch_size": 64, "dynamic_batching": {},
          "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [16]} for i in (0, 1)],
          "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [16]} for i in (0, 1)]}
TABLE = Models(1, (ModelRow("add_sub", None, (VersionRow(1, "READY", "", True),), CONFIG, None),), True, ())
TENSOR = np.arange(16, dtype=np.float32).tobytes()
OUTPUTS = [["OUTPUT0", "FP32", [1, 16], 64, False], ["OUTPUT1", "FP32", [1, 16], 64, False]]


class CountingTransport:
    """What a connection writes, counted and dropped."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, data) -> None:
        self.writes += 1

    def writelines(self, chunks) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return default

    def close(self) -> None: ...
    def abort(self) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


def http_request() -> bytes:
    header = (b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}},'
              b'{"name":"INPUT1","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}}],'
              b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},'
              b'{"name":"OUTPUT1","parameters":{"binary_data":true}}]}')
    body = header + TENSOR + TENSOR
    return (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: localhost:8000\r\nAccept: */*\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(header), len(body)) + body)


class GrpcClient:
    """One HTTP/2 client connection's bytes: the preface, then a ModelInfer per ``call()``."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.stream_id = -1
        message = service_pb2.ModelInferRequest(model_name="add_sub")
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            message.raw_input_contents.append(TENSOR)
        for name in ("OUTPUT0", "OUTPUT1"):
            message.outputs.add(name=name)
        payload = message.SerializeToString()
        self.message = b"\x00" + len(payload).to_bytes(4, "big") + payload

    @staticmethod
    def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload

    def preface(self) -> bytes:
        return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + self.frame(4, 0, 0, b"")

    def headers(self, rpc: str) -> bytes:
        return self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "localhost:8001"),
                                    (":path", f"/inference.GRPCInferenceService/{rpc}"), ("te", "trailers"),
                                    ("content-type", "application/grpc"),
                                    ("grpc-accept-encoding", "identity,deflate,gzip")])

    def call(self) -> bytes:
        self.stream_id += 2
        return (self.frame(1, 4, self.stream_id, self.headers("ModelInfer"))
                + self.frame(0, 1, self.stream_id, self.message)
                + self.frame(8, 0, 0, (1 << 16).to_bytes(4, "big")))   # the client returning its window

    def open_streams(self, count: int) -> tuple[bytes, list[int]]:
        """``count`` ModelStreamInfer calls opened (their HEADERS), and their stream ids."""
        ids = [self.stream_id + 2 * (i + 1) for i in range(count)]
        self.stream_id = ids[-1]
        return b"".join(self.frame(1, 4, stream_id, self.headers("ModelStreamInfer")) for stream_id in ids), ids

    def stream_requests(self, ids: list[int]) -> bytes:
        """One request on each of the streams ``ids``, and the windows returned."""
        return (b"".join(self.frame(0, 0, stream_id, self.message) for stream_id in ids)
                + b"".join(self.frame(8, 0, stream_id, len(self.message).to_bytes(4, "big")) for stream_id in ids)
                + self.frame(8, 0, 0, (len(self.message) * len(ids)).to_bytes(4, "big")))


async def measure(protocol: str, turns: int, clients: int = CLIENTS, traced: Callable | None = None) -> float:
    """CPU microseconds per request over ``turns`` turns of ``clients`` requests (HTTP: any number;
    gRPC: a multiple of GRPC_CONNECTIONS). ``traced``: a ``sys.settrace`` function that sees the
    gateway's work of the measured turns (bench/bytecodes.py), not the benchmark's own."""
    broker = ScriptedBroker(f"inproc://gateway-cpu-{protocol}-{time.monotonic_ns()}")
    link = await attached_gateway_link(broker, TABLE, 5.0)
    sent: list[list] = []
    link.sock.send_parts = lambda parts, flags=0: sent.append(parts)   # the broker's side is played below
    loop = asyncio.get_running_loop()
    feed: list[Callable[[], None]] = []
    if protocol == "http":
        app, settings, shared = HttpApp(DataPlane(link)), HttpSettings(max_body_bytes=1 << 26), OpenConnections()
        request = http_request()
        for _ in range(clients):
            http = HttpConnection(app, settings, loop, shared, TurnSends(loop, None))   # not a socket: no ring
            http.connection_made(CountingTransport())
            feed.append(lambda http=http: http.data_received(request))
    else:
        server = GrpcServer(GrpcInferenceService(DataPlane(link)), sends=TurnSends(loop, None))
        for _ in range(GRPC_CONNECTIONS):
            client, grpc = GrpcClient(), GrpcConnection(server.shared, loop)
            grpc.connection_made(CountingTransport())
            grpc.data_received(client.preface())
            calls = clients // GRPC_CONNECTIONS   # made ahead: the clients' work is not the gateway's
            if protocol == "grpc-stream":   # a stream per client, one request on each per turn
                opening, ids = client.open_streams(calls)
                grpc.data_received(opening)
                chunks = iter([client.stream_requests(ids)] * (WARM_TURNS + turns))
            else:
                chunks = iter([b"".join(client.call() for _ in range(calls)) for _ in range(WARM_TURNS + turns)])
            feed.append(lambda grpc=grpc, chunks=chunks: grpc.data_received(next(chunks)))
    answering = 0.0

    async def turn(trace: Callable | None = None) -> None:
        nonlocal answering
        sys.settrace(trace)
        for send in feed:
            send()
        await asyncio.sleep(0)   # the link's turn-end send
        sys.settrace(None)
        started = time.process_time()
        answers = [Response(message.rid, OUTPUTS).encode([TENSOR, TENSOR])
                   for parts in sent for message in (read_record(part)[0] for part in parts) if isinstance(message, Infer)]
        sent.clear()
        answering += time.process_time() - started
        assert len(answers) == clients, f"{len(answers)} of {clients} requests reached the broker: the gateway refused some"
        sys.settrace(trace)
        link._dispatch(answers, 0)   # as a message from the broker is dispatched
        await asyncio.sleep(0)   # the connections' writes
        sys.settrace(None)

    for _ in range(WARM_TURNS):
        await turn()
    answering = 0.0
    started = time.process_time()
    for _ in range(turns):
        await turn(traced)
    spent = time.process_time() - started - answering
    link.close()
    broker.close()
    return spent / (turns * clients) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    uvloop.install()
    for protocol in ("http", "grpc", "grpc-stream"):
        rounds = [asyncio.run(measure(protocol, args.turns)) for _ in range(args.rounds)]
        print(f"{protocol:11} {min(rounds):5.1f} us per request (best of {args.rounds}; "
              f"rounds {', '.join(f'{r:.1f}' for r in rounds)})")


if __name__ == "__main__":
    main()
