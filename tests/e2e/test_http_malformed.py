"""Every malformed request gets a clear 4xx naming the model, tensor and problem; the server keeps serving."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import numpy as np
import pytest

from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model, all_types_model, python_model
from tests.servers import TritiumServer

MAX_INPUT = 256 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8)
    all_types_model(repo)
    python_model(repo, "total", TOTAL_MODEL, TOTAL_CONFIG)
    with TritiumServer(repo, "--http-max-input-size", str(MAX_INPUT)) as running:
        yield running


# One input of any length: a raw body (all binary input) can be as large as a test needs.
TOTAL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "Y", np.array([pb_utils.get_input_tensor_by_name(r, "X").as_numpy().size], np.float32))])
                for r in requests]
"""
TOTAL_CONFIG = """
backend: "python"
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

ROW = [float(i) for i in range(16)]


def good_body(rows=1):
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 16], "data": ROW * rows},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [rows, 16], "data": ROW * rows}]}


def assert_still_serving(server):
    status, _, body = request(server.url, "POST", "/v2/models/add_sub/infer", body=good_body())
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2 * x for x in ROW]


def with_input(**changes):
    body = good_body()
    body["inputs"][0].update(changes)
    return body


def binary_request(header: dict, payload: bytes, header_length: int | None = None):
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head) if header_length is None else header_length)}
    return head + payload, headers


def binary_header(sizes, names=("INPUT0", "INPUT1")):
    return {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": s}}
                       for n, s in zip(names, sizes)]}


CASES = {
    "malformed json": ("{\"inputs\": [", {}, 400, "failed to parse the request JSON buffer"),
    "body is not an object": ("[1, 2]", {}, 400, "must be a JSON object"),
    "no inputs list": ({"outputs": []}, {}, 400, "must have an 'inputs' list"),
    "unknown input": (with_input(name="INPUT9"), {}, 400, "unexpected inference input 'INPUT9' for model 'add_sub'"),
    # Triton's core looks at the requested outputs first
    "unknown input and output": ({**with_input(name="INPUT9"), "outputs": [{"name": "NOPE"}]}, {}, 400,
                                 "unexpected inference output 'NOPE' for model 'add_sub'"),
    "missing input": ({"inputs": good_body()["inputs"][:1]}, {}, 400,
                      "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
                      "but missing required input(s) ['INPUT1']"),
    "input given twice": ({"inputs": [good_body()["inputs"][0]] * 2}, {}, 400,
                          "[request id: <id_unknown>] input 'INPUT0' already exists in request"),
    "wrong datatype": (with_input(datatype="INT32", data=[1] * 16), {}, 400,
                       "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"),
    "unknown datatype": (with_input(datatype="FLOAT"), {}, 400, "input 'INPUT0' for model 'add_sub' has invalid datatype"),
    "negative dimension": (with_input(shape=[-1, 16]), {}, 400,
                           "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    "shape not matching dims": (with_input(shape=[1, 15], data=ROW[:15]), {}, 400,
                                "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]"),
    # INPUT0's batch size reads as 16, INPUT1's as 1: Triton compares the batch sizes first,
    # INPUT1's (given last) the one the others must match.
    "missing batch dimension": (with_input(shape=[16]), {}, 400,
                                "input 'INPUT0' batch size does not match other inputs for 'add_sub'"),
    "batch above max_batch_size": (good_body(rows=9), {}, 400,
                                   "inference request batch-size must be <= 8 for 'add_sub'"),
    "element count not matching shape": (with_input(data=ROW[:10]), {}, 400,
                                         "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    "nested rows of the wrong length": (with_input(shape=[2, 16], data=[ROW, ROW[:3]]), {}, 400, "Shape does not match true shape of 'data' field"),
    "ragged data": (with_input(shape=[2, 16], data=[ROW, 1.0]), {}, 400, "is ragged"),
    "string in numeric data": (with_input(data=["a"] * 16), {}, 400, "'data' must hold numbers, got \"a\""),
    "null in numeric data": (with_input(data=[None] * 16), {}, 400, "'data' must hold numbers, got null"),
    "shape not a list": (with_input(shape=16), {}, 400, "must have a 'shape' list of non-negative integers"),
    "data and binary size both set": (with_input(parameters={"binary_data_size": 64}), {}, 400,
                                      "Input must set only one of the following fields"),
    "neither data nor binary size": ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]},
                                                 good_body()["inputs"][1]]}, {}, 400, "But no field is set"),
    "parameter of a list": (dict(good_body(), parameters={"x": [1]}), {}, 400,
                            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    "reserved parameter": (dict(good_body(), parameters={"triton_x": 1}), {}, 400,
                           "parameter keys starting with 'triton_' are reserved"),
    "unknown output": (dict(good_body(), outputs=[{"name": "OUTPUT7"}]), {}, 400,
                       "unexpected inference output 'OUTPUT7' for model 'add_sub'"),
    "binary without header length": (binary_header([64, 64]), {}, 400,
                                     "must specify valid 'Infer-Header-Content-Length'"),
    "unsupported compression": (good_body(), {"Content-Encoding": "br"}, 501, "Unsupported compression type"),
    "header length not a number": (good_body(), {"Inference-Header-Content-Length": "ten"}, 400,
                                   "Unable to parse Inference-Header-Content-Length, got: ten"),
    "header length empty: a raw request, as Triton reads it": (
        good_body(), {"Inference-Header-Content-Length": ""}, 400,
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model configuration"),
    "header length of 5000 digits": (good_body(), {"Inference-Header-Content-Length": "9" * 5000}, 400,
                                     "Unable to parse Inference-Header-Content-Length, value is out of range"),
    "header length past a C int": (good_body(), {"Inference-Header-Content-Length": "2147483648"}, 400,
                                   "Unable to parse Inference-Header-Content-Length, value is out of range "
                                   "[ -2147483648, 2147483647 ], got: 2147483648"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_request_is_refused_clearly(server, name):
    body, headers, status, message = CASES[name]
    got_status, got_headers, got_body = request(server.url, "POST", "/v2/models/add_sub/infer", body=body,
                                                headers=headers)
    assert got_status == status, got_body
    assert got_headers["content-type"] == "application/json"
    assert message in error_of(got_body)
    assert_still_serving(server)


def test_binary_data_short_by_some_bytes(server):
    body, headers = binary_request(binary_header([64, 64]), b"\0" * 100)
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body, headers=headers)
    assert status == 400
    assert error_of(reply) == "unexpected size for input 'INPUT1', expecting 28 additional bytes for model 'add_sub'"
    assert_still_serving(server)


def test_binary_data_with_bytes_left_over(server):
    body, headers = binary_request(binary_header([64, 64]), b"\0" * 130)
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body, headers=headers)
    assert status == 400 and error_of(reply) == "unexpected additional input data for model 'add_sub'"
    assert_still_serving(server)


def test_a_header_length_is_read_as_triton_reads_it_up_to_what_follows_its_digits(server):
    body, headers = binary_request(binary_header([64, 64]), b"\0" * 128)
    length = headers["Inference-Header-Content-Length"]
    for value in (f"{length}abc", f"{length}.5", f"+{length}"):
        status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body,
                                   headers={"Inference-Header-Content-Length": value})
        assert status == 200, (value, reply)


def test_binary_size_not_matching_shape(server):
    body, headers = binary_request(binary_header([60, 64]), b"\0" * 124)
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body, headers=headers)
    assert status == 400
    assert error_of(reply) == ("[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
                                "Expected 64, got 60")
    assert_still_serving(server)


def test_header_length_beyond_the_body(server):
    body, headers = binary_request(binary_header([64, 64]), b"\0" * 128, header_length=100000)
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body, headers=headers)
    assert status == 400 and error_of(reply).startswith("inference header size should be in range (0, ")
    assert_still_serving(server)


def test_binary_data_output_leaves_the_outputs_a_request_names_in_json(server):
    """As Triton's HTTP server: the request's binary_data_output is for outputs it does not name."""
    body = {**good_body(), "parameters": {"binary_data_output": True}, "outputs": [{"name": "OUTPUT0"}]}
    status, headers, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body)
    assert (status, headers["content-type"]) == (200, "application/json")
    assert json.loads(reply)["outputs"][0]["data"] == [2 * x for x in ROW]
    status, headers, reply = request(server.url, "POST", "/v2/models/add_sub/infer",
                                     body={**good_body(), "parameters": {"binary_data_output": True}})
    assert (status, headers["content-type"]) == (200, "application/octet-stream")


def test_binary_inputs_and_outputs_without_tritonclient(server):
    a = np.arange(16, dtype=np.float32)
    header = binary_header([64, 64])
    header["outputs"] = [{"name": "OUTPUT1", "parameters": {"binary_data": True}}]
    body, headers = binary_request(header, a.tobytes() + np.ones(16, np.float32).tobytes())
    status, reply_headers, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body, headers=headers)
    assert status == 200 and reply_headers["content-type"] == "application/octet-stream"
    length = int(reply_headers["inference-header-content-length"])
    document = json.loads(reply[:length])
    assert document["outputs"] == [{"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16],
                                    "parameters": {"binary_data_size": 64}}]
    np.testing.assert_array_equal(np.frombuffer(reply[length:], np.float32), a - 1)


def test_body_over_the_limit_is_refused(server):
    body = b"{" + b" " * (MAX_INPUT + 2 * 1024 * 1024) + b"}"
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body)
    assert status == 400 and error_of(reply) == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
        f"{MAX_INPUT} bytes. Use --http-max-input-size to increase the limit.")
    assert_still_serving(server)


def elements_counted(status, headers, reply) -> float:
    assert status == 200, reply
    return float(np.frombuffer(reply[int(headers["inference-header-content-length"]):], np.float32)[0])


def test_binary_data_over_the_json_limit_is_read_as_in_triton(server):
    """The limit is on JSON: a raw body's input, or the binary tensor data after a JSON header, is not
    bounded by it (Triton 2.51 reads a raw body of 64 MiB and more)."""
    data = bytes(MAX_INPUT + 8)
    status, headers, reply = request(server.url, "POST", "/v2/models/total/infer", body=data,
                                     headers={"Inference-Header-Content-Length": "0"})
    assert elements_counted(status, headers, reply) == len(data) // 4
    header = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [len(data) // 4],
                          "parameters": {"binary_data_size": len(data)}}],
              "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}
    body, binary = binary_request(header, data)
    status, headers, reply = request(server.url, "POST", "/v2/models/total/infer", body=body, headers=binary)
    assert elements_counted(status, headers, reply) == len(data) // 4
    # the header length read as the decoder reads it (C++'s stoi), for the limit too
    signed = {"Inference-Header-Content-Length": f"+{binary['Inference-Header-Content-Length']}"}
    status, headers, reply = request(server.url, "POST", "/v2/models/total/infer", body=body, headers=signed)
    assert elements_counted(status, headers, reply) == len(data) // 4


@pytest.mark.parametrize("header_length", [None, "0"])
def test_a_compressed_body_over_the_limit_once_inflated_is_refused(server, header_length):
    """Binary data included, as later Tritons refuse it: what a small body inflates to is bounded."""
    body = b"{" + b" " * (MAX_INPUT + 16) + b"}" if header_length is None else bytes(MAX_INPUT + 8)
    headers = {"Content-Encoding": "gzip", **({} if header_length is None else {"Inference-Header-Content-Length": "0"})}
    status, _, reply = request(server.url, "POST", "/v2/models/total/infer", body=gzip.compress(body), headers=headers)
    assert status == 400 and error_of(reply) == (
        f"Decompressed data size exceeds the maximum allowed value of {MAX_INPUT} bytes. Use "
        "--http-max-input-size to increase the limit.")
    assert_still_serving(server)


def test_gzip_request_body_is_accepted(server):
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer",
                               body=gzip.compress(json.dumps(good_body()).encode()),
                               headers={"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(reply)["outputs"][1]["data"] == [0.0] * 16


def test_a_compressed_body_cut_short_or_followed_by_other_bytes_is_refused(server):
    """One compressed stream is what a client sends: one that stops short, or bytes after it (a
    second gzip member among them), are a client's mistake, not a body to serve."""
    text = json.dumps(good_body()).encode()
    whole = gzip.compress(text)
    cases = [("gzip", whole[:-8], "cannot decompress the gzip request body: it ends before its compressed "
                                  "stream does"),
             ("gzip", whole + b"junk", "cannot decompress the gzip request body: 4 bytes follow its compressed "
                                       "stream"),
             ("gzip", whole + gzip.compress(b""), "cannot decompress the gzip request body: 20 bytes follow its "
                                                  "compressed stream"),
             ("deflate", zlib.compress(text)[:-3], "cannot decompress the deflate request body: it ends before its "
                                                   "compressed stream does")]
    for encoding, body, message in cases:
        status, _, reply = request(server.url, "POST", "/v2/models/add_sub/infer", body=body,
                                   headers={"Content-Encoding": encoding})
        assert (status, error_of(reply)) == (400, message)
    assert_still_serving(server)


