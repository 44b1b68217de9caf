"""Health, metadata, config and statistics endpoints, with Triton's status codes and bodies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model
from tests.servers import TritiumServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8)
    with TritiumServer(repo) as running:
        yield running


def test_health_endpoints_answer_200_with_empty_body(server):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/add_sub/ready",
                 "/v2/models/add_sub/versions/1/ready"):
        status, _, body = request(server.url, "GET", path)
        assert (status, body) == (200, b""), path


def test_server_metadata_lists_exactly_the_implemented_extensions(server):
    status, headers, body = request(server.url, "GET", "/v2")
    assert status == 200 and headers["content-type"] == "application/json"
    metadata = json.loads(body)
    assert metadata["name"] == "triton"
    assert metadata["extensions"] == ["classification", "sequence", "model_repository",
                                     "model_repository(unload_dependents)", "model_configuration",
                                     "system_shared_memory", "binary_tensor_data", "parameters", "statistics",
                                     "trace", "logging"]


def test_model_metadata_has_batch_dimension_and_protocol_datatypes(server):
    for path in ("/v2/models/add_sub", "/v2/models/add_sub/versions/1"):
        status, _, body = request(server.url, "GET", path)
        assert status == 200
        assert json.loads(body) == {
            "name": "add_sub", "versions": ["1"], "platform": "onnxruntime_onnx",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                        {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]}]}


def test_model_config_is_the_completed_config_with_defaults(server):
    config = httpclient.InferenceServerClient(server.url).get_model_config("add_sub")
    assert config["max_batch_size"] == 8
    assert config["backend"] == "onnxruntime" and config["platform"] == "onnxruntime_onnx"
    assert config["input"][0]["dims"] == [16] and config["input"][0]["optional"] is False
    assert config["instance_group"] == [{"name": "add_sub_0", "kind": "KIND_CPU", "count": 1, "gpus": [],
                                         "secondary_devices": [], "profile": [], "passive": False,
                                         "host_policy": ""}]
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert "dynamic_batching" not in config and config["model_warmup"] == []


@pytest.mark.parametrize("path, message", [
    ("/v2/models/nope", "Request for unknown model: 'nope' is not found"),
    ("/v2/models/add_sub/versions/7", "Request for unknown model: 'add_sub' version 7 is not found"),
    ("/v2/models/nope/config", "Request for unknown model: 'nope' is not found"),
])
def test_unknown_models_and_versions_are_404_with_triton_messages(server, path, message):
    status, _, body = request(server.url, "GET", path)
    assert status == 404
    assert error_of(body) == message


@pytest.mark.parametrize("path", ["/v2/models/nope/ready", "/v2/models/nope/versions/1/ready",
                                  "/v2/models/add_sub/versions/7/ready"])
def test_readiness_of_an_unknown_model_or_version_is_not_ready_as_triton_answers_it(server, path):
    """Triton 2.51's readiness answers 400 for anything not ready, names it does not know included."""
    status, _, body = request(server.url, "GET", path)
    assert (status, error_of(body)) == (400, "Model version not ready")


@pytest.mark.parametrize("method, path", [
    ("GET", "/v2/models/add_sub/infer"), ("POST", "/v2/health/live"), ("POST", "/v2"),
    ("POST", "/v2/models/add_sub/config"), ("DELETE", "/v2/models/add_sub"),
])
def test_wrong_method_is_405(server, method, path):
    status, _, body = request(server.url, method, path)
    assert status == 405 and error_of(body) == "Method Not Allowed"


@pytest.mark.parametrize("path", ["/v2/models", "/v2/health", "/v2/models/add_sub/versions/one",
                                  "/v2/models/add_sub/", "/metrics", "/"])
def test_paths_triton_does_not_route_are_404_not_found(server, path):
    status, _, body = request(server.url, "GET", path)
    assert status == 404 and error_of(body) == "Not Found"


