"""Hostile input: thousands of seeded, mutated requests over HTTP and gRPC to one server.

Each case is drawn from ``random.Random(SEED)``, so a failure names a case that can be
replayed. The server must answer every client's mistake with a 4xx (HTTP) or a status
other than INTERNAL/UNKNOWN (gRPC), write no traceback, stay healthy, answer a correct
request correctly afterwards, and keep its gateway's resident memory bounded.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import socket
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.e2e.rawhttp import request
from tests.models import add_sub_model
from tests.servers import TritiumServer

SEED = 20261201
MAX_INPUT_BYTES = 1024 * 1024
HTTP_CASES = 4000
GRPC_CASES = 2000

# 5xx answers Triton gives for the same client mistakes (docs/compatibility.md), by the start
# of the error text; anything else in the 5xx range fails the test.
TRITON_SAME_5XX = (
    "Unable to parse",                   # Triton answers some malformed JSON values with 500
    "Unsupported compression type",      # Triton: 501 for a Content-Encoding other than gzip/deflate
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8)
    with TritiumServer(repo, "--http-max-input-size", str(MAX_INPUT_BYTES)) as running:
        yield running


def _gateway_pid(server) -> int:
    """The gateway process: a child of ``tritium serve`` whose command is ``gateway``."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == server.process.pid and b"gateway" in cmdline:
            return int(status.parent.name)
    raise AssertionError("no gateway process under tritium serve")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _valid_body(rng: random.Random) -> dict:
    return {"id": str(rng.randrange(1000)),
            "inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                       for name in ("INPUT0", "INPUT1")]}


# -- HTTP cases ----------------------------------------------------------------------------------

_ODD_VALUES = [None, True, -1, 0, 2**63, 2**64 + 1, 1e308, -0.5, "", "x" * 300, "FP32", "BYTES", [], [[]],
               [-1, 16], [1, 2**40], {}, {"a": 1}, "\u0000", "\ud83d\ude00", [1.0] * 17, ["a"] * 16]
_KEYS = ["inputs", "outputs", "name", "datatype", "shape", "data", "parameters", "id", "binary_data",
         "binary_data_size", "classification", "sequence_id", "priority", "timeout", "shared_memory_region",
         "shared_memory_byte_size", "binary_data_output", "triton_x"]


def _mutate_json(rng: random.Random, node, depth: int = 0):
    """A random change somewhere in the tree: a value replaced, a key added or removed."""
    if isinstance(node, dict) and node and depth < 4 and rng.random() < 0.7:
        key = rng.choice(list(node))
        choice = rng.random()
        if choice < 0.2:
            del node[key]
        elif choice < 0.4:
            node[rng.choice(_KEYS)] = rng.choice(_ODD_VALUES)
        else:
            node[key] = _mutate_json(rng, node[key], depth + 1)
        return node
    if isinstance(node, list) and node and depth < 4 and rng.random() < 0.7:
        index = rng.randrange(len(node))
        node[index] = _mutate_json(rng, node[index], depth + 1)
        return node
    return rng.choice(_ODD_VALUES)


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        choice = rng.random()
        position = rng.randrange(len(data) + 1)
        if choice < 0.4 and data:
            data[min(position, len(data) - 1)] = rng.randrange(256)
        elif choice < 0.7:
            data[position:position] = rng.randbytes(rng.randint(1, 8))
        else:
            del data[position:position + rng.randint(1, 16)]
    return bytes(data)


def _binary_case(rng: random.Random) -> tuple[str, bytes, dict]:
    """A binary-extension body whose header length, declared sizes or tensor bytes are off."""
    header = {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16],
                          "parameters": {"binary_data_size": rng.choice([64, 64, 0, 63, 65, -1, 2**40, "64"])}}
                         for name in ("INPUT0", "INPUT1")]}
    if rng.random() < 0.3:
        header = _mutate_json(rng, header)
    encoded = json.dumps(header).encode()
    tensors = rng.randbytes(rng.choice([128, 128, 0, 127, 129, 4096]))
    length = rng.choice([len(encoded), len(encoded), 0, len(encoded) - 1, len(encoded) + 1,
                         len(encoded) + len(tensors) + 10, -5, "abc", 2**63])
    return "/v2/models/add_sub/infer", encoded + tensors, {"Inference-Header-Content-Length": str(length),
                                                           "Content-Type": "application/octet-stream"}


_PATHS = ["/v2/models/add_sub/infer", "/v2/models/add_sub/versions/1/infer", "/v2/models/add_sub",
          "/v2/models/add_sub/config", "/v2/models/add_sub/ready", "/v2/models/add_sub/stats",
          "/v2/models/add_sub/versions/x/infer", "/v2/models/add_sub/versions/99999999999999999999/infer",
          "/v2/models/%00/infer", "/v2/models/%ZZ/infer", "/v2/models/" + "a" * 5000 + "/infer",
          "/v2/models//infer", "/v2/models/add_sub/infer?x=%", "/v2/../etc/passwd", "/v2/models/add_sub/generate",
          "/v2/models/add_sub/generate_stream", "/v2/systemsharedmemory/region/r/status",
          "/v2/cudasharedmemory/status", "/v2/repository/index", "/v2/trace/setting", "/", "*", "/v2/health/x"]


