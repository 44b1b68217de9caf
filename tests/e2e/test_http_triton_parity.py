"""HTTP details where tritium answers what Triton 2.51 answers (each expected value was read from
Triton on the same Python models): raw binary requests, response compression, duplicate keys and
binary-data switches, error texts of model errors, generate_stream and shared memory."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.rawhttp import error_of, request
from tests.models import PYTHON_IDENTITY as IDENTITY, write_config
from tests.servers import TritiumServer

PYTHON_MODELS = Path(__file__).parent / "python_repo"
RAW = {"Inference-Header-Content-Length": "0"}
DECOUPLED_FAILURE = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([7], np.int32))]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("decoupled failure")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def python_model(repo: Path, name: str, datatype: str, dims: str, max_batch_size: int = 0,
                 source: str = IDENTITY, extra: str = "") -> None:
    write_config(repo / name, f"""backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN", data_type: {datatype}, dims: [ {dims} ] }} ]
output [ {{ name: "OUT", data_type: {datatype}, dims: [ {dims} ] }} ]
{extra}""")
    (repo / name / "1").mkdir(exist_ok=True)
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "fixed", "TYPE_FP32", "2, 3")
    python_model(repo, "var", "TYPE_FP32", "-1")
    python_model(repo, "batched_var", "TYPE_FP32", "-1", max_batch_size=8)
    python_model(repo, "text", "TYPE_STRING", "1")
    python_model(repo, "decoupled_failure", "TYPE_INT32", "1", source=DECOUPLED_FAILURE,
                 extra="model_transaction_policy { decoupled: true }")
    for name in ("py_add_sub", "py_errors"):
        shutil.copytree(PYTHON_MODELS / name, repo / name)
    with TritiumServer(repo, "--allow-client-shm=true") as running:
        yield running


def floats(values) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


def split(headers: dict, body: bytes) -> tuple[dict, bytes]:
    length = int(headers["inference-header-content-length"])
    return json.loads(body[:length]), body[length:]


# -- raw binary requests -----------------------------------------------------------------------

def test_a_raw_body_is_the_single_input_and_every_output_comes_back_binary(server):
    status, headers, body = request(server.url, "POST", "/v2/models/fixed/infer", floats(range(6)), RAW)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    header, data = split(headers, body)
    assert header == {"model_name": "fixed", "model_version": "1", "outputs": [
        {"name": "OUT", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
    assert data == floats(range(6))


def test_a_raw_body_fills_the_variable_dim_and_a_batch_of_one(server):
    status, headers, body = request(server.url, "POST", "/v2/models/batched_var/infer", floats([1, 2, 3, 4, 5]), RAW)
    header, data = split(headers, body)
    assert (status, header["outputs"][0]["shape"], data) == (200, [1, 5], floats([1, 2, 3, 4, 5]))


def test_a_raw_body_for_a_bytes_input_is_one_element(server):
    status, headers, body = request(server.url, "POST", "/v2/models/text/infer", b"hello:world", RAW)
    header, data = split(headers, body)
    assert (status, header["outputs"][0]["shape"], data) == (200, [1], struct.pack("<I", 11) + b"hello:world")


def test_a_compressed_raw_body_is_decompressed_first(server):
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer", gzip.compress(floats([1, 2])),
                                    {**RAW, "Content-Encoding": "gzip"})
    assert status == 200 and split(headers, body)[1] == floats([1, 2])


@pytest.mark.parametrize("model, body, message", [
    ("py_add_sub", floats(range(32)),
     "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
     "'py_add_sub' model configuration"),
    ("fixed", floats(range(5)),
     "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'fixed'. Expected 24, got 20"),
    ("var", floats(range(5)) + b"xy",
     "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'var'. Expected 20, got 22"),
])
def test_a_raw_body_the_model_cannot_take_is_a_400_in_tritons_words(server, model, body, message):
    status, _, data = request(server.url, "POST", f"/v2/models/{model}/infer", body, RAW)
    assert (status, error_of(data)) == (400, message)


# -- response compression --------------------------------------------------------------------------

JSON_REQUEST = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}
JSON_ANSWER = {"model_name": "var", "model_version": "1",
               "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]}]}


@pytest.mark.parametrize("accept, encoding, decompress", [
    ("gzip", "gzip", gzip.decompress), ("deflate", "deflate", zlib.decompress),
    ("deflate;q=0.5, gzip;q=0.9", "gzip", gzip.decompress)])
def test_an_inference_response_is_compressed_as_asked(server, accept, encoding, decompress):
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer", JSON_REQUEST,
                                    {"Accept-Encoding": accept})
    assert (status, headers["content-encoding"], headers["content-type"]) == (200, encoding, "application/json")
    assert int(headers["content-length"]) == len(body)
    assert json.loads(decompress(body)) == JSON_ANSWER


def test_a_compressed_binary_response_gives_the_uncompressed_header_length(server):
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer",
                                    {**JSON_REQUEST, "parameters": {"binary_data_output": True}},
                                    {"Accept-Encoding": "gzip"})
    assert (status, headers["content-encoding"]) == (200, "gzip")
    header, data = split(headers, gzip.decompress(body))
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 12} and data == floats([1, 2, 3])


# 800 KB of floats that barely compress: above the size the gateway compresses and inflates on
# its zlib threads rather than on its event loop
LARGE = np.random.default_rng(7).standard_normal(200_000).astype(np.float32).tobytes()


@pytest.mark.parametrize("accept, decompress", [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_a_large_response_is_compressed_whole(server, accept, decompress):
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer", LARGE,
                                    {**RAW, "Accept-Encoding": accept})
    assert (status, headers["content-encoding"], int(headers["content-length"])) == (200, accept, len(body))
    header, data = split(headers, decompress(body))
    assert header["outputs"][0]["shape"] == [200_000] and data == LARGE


def test_a_large_compressed_request_is_inflated_and_answered(server):
    packed = gzip.compress(LARGE)
    assert len(packed) > 128 * 1024
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer", packed,
                                    {**RAW, "Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert status == 200 and split(headers, gzip.decompress(body))[1] == LARGE


def test_a_large_request_that_does_not_inflate_is_a_400_and_the_next_is_served(server):
    packed = bytearray(gzip.compress(LARGE))
    packed[10:] = np.random.default_rng(8).integers(0, 256, len(packed) - 10, dtype=np.uint8).tobytes()
    status, _, body = request(server.url, "POST", "/v2/models/var/infer", bytes(packed),
                              {**RAW, "Content-Encoding": "gzip"})
    assert status == 400 and error_of(body).startswith("cannot decompress the gzip request body: ")
    status, headers, body = request(server.url, "POST", "/v2/models/var/infer", gzip.compress(floats([4])),
                                    {**RAW, "Content-Encoding": "gzip"})
    assert status == 200 and split(headers, body)[1] == floats([4])


def test_tritonclient_asks_for_and_reads_a_compressed_response(server):
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("IN", [4], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2, 3, 4], dtype=np.float32))
    try:
        for algorithm in ("gzip", "deflate"):
            result = client.infer("var", [tensor], response_compression_algorithm=algorithm)
            assert result.as_numpy("OUT").tolist() == [1, 2, 3, 4]
    finally:
        client.close()


@pytest.mark.parametrize("method, path, body, accept", [
    ("GET", "/v2", None, "gzip"), ("GET", "/v2/models/var/config", None, "gzip"),
    ("POST", "/v2/models/var/infer", JSON_REQUEST, "br"), ("POST", "/v2/models/var/infer", JSON_REQUEST, "GZIP"),
    ("POST", "/v2/models/var/infer", JSON_REQUEST, "identity;q=1, gzip;q=0.5"),
    ("POST", "/v2/models/var/infer", b"{bad", "gzip"),
    ("POST", "/v2/models/var/generate", {"IN": [1, 2]}, "gzip"),
])
def test_other_answers_and_other_encodings_stay_uncompressed(server, method, path, body, accept):
    _, headers, data = request(server.url, method, path, body, {"Accept-Encoding": accept})
    assert "content-encoding" not in headers
    json.loads(data)


# -- JSON read as Triton reads it ---------------------------------------------------------------

def test_a_duplicate_key_keeps_its_first_value(server):
    body = ('{"id":"first","id":"second","inputs":[{"name":"IN","datatype":"FP32","shape":[3],"data":[1,2,3],'
            '"data":[4,5,6]}],"parameters":{"binary_data_output":false,"binary_data_output":true}}')
    status, headers, data = request(server.url, "POST", "/v2/models/var/infer", body)
    assert (status, headers["content-type"]) == (200, "application/json")
    assert json.loads(data) == {"id": "first", **JSON_ANSWER}


@pytest.mark.parametrize("parameters, key", [
    ({"parameters": {"binary_data_output": "yes"}}, "binary_data_output"),
    ({"outputs": [{"name": "OUT", "parameters": {"binary_data": 1}}]}, "binary_data")])
def test_a_binary_data_switch_must_be_a_boolean(server, parameters, key):
    status, _, data = request(server.url, "POST", "/v2/models/var/infer", {**JSON_REQUEST, **parameters})
    assert (status, error_of(data)) == (500, f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")


@pytest.mark.parametrize("sent", [RAW, {}])   # an empty body without the header: raw, as in Triton
def test_only_empty_binary_outputs_answer_plain_json(server, sent):
    status, headers, data = request(server.url, "POST", "/v2/models/var/infer", b"", sent)
    assert (status, headers["content-type"], "inference-header-content-length" in headers) == \
        (200, "application/json", False)
    assert json.loads(data)["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_an_empty_body_without_the_header_is_a_raw_request(server):
    status, _, data = request(server.url, "POST", "/v2/models/py_add_sub/infer", b"")
    assert (status, error_of(data)) == (400, "[request id: <id_unknown>] Raw request must only have 1 input (found 1) "
                                             "to be deduced but got 2 inputs in 'py_add_sub' model configuration")


# -- error texts ------------------------------------------------------------------------------------

def test_a_models_own_error_has_no_request_id_prefix(server):
    body = {"id": "abc", "inputs": [{"name": "CODE", "datatype": "INT32", "shape": [1], "data": [1]}]}
    status, _, data = request(server.url, "POST", "/v2/models/py_errors/infer", body)
    assert (status, error_of(data)) == (400, "failed with code 1")


def test_generate_stream_answers_a_first_error_with_400_and_the_error_as_an_event(server):
    status, headers, body = request(server.url, "POST", "/v2/models/py_errors/generate_stream", {"CODE": 6})
    assert (status, headers["content-type"]) == (400, "text/event-stream; charset=utf-8")
    assert body == b'data: {"error":"failed with code 6"}\n\n'


@pytest.mark.parametrize("code, infer_status", [(2, 500), (3, 404), (4, 500), (6, 503)])
def test_generate_answers_a_models_error_with_400_whatever_its_code(server, code, infer_status):
    """As Triton 2.51 (side by side): /infer maps the model's error code to a status, /generate
    answers 400 for every error of the response."""
    infer_body = {"inputs": [{"name": "CODE", "datatype": "INT32", "shape": [1], "data": [code]}]}
    infer_status_got, _, infer_data = request(server.url, "POST", "/v2/models/py_errors/infer", infer_body)
    status, _, data = request(server.url, "POST", "/v2/models/py_errors/generate", {"CODE": code})
    assert (infer_status_got, status) == (infer_status, 400)
    assert error_of(data) == error_of(infer_data)


def test_a_decoupled_models_error_event_is_the_models_text(server):
    status, _, body = request(server.url, "POST", "/v2/models/decoupled_failure/generate_stream", {"IN": 1, "id": "r1"})
    assert status == 200
    assert body == (b'data: {"OUT":7,"id":"r1","model_name":"decoupled_failure","model_version":"1"}\n\n'
                    b'data: {"error":"decoupled failure"}\n\n')
    status, _, data = request(server.url, "POST", "/v2/models/decoupled_failure/generate", {"IN": 1})
    assert (status, error_of(data)) == (400, "generate expects model to produce exactly 1 response, use generate "
                                             "stream for model that generates various number of responses")


@pytest.mark.parametrize("path", ["/v2/logging", "/v2/trace/setting", "/v2/models/py_add_sub/trace/setting"])
def test_a_settings_post_without_a_body_is_refused_as_json_that_does_not_parse(server, path):
    """Triton 2.51: 500 "failed to parse the request JSON buffer: The document is empty. at 0"
    (tritium answers a body that does not parse with 400 and the same start)."""
    status, _, data = request(server.url, "POST", path)
    assert status == 400
    assert error_of(data).startswith("failed to parse the request JSON buffer: ")
    assert request(server.url, "POST", path, {})[0] == 200


@pytest.mark.parametrize("value", [["default"], {"a": 1}])
def test_a_log_format_that_is_not_a_string_is_a_400(server, value):
    status, _, data = request(server.url, "POST", "/v2/logging", {"log_format": value})
    assert (status, error_of(data)) == (400, "log_format must be a string")


@pytest.mark.parametrize("body, status, message", [
    ({"log_info": 1, "log_file": "x"}, 501, "log file location can not be updated through network protocol"),
    ({"log_format": "x", "log_verbose_level": "y"}, 400, "log_verbose_level must be an unsigned integer"),
    ({"log_format": "x", "log_error": "y", "log_info": "z"}, 400, "log_info must be a boolean"),
])
def test_several_wrong_log_settings_answer_the_first_in_triton_s_order(server, body, status, message):
    """Triton reads the file, info, warning, error, verbose level and format in that order,
    whatever the order of the body."""
    got, _, data = request(server.url, "POST", "/v2/logging", body)
    assert (got, error_of(data)) == (status, message)


@pytest.mark.parametrize("parameters", [
    {"classification": 2, "shared_memory_region": "nowhere", "shared_memory_byte_size": 24},
    {"classification": 0, "shared_memory_region": "nowhere"},      # whatever the values, before the region is looked for
    {"classification": "x", "shared_memory_region": 5, "binary_data": True},
])
def test_an_output_cannot_go_both_to_shared_memory_and_out_as_classes(server, parameters):
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}],
            "outputs": [{"name": "OUT", "parameters": parameters}]}
    status, _, data = request(server.url, "POST", "/v2/models/fixed/infer", body)
    assert (status, error_of(data)) == (400, "Output can't set both 'shared_memory_region' and 'classification'")


def test_a_shared_memory_offset_past_the_region_names_the_offset(server):
    key = f"tritium-parity-{uuid.uuid4().hex[:8]}"
    with open(f"/dev/shm/{key}", "wb") as region:
        region.write(bytes(64))
    try:
        assert request(server.url, "POST", "/v2/systemsharedmemory/region/r/register",
                       {"key": f"/{key}", "byte_size": 64})[0] == 200
        for offset, message in ((64, "Invalid offset for shared memory region: 'r'"),
                                (60, "Invalid offset + byte size for shared memory region: 'r'")):
            body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [3], "parameters": {
                "shared_memory_region": "r", "shared_memory_offset": offset, "shared_memory_byte_size": 12}}]}
            status, _, data = request(server.url, "POST", "/v2/models/var/infer", body)
            assert (status, error_of(data)) == (400, message)
    finally:
        request(server.url, "POST", "/v2/systemsharedmemory/region/r/unregister")
        os.unlink(f"/dev/shm/{key}")


def test_an_empty_outputs_list_asks_for_every_output(server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}], "outputs": []}
    status, _, reply = request(server.url, "POST", "/v2/models/py_add_sub/infer", body)
    assert status == 200, reply
    assert [o["name"] for o in json.loads(reply)["outputs"]] == ["OUTPUT0", "OUTPUT1"]