def test_unknown_model_and_version_infer_are_404(server):
    status, _, reply = request(server.url, "POST", "/v2/models/nope/infer", body=good_body())
    assert status == 404 and error_of(reply) == "Request for unknown model: 'nope' is not found"
    status, _, reply = request(server.url, "POST", "/v2/models/add_sub/versions/2/infer", body=good_body())
    assert status == 404 and error_of(reply) == "Request for unknown model: 'add_sub' version 2 is not found"
    assert_still_serving(server)


def _all_types_body(name, datatype, data, shape=(1, 2)):
    body = {"inputs": []}
    for dtype in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                  "FP32", "FP64", "BYTES"):
        value = {"BOOL": [True, False], "BYTES": ["a", "b"]}.get(dtype, [1, 2])
        body["inputs"].append({"name": f"IN_{dtype}", "datatype": dtype, "shape": [1, 2], "data": value})
    body["inputs"].append({"name": "IN_FP16", "datatype": "FP16", "shape": list(shape), "data": [1, 2]})
    for tensor in body["inputs"]:
        if tensor["name"] == name:
            tensor.update(datatype=datatype, data=data, shape=list(shape))
    return body


@pytest.mark.parametrize("name, datatype, data, message", [
    ("IN_FP16", "FP16", [1, 2], "receiving FP16 data via JSON is not supported. Please use the binary data format for input IN_FP16"),
    ("IN_BOOL", "BOOL", [1, 0], "is BOOL: 'data' must hold true or false"),
    ("IN_INT8", "INT8", [1, 300], "has a value out of range for INT8"),
    ("IN_INT32", "INT32", [1.5, 2], "is INT32: 'data' must hold integers"),
    ("IN_BYTES", "BYTES", [1, 2], "is BYTES: 'data' must hold strings"),
])
def test_json_data_that_does_not_fit_its_datatype(server, name, datatype, data, message):
    status, _, reply = request(server.url, "POST", "/v2/models/all_types/infer",
                               body=_all_types_body(name, datatype, data))
    assert status == 400 and message in error_of(reply)
    assert_still_serving(server)


def test_malformed_bytes_framing_in_binary(server):
    body = _all_types_body("IN_FP16", "FP16", [1, 2])
    for tensor in body["inputs"]:
        if tensor["name"] in ("IN_FP16", "IN_BYTES"):
            tensor.pop("data")
            tensor["parameters"] = {"binary_data_size": 4 if tensor["name"] == "IN_FP16" else 9}
    payloads = {"IN_FP16": np.ones(2, np.float16).tobytes(),
                "IN_BYTES": struct.pack("<I", 1) + b"a" + struct.pack("<I", 10)}
    order = [t["name"] for t in body["inputs"] if "parameters" in t]
    data, headers = binary_request(body, b"".join(payloads[n] for n in order))
    status, _, reply = request(server.url, "POST", "/v2/models/all_types/infer", body=data, headers=headers)
    assert (status, error_of(reply)) == (400, "incomplete string data for inference input 'IN_BYTES', expecting "
                                              "string of length 10 but only 0 bytes available")   # (Triton's words)
    assert_still_serving(server)
