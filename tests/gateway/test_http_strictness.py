"""Bodies read as Triton reads them: raw binary requests, duplicate keys, the binary-data switches,
and the response encoding chosen from Accept-Encoding (answers recorded from Triton 2.51)."""

from __future__ import annotations

import gzip
import struct
import zlib

import numpy as np
import orjson
import pytest

from tritium.gateway.compression import compress, response_encoding
from tritium.gateway.http_codec import decode_infer_request, decode_raw_request, encode_infer_response, parse_json_object
from tritium.gateway.inference import InferResult, OutputTensor
from tritium.gateway.model_table import ModelSpec
from tritium.errors import ErrorCode, TritiumError


def spec(inputs: list[tuple[str, str, list[int]]], max_batch_size: int = 0, name: str = "m") -> ModelSpec:
    tensors = [{"name": n, "data_type": t, "dims": d} for n, t, d in inputs]
    return ModelSpec.from_config({"name": name, "backend": "python", "max_batch_size": max_batch_size,
                                  "input": tensors, "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]})


def raw_error(model: ModelSpec, body: bytes) -> TritiumError:
    with pytest.raises(TritiumError) as info:
        decode_raw_request(model, None, body)
    return info.value


# -- raw binary requests (Inference-Header-Content-Length: 0) ------------------------------

def test_a_raw_body_is_the_one_input_with_the_configs_shape():
    data = np.arange(6, dtype=np.float32).tobytes()
    request = decode_raw_request(spec([("IN", "TYPE_FP32", [2, 3])]), "1", data)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape, bytes(tensor.data)) == ("IN", "FP32", [2, 3], data)
    assert (request.model, request.version, request.outputs, request.id) == ("m", "1", None, "")


@pytest.mark.parametrize("dims, max_batch_size, size, shape", [
    ([-1], 0, 20, [5]), ([-1], 0, 0, [0]), ([2, -1], 0, 24, [2, 3]), ([-1], 8, 20, [1, 5]), ([4], 8, 16, [1, 4])])
def test_a_variable_dim_takes_what_the_bytes_hold_and_a_batching_model_gets_a_batch_of_one(
        dims, max_batch_size, size, shape):
    request = decode_raw_request(spec([("IN", "TYPE_FP32", dims)], max_batch_size), None, bytes(size))
    assert request.inputs[0].shape == shape


def test_a_raw_bytes_input_is_one_element_holding_the_whole_body():
    request = decode_raw_request(spec([("T", "TYPE_STRING", [1])]), None, b"hello")
    assert (request.inputs[0].shape, bytes(request.inputs[0].data)) == ([1], struct.pack("<I", 5) + b"hello")


@pytest.mark.parametrize("inputs, body, message", [
    ([("A", "TYPE_FP32", [16]), ("B", "TYPE_FP32", [16])], bytes(128),
     "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs "
     "in 'm' model configuration"),
    ([("IN", "TYPE_FP32", [2, 3])], bytes(20),
     "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'm'. Expected 24, got 20"),
    ([("IN", "TYPE_FP32", [-1])], bytes(22),
     "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model 'm'. Expected 20, got 22"),
    ([("IN", "TYPE_FP32", [-1, -1])], bytes(16),
     "[request id: <id_unknown>] The shape of the raw input 'IN' can not be deduced because there are more than "
     "one variable-sized dimension"),
    ([("IN", "TYPE_STRING", [-1])], b"abc",
     "[request id: <id_unknown>] For BYTE datatype raw input 'IN', the model must have input shape [1]"),
])
def test_raw_requests_the_model_cannot_take_get_tritons_400s(inputs, body, message):
    error = raw_error(spec(inputs), body)
    assert (error.http_status, error.message) == (400, message)


# -- duplicate keys: the first value wins, as in Triton's parser ---------------------------

def test_a_duplicate_key_keeps_its_first_value_at_every_level():
    body = (b'{"id":"first","id":"second","inputs":[{"name":"A","datatype":"FP32","shape":[2],"shape":[3],'
            b'"data":[1,2],"data":[3,4,5]}],"inputs":[],"parameters":{"binary_data_output":true,'
            b'"binary_data_output":false}}')
    request, binary = decode_infer_request("m", None, body, None)
    assert (request.id, request.inputs[0].shape, binary) == ("first", [2], True)
    assert np.frombuffer(request.inputs[0].data, np.float32).tolist() == [1, 2]


def test_colons_inside_strings_do_not_change_what_is_read():
    body = b'{"id":"a:b:c","parameters":{"note":"x:y"},"inputs":[{"name":"A","datatype":"BYTES","shape":[1],"data":[":"]}]}'
    request, _ = decode_infer_request("m", None, body, None)
    assert (request.id, request.parameters) == ("a:b:c", {"note": "x:y"})


def test_control_bodies_keep_first_values_too():
    assert parse_json_object(b'{"ready":true,"ready":false,"x":{"a":1,"a":2},"y":[{"b":1,"b":2}]}') == \
        {"ready": True, "x": {"a": 1}, "y": [{"b": 1}]}
    assert parse_json_object(b'{"data":[[1,2],[3,4]],"k" : 1}') == {"data": [[1, 2], [3, 4]], "k": 1}


# -- binary_data / binary_data_output must be booleans -------------------------------------

INPUT = {"name": "A", "datatype": "FP32", "shape": [1], "data": [1]}


@pytest.mark.parametrize("document, key", [
    ({"inputs": [INPUT], "parameters": {"binary_data_output": "yes"}}, "binary_data_output"),
    ({"inputs": [INPUT], "parameters": {"binary_data_output": 1}}, "binary_data_output"),
    ({"inputs": [INPUT], "parameters": {"binary_data_output": None}}, "binary_data_output"),
    ({"inputs": [INPUT], "outputs": [{"name": "OUT", "parameters": {"binary_data": "true"}}]}, "binary_data"),
    ({"inputs": [INPUT], "outputs": [{"name": "OUT", "parameters": {"binary_data": 0}}]}, "binary_data"),
    ({"inputs": [INPUT], "outputs": [{"name": "OUT", "parameters": {"binary_data": None}}]}, "binary_data"),
])
def test_a_binary_data_switch_that_is_not_a_boolean_fails_as_in_triton(document, key):
    with pytest.raises(TritiumError) as info:
        decode_infer_request("m", None, orjson.dumps(document), None)
    assert (info.value.code, info.value.message) == (
        ErrorCode.INTERNAL, f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")


def test_only_empty_binary_outputs_make_a_plain_json_response():
    result = InferResult("m", 1, "", [OutputTensor("OUT", "FP32", [0], b"")])
    headers, body = encode_infer_response(result, None, True)
    assert headers == [(b"content-type", b"application/json")]
    assert orjson.loads(body)["outputs"][0]["parameters"] == {"binary_data_size": 0}


# -- Accept-Encoding -------------------------------------------------------------------------

@pytest.mark.parametrize("accept, chosen", [
    ("gzip", "gzip"), ("deflate", "deflate"), ("gzip, deflate", "gzip"), ("deflate,gzip", "deflate"),
    ("gzip;q=0.5,deflate;q=0.5", "gzip"), ("deflate;q=0.5, gzip;q=0.9", "gzip"), ("gzip;q=0, deflate", "deflate"),
    ("gzip;q=1.5", "gzip"), ("deflate;q=0.001", "deflate"), ("gzip,", "gzip"), ("gzip;Q=0.5, deflate;q=0.6", "deflate"),
    ("identity;q=1, gzip;q=0.5", None), (" gzip ", None), ("gzip ; q=0.5", None), ("gzip;q=abc", None),
    ("gzip;q=", None), ("gzip;q=-1", None), ("gzip;level=1", None), ("GZIP", None), ("x-gzip", None),
    ("*", None), ("br", None), ("identity", None),
])
def test_the_response_encoding_is_chosen_as_triton_chooses_it(accept, chosen):
    got = response_encoding(accept.encode())
    assert (got.decode() if got else None) == chosen


def test_compressed_bodies_decompress_to_the_original():
    body = b'{"model_name":"m"}' * 50
    assert gzip.decompress(compress(body, b"gzip")) == body
    assert zlib.decompress(compress(body, b"deflate")) == body
