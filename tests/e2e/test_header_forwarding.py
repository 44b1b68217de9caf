"""Triton's header forwarding: with ``--http-header-forward-pattern`` and
``--grpc-header-forward-pattern``, the headers of an inference request whose names match reach
the model as string parameters (Triton 2.51 answers the same parameters to the same requests)."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import python_model
from tests.servers import TritiumServer, run_serve

# Answers the request's parameters() text, which is what a Python model reads.
MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("P", np.array([r.parameters().encode()], dtype=np.object_))])
                for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "P", data_type: TYPE_STRING, dims: [ 1 ] } ]
'''
PATTERN = "x-|priority"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "echo_params", MODEL, CONFIG)
    return repo


@pytest.fixture(scope="module", params=["tritium", "grpcio"])
def server(request, repo):
    """Both gRPC servers; HTTP is the same either way."""
    with TritiumServer(repo, "--http-header-forward-pattern", PATTERN, "--grpc-header-forward-pattern", PATTERN,
                       "--grpc-server", request.param) as server:
        yield server


def http_parameters(server: TritiumServer, headers: dict, parameters: dict | None = None) -> str:
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    if parameters:
        body["parameters"] = parameters
    answer = requests.post(f"http://{server.url}/v2/models/echo_params/infer", json=body, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"][0]


def grpc_input() -> grpcclient.InferInput:
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return x


def test_matching_http_headers_become_parameters_with_the_names_as_sent(server):
    text = http_parameters(server, {"X-Tenant": "acme", "x-trace": "t1", "Other": "no", "XX-Partial": "p"})
    assert text == '{"X-Tenant":"acme","x-trace":"t1","XX-Partial":"p"}'


def test_a_forwarded_header_replaces_the_request_parameter_of_its_name(server):
    text = http_parameters(server, {"x-tenant": "from-header"}, {"x-tenant": "from-body", "y": 1})
    assert json.loads(text) == {"x-tenant": "from-header", "y": 1}


def test_tritonclient_http_headers_are_forwarded(server):
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    result = client.infer("echo_params", [x], headers={"x-user": "u7"}, parameters={"k": 2})
    assert json.loads(result.as_numpy("P")[0]) == {"k": 2, "x-user": "u7"}


def test_matching_grpc_metadata_becomes_parameters(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("echo_params", [grpc_input()], headers={"x-tenant": "g", "other": "o", "x-key-bin": b"\x01AB"},
                          parameters={"x-tenant": "param"}, client_timeout=30)
    # grpc-timeout and user-agent are metadata too; the pattern picks neither, and -bin values arrive decoded
    assert json.loads(result.as_numpy("P")[0]) == {"x-tenant": "g", "x-key-bin": "\x01AB"}


def test_grpc_stream_calls_forward_the_stream_metadata(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers={"x-stream": "s"})
    try:
        client.async_stream_infer("echo_params", [grpc_input()])
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    assert json.loads(result.as_numpy("P")[0]) == {"x-stream": "s"}


def test_a_header_naming_a_reserved_parameter_is_refused(server):
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    answer = requests.post(f"http://{server.url}/v2/models/echo_params/infer", json=body,
                           headers={"priority": "5"}, timeout=10)
    assert (answer.status_code, answer.json()) == (
        400, {"error": "Header 'priority' is reserved for Triton usage and cannot be forwarded."})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("echo_params", [grpc_input()], headers={"priority": "5"})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert refused.value.message() == "Header 'priority' is reserved for Triton usage and cannot be forwarded."
    assert http_parameters(server, {"x-after": "1"}) == '{"x-after":"1"}'   # and it serves on


def test_without_a_pattern_no_header_is_forwarded(repo):
    with TritiumServer(repo) as server:
        assert http_parameters(server, {"x-tenant": "acme"}, {"y": 1}) == '{"y":1}'
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.infer("echo_params", [grpc_input()], headers={"x-tenant": "g"}).as_numpy("P")[0] == b"{}"


def test_a_pattern_that_is_not_a_regular_expression_stops_startup(tmp_path):
    done = run_serve(tmp_path, "--http-header-forward-pattern", "x-(")
    assert done.returncode == 2
    assert "Invalid value for '--http-header-forward-pattern': 'x-(' is not a regular expression" in done.stderr.decode()
