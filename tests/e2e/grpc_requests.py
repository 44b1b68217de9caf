"""Serialized ModelInferRequests for the gRPC tests that speak raw HTTP/2 (tests/e2e/rawh2.py) or
need the exact bytes, the check of an add_sub answer, and gRPC health checks in raw bytes."""

from __future__ import annotations

import grpc
import numpy as np
from tritonclient.grpc import service_pb2


def add_sub_request(rows: int = 1, seed: int = 0) -> tuple[service_pb2.ModelInferRequest, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((rows, 16)).astype(np.float32) for _ in range(2))
    request = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[a.tobytes(), b.tobytes()])
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[rows, 16])
    return request, a, b


def check_add_sub(response: service_pb2.ModelInferResponse, a: np.ndarray, b: np.ndarray) -> None:
    out0, out1 = (np.frombuffer(raw, np.float32).reshape(a.shape) for raw in response.raw_output_contents)
    np.testing.assert_allclose(out0, a + b, rtol=1e-6)
    np.testing.assert_allclose(out1, a - b, rtol=1e-6)


def whoami_request(delay_ms: float) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="whoami",
                                            raw_input_contents=[np.array([[delay_ms]], np.float32).tobytes()])
    request.inputs.add(name="DELAY_MS", datatype="FP32", shape=[1, 1])
    return request.SerializeToString()


def stream_count(url: str, model: str, count: int, answers: int, cancel: bool = False) -> list[tuple]:
    """A ModelStreamInfer of one request with input COUNT (INT32 [1]): its first ``answers``
    (result, error) pairs; then the stream ends, cancelling the request if ``cancel``."""
    import queue

    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], np.int32))
    client.async_stream_infer(model, [tensor])
    received = [got.get(timeout=30) for _ in range(answers)]
    client.stop_stream(cancel_requests=cancel)
    return received


# gRPC's health checking protocol (grpc.health.v1), in the bytes Triton answers with: a
# HealthCheckResponse whose status (field 1) is SERVING (1) or NOT_SERVING (2).
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"


def health_check(url: str, service: str = "", metadata: list | None = None, body: bytes | None = None) -> bytes:
    """``grpc.health.v1.Health/Check`` asked for ``service`` (``body``: the request's bytes as
    they are); the answer's bytes, or grpc.RpcError."""
    encoded = service.encode()
    request = body if body is not None else (b"\n" + bytes([len(encoded)]) + encoded if encoded else b"")
    with grpc.insecure_channel(url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                    response_deserializer=bytes)
        return check(request, timeout=10, metadata=metadata)


def health_watch(url: str) -> grpc.RpcError:
    """The error ``grpc.health.v1.Health/Watch`` ends with (Triton does not serve it)."""
    with grpc.insecure_channel(url) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=bytes,
                                     response_deserializer=bytes)
        try:
            list(watch(b"", timeout=10))
        except grpc.RpcError as error:
            return error
    raise AssertionError("Watch answered")
