"""The gateway's reading of a large gRPC request, in-process: HTTP/2 frames to the request.

Feeds ``Http2Connection.receive`` the bytes a client sends for one ModelInfer call with a
600 KB FP32 image (HEADERS, then the message in DATA frames of ``--frame`` bytes), cut into
reads of ``--read`` bytes as the event loop would hand them over, and reads each message with
the gateway's ``MessageReader`` and ``InferRequestReader``. Prints the CPU time per request:
what the gateway spends between its socket and the request it validates, with the machine's
noise (other processes, wake-ups) left out.

    python -m bench.grpc_receive [--frame 16384] [--read 262144] [--requests 2000]

perf_analyzer's gRPC client sends such a request as one DATA frame of the whole message, and
the event loop reads 256 KB at a time.
"""

from __future__ import annotations

import argparse
import time

import hpack
import numpy as np
from tritonclient.grpc import service_pb2

from tritium.gateway.grpc_codec import InferRequestReader
from tritium.gateway.grpc_http2 import DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, Http2Connection, frame
from tritium.gateway.grpc_wire import MessageReader
from tritium.gctune import reuse_large_buffers


def request_bytes(frame_size: int, stream_id: int, encoder: hpack.Encoder) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="classify")
    tensor = request.inputs.add(name="PIXELS", datatype="FP32", shape=[1, 3, 224, 224])
    del tensor
    request.raw_input_contents.append(np.random.default_rng(0).random((1, 3, 224, 224), np.float32).tobytes())
    message = request.SerializeToString()
    message = b"\0" + len(message).to_bytes(4, "big") + message
    headers = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                              (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")])
    pieces = [frame(HEADERS, END_HEADERS, stream_id, headers)]
    for start in range(0, len(message), frame_size):
        last = start + frame_size >= len(message)
        pieces.append(frame(DATA, END_STREAM if last else 0, stream_id, message[start:start + frame_size]))
    return b"".join(pieces)


def measure(frame_size: int, read_size: int, requests: int) -> float:
    """CPU microseconds per request."""
    encoder = hpack.Encoder()
    readers: dict[int, MessageReader] = {}
    decoder = InferRequestReader()
    decoded = []

    def on_headers(stream_id, headers, end_stream):
        readers[stream_id] = MessageReader(64 * 1024 * 1024, None)

    def on_data(stream_id, data, end_stream):
        for message in readers[stream_id].feed(data):
            decoded.append(decoder.read(message))
        if end_stream:
            del readers[stream_id]
            decoded.clear()

    connection = Http2Connection(on_headers, on_data, lambda *a: None, lambda *a: None, lambda: None,
                                 window=1 << 30, max_frame=1 << 20)
    connection.receive(PREFACE + frame(SETTINGS, 0, 0, b""))
    wire = [request_bytes(frame_size, 2 * index + 1, encoder) for index in range(requests)]
    start = time.process_time()
    for stream in wire:
        for position in range(0, len(stream), read_size):
            connection.receive(stream[position:position + read_size])
        connection.data_to_send()
    return (time.process_time() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frame", type=int, nargs="*", default=[16384, 1 << 20])
    parser.add_argument("--read", type=int, default=256 * 1024)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reuse_large_buffers()   # as a serving gateway does
    for frame_size in args.frame:
        rounds = [measure(frame_size, args.read, args.requests) for _ in range(args.rounds)]
        print(f"DATA frames of {frame_size} bytes, reads of {args.read}: {min(rounds):.1f} us per 600 KB request "
              f"(best of {args.rounds}; rounds {', '.join(f'{r:.1f}' for r in rounds)})")


if __name__ == "__main__":
    main()