def _http_case(rng: random.Random) -> tuple[str, str, bytes, dict]:
    kind = rng.random()
    if kind < 0.45:
        body = json.dumps(_mutate_json(rng, _valid_body(rng))).encode()
        return "POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"}
    if kind < 0.6:
        return "POST", "/v2/models/add_sub/infer", _mutate_bytes(rng, json.dumps(_valid_body(rng)).encode()), {}
    if kind < 0.75:
        path, body, headers = _binary_case(rng)
        return "POST", path, body, headers
    if kind < 0.85:
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])
        return method, rng.choice(_PATHS), rng.choice([b"", b"{}", b"[", rng.randbytes(32)]), {}
    headers = rng.choice([{"Content-Encoding": "gzip"}, {"Content-Encoding": "deflate"},
                          {"Content-Encoding": "br"}, {"Content-Type": "\x7f"},
                          {"Inference-Header-Content-Length": "1e3"}, {"X-" + "a" * 2000: "b"},
                          {"Expect": "100-continue"}, {"Accept-Encoding": "gzip;q=x"}])
    return "POST", "/v2/models/add_sub/infer", rng.choice([rng.randbytes(64), b"\x1f\x8b" + rng.randbytes(30)]), headers


def _send_http(connection: http.client.HTTPConnection, method, path, body, headers) -> tuple[int, bytes]:
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()


def _raw_socket_case(url: str, rng: random.Random) -> bytes:
    """Bytes no HTTP client sends: junk request lines, lying lengths, bodies cut short."""
    host, port = url.split(":")
    body = json.dumps(_valid_body(rng)).encode()
    choice = rng.random()
    if choice < 0.3:
        data = rng.randbytes(rng.randint(1, 200)) + b"\r\n\r\n"
    elif choice < 0.6:   # declares more than it sends, then the client goes away
        data = (f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                f"{rng.choice([len(body) + 10, MAX_INPUT_BYTES // 2, MAX_INPUT_BYTES * 4])}\r\n\r\n").encode() + body
    elif choice < 0.8:   # chunked with broken chunk sizes
        data = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + rng.choice([b"zz\r\n", b"ffffffffffffffff\r\n", b"5\r\nabc\r\n0\r\n\r\n", b"-1\r\n"]))
    else:                # both a length and chunked, or two lengths
        data = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n"
                + rng.choice([b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                              b"Content-Length: 5\r\nContent-Length: 6\r\n"]) + b"\r\n" + body)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def _error_text(body: bytes) -> str:
    try:
        return json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


def _assert_no_server_error(failures: list, what, status: int, body: bytes, sent: bytes) -> None:
    if status >= 500 and not _error_text(body).startswith(TRITON_SAME_5XX):
        failures.append((what, status, body[:300]))


def _large_bodies(server, rng: random.Random) -> None:
    """Bodies near and over the limit, complete and broken: what a gateway might keep."""
    for size in (MAX_INPUT_BYTES - 100, MAX_INPUT_BYTES + 2 * 1024 * 1024):
        padding = base64.b64encode(rng.randbytes(size * 3 // 4)).decode()
        body = json.dumps({**_valid_body(rng), "parameters": {"pad": padding}}).encode()
        for _ in range(5):
            status, _, _ = request(server.url, "POST", "/v2/models/add_sub/infer", body=body)
            assert status < 500


def test_hostile_http_and_grpc_requests_leave_the_server_healthy(server):
    rng = random.Random(SEED)
    gateway = _gateway_pid(server)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    for _ in range(200):  # warm-up: caches, allocator pools, the first-request paths
        assert _send_http(connection, "POST", "/v2/models/add_sub/infer",
                          json.dumps(_valid_body(rng)).encode(), {})[0] == 200
    _large_bodies(server, rng)
    with grpc.insecure_channel(server.grpc_url) as channel:  # the gRPC server's first-use allocations
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(50):
            message = service_pb2.ModelInferRequest(model_name="add_sub")
            for name in ("INPUT0", "INPUT1"):
                message.inputs.add(name=name, datatype="FP32", shape=[1, 16])
                message.raw_input_contents.append(np.ones(16, np.float32).tobytes())
            stub.ModelInfer(message, timeout=10)
    baseline_kib = _rss_kib(gateway)

    failures: list = []
    answered = 0
    started = time.monotonic()
    for index in range(HTTP_CASES):
        method, path, body, headers = _http_case(rng)
        try:
            status, answer = _send_http(connection, method, path, body, headers)
        except (http.client.HTTPException, OSError):  # the server may close after a bad request
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            continue
        answered += 1
        _assert_no_server_error(failures, (index, method, path[:80], body[:120], headers), status, answer, body)
        if status >= 400 or headers:  # a fresh connection after a mistake, as a client would
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    for index in range(150):
        answer = _raw_socket_case(server.url, rng)
        if answer.startswith(b"HTTP/1.1 5"):
            failures.append((f"raw {index}", answer[:300]))
    _large_bodies(server, rng)
    connection.close()
    http_seconds = time.monotonic() - started

    failures += _grpc_fuzz(server, rng)
    assert answered > HTTP_CASES // 2   # most cases were answered, not cut off
    assert not failures, failures[:10]

    logs = server.logs()
    assert "Traceback" not in logs and "internal error" not in logs
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200
    a = np.arange(16, dtype=np.float32)
    status, _, body = request(server.url, "POST", "/v2/models/add_sub/infer", body={
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a.tolist()},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]})
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert status == 200 and outputs["OUTPUT0"] == (a + 1).tolist() and outputs["OUTPUT1"] == (a - 1).tolist()
    assert _rss_kib(gateway) < 2 * baseline_kib, (baseline_kib, _rss_kib(gateway), http_seconds)


