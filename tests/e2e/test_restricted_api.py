"""Triton's restricted APIs: --http-restricted-api and --grpc-restricted-protocol.

One server restricts, on HTTP, the model repository (admin-key) and statistics and model
config (stats-key); on gRPC, the model repository (admin-key), inference (infer-key) and
health (health-key).
Calls without the header get Triton's refusal; with it they are served; calls of other
categories need nothing. The model repository is in a group of each flag: the two flags'
groups are separate, as on Triton.
"""

from __future__ import annotations

import json
import queue
import socket

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tritium.gateway.grpc_api import RPC_CATEGORIES
from tritium.gateway.http_api import route_category
from tests.e2e.grpc_requests import SERVING, health_check
from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model
from tests.servers import TritiumServer, run_serve
from tritium.cli import main

ADMIN = "This API is restricted, expecting header 'admin-key'"
STATS = "This API is restricted, expecting header 'stats-key'"
GRPC_ADMIN = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
GRPC_INFER = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
GRPC_HEALTH = "This protocol is restricted, expecting header 'triton-grpc-protocol-health-key'"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    add_sub_model(repository)
    with TritiumServer(repository, "--http-restricted-api=model-repository:admin-key=secret",
                       "--http-restricted-api", "statistics,model-config:stats-key=s=2",
                       "--grpc-restricted-protocol=model-repository:admin-key=secret",
                       "--grpc-restricted-protocol=inference:infer-key=go",
                       "--grpc-restricted-protocol=health:health-key=ok") as running:
        yield running


def add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return a, inputs


# -- HTTP ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"admin-key": "wrong"}, {"stats-key": "secret"}])
def test_the_repository_index_without_its_header_gets_triton_s_403(server, headers):
    status, response_headers, body = request(server.url, "POST", "/v2/repository/index", b"", headers)
    assert status == 403
    assert response_headers["content-type"] == "application/json"
    assert error_of(body) == ADMIN


def test_the_header_given_as_a_chunked_bodys_trailer_does_not_open_the_api(server):
    """Triton's answer: a trailer is not the header the API is restricted to (a proxy that sets or
    strips that header never sees a trailer)."""
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"2\r\n{}\r\n0\r\nadmin-key: secret\r\n\r\n")
        answer = b""
        while b"}" not in answer:
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 ") and error_of(body) == ADMIN


def test_the_repository_index_with_its_header_is_served(server):
    for name in ("admin-key", "Admin-Key"):  # header names are case-insensitive
        status, _, body = request(server.url, "POST", "/v2/repository/index", b"", {name: "secret"})
        assert status == 200
        assert [(m["name"], m["state"]) for m in json.loads(body)] == [("add_sub", "READY")]


def test_every_route_of_a_restricted_category_is_refused(server):
    for method, path in [("POST", "/v2/repository/models/add_sub/load"),
                         ("POST", "/v2/repository/models/add_sub/unload"),
                         ("GET", "/v2/repository/index")]:  # refused before the method is even checked
        status, _, body = request(server.url, method, path)
        assert (status, error_of(body)) == (403, ADMIN)
    for path in ["/v2/models/stats", "/v2/models/add_sub/stats", "/v2/models/add_sub/versions/1/stats",
                 "/v2/models/add_sub/config"]:
        status, _, body = request(server.url, "GET", path)
        assert (status, error_of(body)) == (403, STATS)
        status, _, _ = request(server.url, "GET", path, headers={"stats-key": "s=2"})  # a value may hold '='
        assert status == 200


def test_inference_health_and_metadata_need_no_header_on_http(server):
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
    assert client.get_model_metadata("add_sub")["name"] == "add_sub"
    a, inputs = add_sub_inputs(httpclient)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)


def test_tritonclient_http_passes_the_header(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match=ADMIN):
        client.get_model_repository_index()
    assert client.get_model_repository_index(headers={"admin-key": "secret"})[0]["name"] == "add_sub"


# -- gRPC ----------------------------------------------------------------------------------------