def test_statistics_count_requests_inferences_and_executions(server):
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]
    a = np.ones((3, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    for _ in range(2):
        client.infer("add_sub", inputs)
    after = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    assert after["name"] == "add_sub" and after["version"] == "1"
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_stats"]["queue"]["count"] == after["inference_stats"]["success"]["count"]
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] > 0
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sizes.get(3, 0) >= 2


def test_statistics_errors_and_all_models(server):
    status, _, body = request(server.url, "GET", "/v2/models/stats")
    assert status == 200 and [s["name"] for s in json.loads(body)["model_stats"]] == ["add_sub"]
    status, _, body = request(server.url, "GET", "/v2/models/nope/stats")
    assert status == 400 and error_of(body) == "requested model 'nope' is not available"
    status, _, body = request(server.url, "GET", "/v2/models/add_sub/versions/3/stats")
    assert status == 400 and error_of(body) == "requested model version is not available for model 'add_sub'"


def test_model_trace_setting_is_served(server):
    status, _, body = request(server.url, "GET", "/v2/models/add_sub/trace/setting")
    assert status == 200 and json.loads(body)["trace_level"] == ["OFF"]   # tests/e2e/test_trace.py has the rest


@pytest.mark.parametrize("operation", ["load", "unload"])
def test_load_and_unload_are_refused_in_the_default_control_mode(server, operation):
    status, _, body = request(server.url, "POST", f"/v2/repository/models/add_sub/{operation}")
    assert (status, error_of(body)) == (503, "explicit model load / unload is not allowed if polling is enabled")
    assert request(server.url, "GET", "/v2/models/add_sub/ready")[0] == 200


@pytest.mark.parametrize("suffix", ["", "/stats", "/ready", "/config"])
def test_a_version_beyond_int64_is_refused_as_triton_refuses_it(server, suffix):
    huge = "18446744073709551616"
    status, _, body = request(server.url, "GET", f"/v2/models/add_sub/versions/{huge}{suffix}")
    assert (status, error_of(body)) == (400, f"failed to get model version from specified version string "
                                             f"'{huge}' (details: stol), version should be an integral value > 0")


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/add_sub/trace/setting"])
def test_tracing_cannot_be_turned_on_without_a_trace_file_as_in_triton(server, path):
    """This server was started with no --trace-config: no file to write traces to."""
    status, _, data = request(server.url, "POST", path, {"trace_level": ["TIMESTAMPS"]})
    assert (status, error_of(data)) == (400, "Attempting to set invalid trace setting :trace file name is not given")
    assert json.loads(request(server.url, "GET", path)[2])["trace_level"] == ["OFF"]
    status, _, data = request(server.url, "POST", path, {"trace_level": ["OFF"], "trace_rate": "0"})
    assert status == 200 and json.loads(data)["trace_rate"] == "0"   # tracing stays off: any settings go
    assert request(server.url, "POST", path, {"trace_rate": None})[0] == 200


def _add_sub_body(rows: int = 1, **extra) -> dict:
    data = [1.0] * (16 * rows)
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": [rows, 16], "data": data}
                       for name in ("INPUT0", "INPUT1")], **extra}


@pytest.mark.parametrize("key, value", [("priority", -1), ("priority", "1"), ("priority", 1.5), ("priority", True),
                                        ("timeout", -1), ("timeout", "5"), ("timeout", True)])
def test_priority_and_timeout_must_be_unsigned_integers_as_triton_reads_them(server, key, value):
    status, _, data = request(server.url, "POST", "/v2/models/add_sub/infer",
                              _add_sub_body(parameters={key: value}))
    assert (status, error_of(data)) == (
        500, f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer")
    status, _, _ = request(server.url, "POST", "/v2/models/add_sub/infer", _add_sub_body(parameters={key: 3}))
    assert status == 200


def test_an_output_named_twice_is_answered_once(server):
    body = _add_sub_body(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])
    status, _, data = request(server.url, "POST", "/v2/models/add_sub/infer", body)
    assert status == 200
    assert [output["name"] for output in json.loads(data)["outputs"]] == ["OUTPUT0"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT1")]
    response = client.infer("add_sub", inputs, outputs=outputs).get_response()
    assert [output.name for output in response.outputs] == ["OUTPUT1"]
    assert len(response.raw_output_contents) == 1
    client.close()


def test_a_batch_of_zero_is_refused(server):
    status, _, data = request(server.url, "POST", "/v2/models/add_sub/infer", _add_sub_body(rows=0))
    assert (status, error_of(data)) == (400, "[request id: <id_unknown>] inference request batch-size must be >= 1 for 'add_sub'")
