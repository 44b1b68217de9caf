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
from tests.e2e.rawh2 import DATA, END_STREAM, RawH2, grpc_message
from tests.models import add_sub_inputs, add_sub_model
from tests.servers import TritiumServer

DECOMPRESS = {b"gzip": gzip.decompress, b"deflate": zlib.decompress}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub")
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