def test_grpc_repository_index_without_its_metadata_is_unavailable(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for headers in (None, {"admin-key": "secret"}, {"triton-grpc-protocol-admin-key": "nope"}):
        with pytest.raises(InferenceServerException) as error:
            client.get_model_repository_index(headers=headers)
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert error.value.message() == GRPC_ADMIN
    index = client.get_model_repository_index(headers={"triton-grpc-protocol-admin-key": "secret"})
    assert [model.name for model in index.models] == ["add_sub"]


def test_grpc_inference_restricted_on_its_own_key(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a, inputs = add_sub_inputs(grpcclient)
    with pytest.raises(InferenceServerException) as error:
        client.infer("add_sub", inputs, headers={"triton-grpc-protocol-admin-key": "secret"})
    assert (error.value.status(), error.value.message()) == ("StatusCode.UNAVAILABLE", GRPC_INFER)
    result = client.infer("add_sub", inputs, headers={"triton-grpc-protocol-infer-key": "go"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    # statistics are restricted on HTTP only: each flag has its own groups
    assert client.get_inference_statistics("add_sub").model_stats[0].name == "add_sub"
    health = {"triton-grpc-protocol-health-key": "ok"}
    assert client.is_server_ready(headers=health) and client.is_model_ready("add_sub", headers=health)


def test_grpc_health_checking_is_restricted_as_health(server):
    """grpc.health.v1's Check is a health RPC, as in Triton, refused with the same message."""
    for metadata in (None, [("health-key", "ok")], [("triton-grpc-protocol-health-key", "no")]):
        with pytest.raises(grpc.RpcError) as failure:
            health_check(server.grpc_url, metadata=metadata)
        assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.UNAVAILABLE, GRPC_HEALTH)
    assert health_check(server.grpc_url, metadata=[("triton-grpc-protocol-health-key", "ok")]) == SERVING


@pytest.fixture(scope="module", params=["tritium", "grpcio"])
def either_grpc_server(request, server, tmp_path_factory):
    """The restricted server, and the same flags on grpc.aio (``--grpc-server grpcio``)."""
    if request.param == "tritium":
        yield server
        return
    repository = tmp_path_factory.mktemp("repo-grpcio")
    add_sub_model(repository)
    with TritiumServer(repository, "--grpc-server", "grpcio", "--grpc-restricted-protocol=model-repository:admin-key=secret",
                       "--grpc-restricted-protocol=inference:infer-key=go",
                       "--grpc-restricted-protocol=health:health-key=ok") as running:
        yield running


@pytest.mark.parametrize("method", ["ModelInfer", "RepositoryIndex", "ServerReady"])
def test_a_grpc_request_that_does_not_parse_is_internal_before_the_restriction(either_grpc_server, method):
    """Triton 2.51 answers INTERNAL ``Unable to parse request`` to such a call, header or not: its
    gRPC library parses the request before Triton checks the restriction."""
    with grpc.insecure_channel(either_grpc_server.grpc_url) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                                   request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        with pytest.raises(grpc.RpcError) as failure:
            call(b"\xff\xff\xff", timeout=10)
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")


def test_a_restricted_inference_without_its_header_hears_only_that_whatever_it_asks(either_grpc_server):
    """A request that parses but asks what cannot be (an input without data, an unknown model) is
    refused by the restriction first, as Triton 2.51 refuses it; with the header, its own error."""
    bad = service_pb2.ModelInferRequest(model_name="add_sub")
    tensor = bad.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, 16])
    with grpc.insecure_channel(either_grpc_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        out_of_range = service_pb2.ModelInferRequest(model_name="add_sub")
        out_of_range.inputs.add(name="INPUT0", datatype="INT8", shape=[1]).contents.int_contents.append(1000)
        for request in (bad, out_of_range, service_pb2.ModelInferRequest(model_name="nosuchmodel")):
            with pytest.raises(grpc.RpcError) as failure:
                stub.ModelInfer(request, timeout=10)
            assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.UNAVAILABLE, GRPC_INFER)
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(bad, metadata=[("triton-grpc-protocol-infer-key", "go")], timeout=10)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.value.details() == "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request."


@pytest.mark.parametrize("headers, refused", [(None, True), ({"triton-grpc-protocol-infer-key": "go"}, False)])
def test_a_grpc_stream_is_restricted_as_inference(server, headers, refused):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    try:
        a, inputs = add_sub_inputs(grpcclient)
        try:
            client.async_stream_infer("add_sub", inputs)
        except InferenceServerException:
            # The refusal can close the stream before the first request is written: the
            # client then says so here, and the server's error still reaches the callback.
            assert refused
        result, error = answers.get(timeout=10)
    finally:
        client.stop_stream()
    if refused:
        assert result is None and error.status() == "StatusCode.UNAVAILABLE" and error.message() == GRPC_INFER
    else:
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


# -- the flags --------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--http-restricted-api=health:a=b", "--http-restricted-api=metadata,health:c=d"],
     "Bad option: \"--http-restricted-api\".\nrestricted api 'health' can not be specified in multiple config groups"),
    (["--grpc-restricted-protocol=inference,inference:a=b"],
     "Bad option: \"--grpc-restricted-protocol\".\nrestricted protocol 'inference' can not be specified in multiple "
     "config groups"),
    (["--http-restricted-api=everything:a=b"], "Bad option: \"--http-restricted-api\".\nunknown restricted api "
     "'everything'"),
    (["--http-restricted-api=health:a"], "--http-restricted-api option format is "
     "'<config name>:<setting>=<value>'. Got health:a"),
])
def test_a_bad_restriction_stops_serve_at_startup_with_triton_s_message(tmp_path, flags, message):
    result = run_serve(tmp_path, *flags)
    assert result.returncode == 2
    assert message in result.stderr.decode()
    gateway = CliRunner().invoke(main, ["gateway", "--broker", "tcp://127.0.0.1:1", *flags])
    assert gateway.exit_code == 2 and message in gateway.output


# -- the category tables ----------------------------------------------------------------------------

@pytest.mark.parametrize("path, category", [
    ("/v2", "metadata"), ("/v2/health/live", "health"), ("/v2/health/ready", "health"),
    ("/v2/models/m", "metadata"), ("/v2/models/m/versions/2", "metadata"), ("/v2/models/m/ready", "health"),
    ("/v2/models/m/infer", "inference"), ("/v2/models/m/versions/1/infer", "inference"),
    ("/v2/models/m/generate", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/models/m/config", "model-config"), ("/v2/models/m/stats", "statistics"), ("/v2/models/stats", "statistics"),
    ("/v2/models/m/trace/setting", "trace"), ("/v2/trace/setting", "trace"), ("/v2/logging", "logging"),
    ("/v2/repository/index", "model-repository"), ("/v2/repository/models/m/load", "model-repository"),
    ("/v2/systemsharedmemory/status", "shared-memory"), ("/v2/cudasharedmemory/region/r/register", "shared-memory"),
    ("/v2/nothing", None), ("/metrics", None),
])
def test_each_http_route_has_triton_s_category(path, category):
    assert route_category(path) == category


def test_every_grpc_method_has_a_category():
    rpcs = {name for name in vars(service_pb2_grpc.GRPCInferenceServiceServicer) if not name.startswith("_")}
    assert set(RPC_CATEGORIES) == rpcs | {"Check"}   # and grpc.health.v1's, a health RPC as in Triton
