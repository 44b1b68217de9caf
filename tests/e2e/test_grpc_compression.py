"""``--grpc-infer-response-compression-level``: inference responses go out compressed in the encoding
the level prefers among those the client accepts (high: deflate, then gzip), as Triton 2.51 sends
them; other calls and clients that accept neither get them plain."""

from __future__ import annotations

import gzip
import queue
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.e2e.grpc_requests import check_add_sub
from tests.e2e.rawh2 import DATA, END_STREAM, INITIAL_WINDOW_SIZE, WINDOW_UPDATE, RawH2, grpc_message
from tests.models import PYTHON_IDENTITY, add_sub_inputs, add_sub_model, python_model
from tests.servers import TritiumServer

DECOMPRESS = {b"gzip": gzip.decompress, b"deflate": zlib.decompress}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub")
    python_model(repo, "identity", PYTHON_IDENTITY, """backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
""")
    with TritiumServer(repo, "--grpc-infer-response-compression-level=high") as running:
        yield running


def compressible_request(rows: int = 8) -> tuple[service_pb2.ModelInferRequest, np.ndarray, np.ndarray]:
    """add_sub on repeating values, whose answer compresses (random floats barely do, and gRPC
    sends a message compression would not shrink as it is)."""
    a = np.tile(np.arange(16, dtype=np.float32), (rows, 1))
    b = np.ones((rows, 16), np.float32)
    request = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[a.tobytes(), b.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[rows, 16])
    return request, a, b


def encoding_of(answer) -> bytes | None:
    return next((value for block in answer.headers for name, value in block if name == b"grpc-encoding"), None)


def response_of(answer, encoding: bytes | None) -> service_pb2.ModelInferResponse:
    flag, payload = answer.data[0], answer.data[5:]
    assert flag == (0 if encoding is None else 1)
    response = service_pb2.ModelInferResponse()
    response.ParseFromString(payload if encoding is None else DECOMPRESS[encoding](payload))
    if encoding is not None:
        assert len(payload) < response.ByteSize()
    return response


@pytest.mark.parametrize("accepted, encoding", [("identity,deflate,gzip", b"deflate"), ("identity,gzip", b"gzip"),
                                                ("identity", None), (None, None)])
def test_an_inference_response_is_compressed_as_the_client_accepts(server, accepted, encoding):
    request, a, b = compressible_request()
    raw = RawH2(server.grpc_url)
    try:
        answer = raw.call("ModelInfer", request.SerializeToString(),
                          (("grpc-accept-encoding", accepted),) if accepted else ())
    finally:
        raw.close()
    assert answer.status == 0 and encoding_of(answer) == encoding
    check_add_sub(response_of(answer, encoding), a, b)


def test_stream_responses_are_compressed_and_other_calls_are_not(server):
    request, a, b = compressible_request()
    raw = RawH2(server.grpc_url)
    try:
        stream = raw.start_call("ModelStreamInfer", (("grpc-accept-encoding", "identity,deflate,gzip"),))
        raw.send(DATA, END_STREAM, stream, grpc_message(request.SerializeToString()))
        streamed = raw.wait(stream)
        live = raw.call("ServerLive", b"", (("grpc-accept-encoding", "identity,deflate,gzip"),))
    finally:
        raw.close()
    assert encoding_of(streamed) == b"deflate" and streamed.data[0] == 1
    message = service_pb2.ModelStreamInferResponse()
    message.ParseFromString(zlib.decompress(streamed.data[5:]))
    check_add_sub(message.infer_response, a, b)
    assert encoding_of(live) is None and live.data[0] == 0