# -- gRPC cases ----------------------------------------------------------------------------------

_GRPC_FIELDS = {
    "model_name": ["add_sub", "", "nope", "a" * 1000, "add_sub\x00"],
    "model_version": ["", "1", "2", "x", "-1", "99999999999999999999"],
    "datatype": ["FP32", "FP16", "BYTES", "INT64", "", "NOPE", "BF16"],
    "shape": [[1, 16], [16], [1, 17], [0, 16], [-1, 16], [2**40, 16], [], [1, 16, 1]],
    "raw_size": [64, 64, 0, 63, 65, 1024],
    "name": ["INPUT0", "INPUT1", "", "OUTPUT0", "x"],
}
_PARAMETER_KINDS = [("bool_param", True), ("int64_param", -3), ("int64_param", 2**62), ("string_param", "x"),
                    ("double_param", float("nan")), ("uint64_param", 2**64 - 1)]
_PARAMETER_KEYS = ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                   "triton_enable_empty_final_response", "triton_x", "shared_memory_region",
                   "shared_memory_byte_size", "shared_memory_offset", "classification", "custom"]


def _grpc_request(rng: random.Random) -> service_pb2.ModelInferRequest:
    def pick(field, correct):
        return rng.choice(_GRPC_FIELDS[field]) if rng.random() < 0.15 else correct

    message = service_pb2.ModelInferRequest(model_name=pick("model_name", "add_sub"),
                                            model_version=pick("model_version", ""))
    for name in ("INPUT0", "INPUT1")[:rng.choice([2, 2, 2, 1, 0])]:
        tensor = message.inputs.add(name=pick("name", name), datatype=pick("datatype", "FP32"),
                                    shape=pick("shape", [1, 16]))
        if rng.random() < 0.1:
            tensor.contents.fp32_contents.extend([1.0] * rng.choice([16, 15, 0]))
        else:
            message.raw_input_contents.append(rng.randbytes(pick("raw_size", 64)))
        if rng.random() < 0.1:
            kind, value = rng.choice(_PARAMETER_KINDS)
            setattr(tensor.parameters[rng.choice(_PARAMETER_KEYS)], kind, value)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        kind, value = rng.choice(_PARAMETER_KINDS)
        setattr(message.parameters[rng.choice(_PARAMETER_KEYS)], kind, value)
    for _ in range(rng.choice([0, 0, 0, 1])):
        output = message.outputs.add(name=rng.choice(["OUTPUT0", "OUTPUT1", "nope", ""]))
        if rng.random() < 0.5:
            kind, value = rng.choice(_PARAMETER_KINDS)
            setattr(output.parameters[rng.choice(_PARAMETER_KEYS)], kind, value)
    if rng.random() < 0.05:
        message.raw_input_contents.append(b"extra")
    return message


_BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}


def _grpc_fuzz(server, rng: random.Random) -> list:
    failures = []
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        methods = [channel.unary_unary(f"/inference.GRPCInferenceService/{name}")
                   for name in ("ModelInfer", "ModelMetadata", "ModelConfig", "ModelReady", "ModelStatistics",
                                "RepositoryIndex", "SystemSharedMemoryStatus")]
        for index in range(GRPC_CASES):
            try:
                if rng.random() < 0.15:  # bytes that may or may not parse as the method's message
                    rng.choice(methods)(_mutate_bytes(rng, _grpc_request(rng).SerializeToString()), timeout=10)
                else:
                    stub.ModelInfer(_grpc_request(rng), timeout=10)
            except grpc.RpcError as error:
                if error.code() in _BAD_CODES and error.details() != "Unable to parse request":
                    failures.append((f"grpc {index}", error.code(), error.details()))
        answers = list(stub.ModelStreamInfer(iter([_grpc_request(rng) for _ in range(100)]), timeout=30))
        assert len(answers) == 100
        failures += [("stream", answer.error_message) for answer in answers
                     if answer.error_message.startswith("internal error")]
    return failures