def test_tritonclient_reads_compressed_answers(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("add_sub", add_sub_inputs(a, b))
        streamed, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(streamed.as_numpy("OUTPUT1"), a - b)


def large(seed: int) -> np.ndarray:
    """800 KB that compresses: above the size the gateway compresses on its zlib threads."""
    return np.tile(np.arange(1000, dtype=np.float32) + seed, 200)


def identity_request(values: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity", raw_input_contents=[values.tobytes()])
    request.inputs.add(name="IN", datatype="FP32", shape=[len(values)])
    return request


def test_large_answers_are_compressed_whole_and_keep_their_order_on_a_stream(server):
    sent = [large(1), np.full(256, 5, np.float32), large(2)]   # the small one on the event loop
    raw = RawH2(server.grpc_url, settings={INITIAL_WINDOW_SIZE: 1 << 24})
    try:
        raw.send(WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big"))
        stream = raw.start_call("ModelStreamInfer", (("grpc-accept-encoding", "identity,deflate,gzip"),))
        send_in_frames(raw, stream, b"".join(grpc_message(identity_request(v).SerializeToString()) for v in sent))
        streamed = raw.wait(stream)
        call = raw.start_call("ModelInfer", (("grpc-accept-encoding", "identity,gzip"),))
        send_in_frames(raw, call, grpc_message(identity_request(large(3)).SerializeToString()))
        unary = raw.wait(call)
    finally:
        raw.close()
    assert streamed.status == 0 and encoding_of(streamed) == b"deflate"
    frames = framed_messages(streamed.data)
    assert [flag for flag, _ in frames] == [1, 1, 1]
    for (_, payload), values in zip(frames, sent):
        message = service_pb2.ModelStreamInferResponse()
        message.ParseFromString(zlib.decompress(payload))
        assert message.error_message == ""
        np.testing.assert_array_equal(np.frombuffer(message.infer_response.raw_output_contents[0], np.float32), values)
    assert unary.status == 0 and encoding_of(unary) == b"gzip"
    response = response_of(unary, b"gzip")
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), large(3))


def compressed_message(payload: bytes) -> bytes:
    return grpc_message(gzip.compress(payload), flag=1)


def test_large_compressed_requests_are_inflated_and_taken_in_order(server):
    """A stream's requests: a large compressed one (inflated on a thread), a plain one behind
    it, another large one; then a unary call with a large compressed request, and one whose
    bytes do not inflate, after which the connection still serves."""
    sent = [np.random.default_rng(5).standard_normal(200_000).astype(np.float32), np.full(4, 3, np.float32),
            np.random.default_rng(6).standard_normal(200_000).astype(np.float32)]
    raw = RawH2(server.grpc_url, settings={INITIAL_WINDOW_SIZE: 1 << 24})
    try:
        raw.send(WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big"))
        stream = raw.start_call("ModelStreamInfer", (("grpc-encoding", "gzip"),))
        wires = [identity_request(v).SerializeToString() for v in sent]
        send_in_frames(raw, stream, compressed_message(wires[0]) + grpc_message(wires[1]) + compressed_message(wires[2]))
        streamed = raw.wait(stream)
        call = raw.start_call("ModelInfer", (("grpc-encoding", "gzip"),))
        send_in_frames(raw, call, compressed_message(wires[2]))
        unary = raw.wait(call)
        corrupt = bytearray(compressed_message(wires[0]))
        corrupt[20:] = np.random.default_rng(9).integers(0, 256, len(corrupt) - 20, dtype=np.uint8).tobytes()
        bad = raw.start_call("ModelInfer", (("grpc-encoding", "gzip"),))
        send_in_frames(raw, bad, bytes(corrupt))
        refused = raw.wait(bad)
        live = raw.call("ServerLive", b"")
    finally:
        raw.close()
    assert streamed.status == 0
    for payload, values in zip(streamed.messages, sent, strict=True):
        message = service_pb2.ModelStreamInferResponse()
        message.ParseFromString(payload)
        assert message.error_message == ""
        np.testing.assert_array_equal(np.frombuffer(message.infer_response.raw_output_contents[0], np.float32), values)
    assert unary.status == 0
    response = response_of(unary, None)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), sent[2])
    assert refused.status == 13 and refused.message.startswith("the message cannot be decompressed: ")
    assert live.status == 0


def send_in_frames(raw: RawH2, stream: int, data: bytes, size: int = 16384) -> None:
    """``data`` in DATA frames of HTTP/2's default largest size, the last ending the stream."""
    for start in range(0, len(data), size):
        raw.send(DATA, END_STREAM if start + size >= len(data) else 0, stream, data[start:start + size])


def framed_messages(data: bytes) -> list[tuple[int, bytes]]:
    """(compressed flag, payload) of each gRPC message in ``data``."""
    out = []
    while data:
        length = int.from_bytes(data[1:5], "big")
        out.append((data[0], data[5:5 + length]))
        data = data[5 + length:]
    return out
