"""KServe v2 HTTP bodies: JSON tensors and Triton's binary tensor data (reference 1.4, 1.5, 2.1, 2.10)."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from tritium.gateway.http_codec import decode_infer_request, encode_infer_response, inference_header_length, output_to_json
from tritium.gateway.inference import InferResult, OutputTensor, RequestedOutput
from tritium.gateway.shared_memory import SharedMemoryRef
from tritium.errors import InvalidArgument, TritiumError


def decode(document: dict, binary: bytes = b"", header_length: int | None | str = "auto",
           model: str = "m", version: str | None = None):
    head = orjson.dumps(document)
    body = head + binary
    if header_length == "auto":
        header_length = len(head) if binary else None
    return decode_infer_request(model, version, body, header_length)


def decode_error(document, binary=b"", header_length="auto", model="m") -> TritiumError:
    with pytest.raises(TritiumError) as info:
        decode(document, binary, header_length, model=model)
    return info.value


def one_input(datatype: str, shape: list, data) -> dict:
    return {"inputs": [{"name": "A", "datatype": datatype, "shape": shape, "data": data}]}


def json_bytes(datatype: str, shape: list, data) -> bytes:
    request, _ = decode(one_input(datatype, shape, data))
    return bytes(request.inputs[0].data)


def serialized(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


# -- request structure ----------------------------------------------------------------------

def test_a_json_request_decodes_to_raw_little_endian_bytes():
    request, binary_default = decode({
        "id": "42", "parameters": {"custom": "x", "n": 3, "f": 0.5, "b": True},
        "inputs": [{"name": "A", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}],
        "outputs": [{"name": "O", "parameters": {"binary_data": True}}],
    }, version="2")
    assert request.model == "m"
    assert request.version == "2"
    assert request.id == "42"
    assert request.parameters == {"custom": "x", "n": 3, "f": 0.5, "b": True}
    assert binary_default is False
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("A", "FP32", [2, 2])
    assert bytes(tensor.data) == np.array([1, 2, 3, 4], dtype="<f4").tobytes()
    assert [(o.name, o.parameters) for o in request.outputs] == [("O", {"binary_data": True})]


def test_omitted_outputs_mean_all_outputs_and_id_defaults_to_empty():
    request, _ = decode(one_input("INT32", [1], [7]))
    assert request.outputs is None
    assert request.id == ""
    assert request.parameters == {}


def test_nested_and_flat_data_give_the_same_row_major_bytes():
    flat = json_bytes("INT32", [2, 3], [1, 2, 3, 4, 5, 6])
    nested = json_bytes("INT32", [2, 3], [[1, 2, 3], [4, 5, 6]])
    assert flat == nested == np.arange(1, 7, dtype="<i4").tobytes()
    deep = json_bytes("INT32", [2, 1, 2], [[[1, 2]], [[3, 4]]])
    assert deep == np.arange(1, 5, dtype="<i4").tobytes()


def test_malformed_json_is_a_400():
    with pytest.raises(InvalidArgument) as info:
        decode_infer_request("m", None, b'{"inputs": [', None)
    assert "failed to parse the request JSON buffer" in info.value.message


@pytest.mark.parametrize("document", [
    [1, 2],
    {"inputs": {"name": "A"}},
    {"id": 5, "inputs": []},
    {"inputs": [{"name": "A", "datatype": "FLOAT", "shape": [1], "data": [1]}]},
    {"inputs": [{"name": "A", "datatype": "FP32", "shape": [-1], "data": [1]}]},
    {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1.5], "data": [1]}]},
    {"inputs": [{"name": "A", "datatype": "FP32", "data": [1]}]},
    {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]},
    {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1], "parameters": [1]}]},
    {"inputs": [], "parameters": {"k": [1, 2]}},
    {"inputs": [], "outputs": [{"parameters": {}}]},
])
def test_structurally_invalid_requests_are_400(document):
    error = decode_error(document)
    assert isinstance(error, InvalidArgument)
    assert error.code.http_status == 400


def test_an_input_with_no_data_source():
    error = decode_error({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1]}]})
    assert error.message == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But no field is set")


@pytest.mark.parametrize("parameters, named", [({"binary_data_size": 4}, "'data' 'binary_data_size'"),
                                               ({"shared_memory_region": "r"}, "'data' 'shared_memory_region'")])
def test_an_input_with_two_data_sources(parameters, named):
    error = decode_error({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0],
                                      "parameters": parameters}]}, b"\x00" * 4)
    assert isinstance(error, InvalidArgument)
    assert error.message == ("Input must set only one of the following fields: 'data', 'binary_data_size' in "
                             f"'parameters', 'shared_memory_region' in 'parameters'. But set {named}")


def test_a_byte_order_mark_before_the_json_is_skipped_as_triton_skips_it():
    request, _ = decode_infer_request("m", None, b"\xef\xbb\xbf" + orjson.dumps(one_input("INT8", [1], [7])), None)
    assert bytes(request.inputs[0].data) == b"\x07"
    for marks in (2, 200_000):   # one only, read without recursion
        with pytest.raises(InvalidArgument) as refused:
            decode_infer_request("m", None, b"\xef\xbb\xbf" * marks + b"{}", None)
        assert refused.value.message.startswith("failed to parse the request JSON buffer: ")


# -- parameters ------------------------------------------------------------------------------

def test_triton_prefixed_request_parameters_are_reserved():
    error = decode_error({"parameters": {"triton_enable_empty_final_response": True}, "inputs": []})
    assert isinstance(error, InvalidArgument)
    assert error.message == ("parameter keys starting with 'triton_' are reserved for Triton usage "
                             "and should not be specified.")


@pytest.mark.parametrize("parameters, status, message", [
    ({"sequence_id": [1]}, 500, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_id": [1], "x": [1]}, 500, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"x": [1], "sequence_id": [1]}, 400,
     "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"priority": [1]}, 500, "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"timeout": -1, "triton_x": 1}, 500,
     "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"triton_x": 1, "sequence_start": 5}, 400,
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ({"sequence_end": "yes", "binary_data_output": 1}, 500,
     "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
])
def test_request_parameters_are_refused_in_their_order_each_in_triton_s_words(parameters, status, message):
    error = decode_error({"parameters": parameters, "inputs": []})
    assert (error.code.http_status, error.message) == (status, message)


def test_binary_data_output_is_the_output_default_and_not_a_request_parameter():
    request, binary_default = decode({"parameters": {"binary_data_output": True, "k": "v"},
                                      **one_input("INT8", [1], [1])})
    assert binary_default is True
    assert request.parameters == {"k": "v"}
    request, binary_default = decode({"parameters": {"binary_data_output": False},
                                      **one_input("INT8", [1], [1])})
    assert binary_default is False
    assert request.parameters == {}


# -- JSON datatypes --------------------------------------------------------------------------

@pytest.mark.parametrize("datatype,values,dtype", [
    ("UINT8", [0, 255], "u1"), ("UINT16", [0, 65535], "<u2"),
    ("UINT32", [0, 2**32 - 1], "<u4"), ("UINT64", [0, 2**64 - 1], "<u8"),
    ("INT8", [-128, 127], "i1"), ("INT16", [-2**15, 2**15 - 1], "<i2"),
    ("INT32", [-2**31, 2**31 - 1], "<i4"), ("INT64", [-2**63, 2**63 - 1], "<i8"),
    ("FP32", [1.5, -2, 0.1], "<f4"), ("FP64", [1.5, -2, 0.1], "<f8"),
])
def test_json_numbers_are_converted_to_the_datatype(datatype, values, dtype):
    assert json_bytes(datatype, [len(values)], values) == np.array(values, dtype=dtype).tobytes()


@pytest.mark.parametrize("datatype,value", [
    ("UINT8", 256), ("UINT8", -1), ("UINT16", 65536), ("UINT32", 2**32), ("UINT64", -1),
    ("INT8", 128), ("INT8", -129), ("INT16", 2**15), ("INT32", 2**31), ("INT32", -2**31 - 1),
])
def test_json_integers_are_range_checked(datatype, value):
    error = decode_error(one_input(datatype, [1], [value]))
    assert isinstance(error, InvalidArgument)
    assert "'A'" in error.message and "'m'" in error.message and datatype in error.message


@pytest.mark.parametrize("datatype,value", [
    ("INT32", 1.0), ("INT32", 1.5), ("UINT8", "1"), ("INT64", True), ("FP32", "1.0"),
    ("FP32", True), ("FP64", None), ("INT8", {"v": 1}),
])
def test_json_numbers_must_have_the_right_kind(datatype, value):
    assert isinstance(decode_error(one_input(datatype, [1], [value])), InvalidArgument)


def test_bool_takes_only_true_and_false():
    assert json_bytes("BOOL", [3], [True, False, True]) == b"\x01\x00\x01"
    for bad in (1, 0, "true", None):
        error = decode_error(one_input("BOOL", [1], [bad]))
        assert isinstance(error, InvalidArgument)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp16_and_bf16_are_refused_over_json(datatype):
    error = decode_error(one_input(datatype, [1], [1.0]))
    assert isinstance(error, InvalidArgument)
    assert error.message == (f"receiving {datatype} data via JSON is not supported. Please use the "
                             "binary data format for input A")
    assert json_bytes(datatype, [0], []) == b""   # Triton refuses each element: a tensor with none passes


def test_bytes_json_strings_are_length_prefixed_utf8():
    data = json_bytes("BYTES", [3], ["", "héllo", "a"])
    assert data == serialized(b"", "héllo".encode(), b"a")
    assert data[4:8] == struct.pack("<I", 6)


def test_bytes_json_data_must_be_strings():
    assert isinstance(decode_error(one_input("BYTES", [1], [1])), InvalidArgument)


def test_element_count_must_match_the_shape():
    for data in ([1, 2, 3], [[1, 2], [3]], [1, 2, 3, 4, 5]):
        error = decode_error(one_input("INT32", [2, 2], data))
        assert isinstance(error, InvalidArgument)
        assert error.code.http_status == 400


@pytest.mark.parametrize("datatype, data, kind", [("FP32", 2.0, "a number"), ("BYTES", "x", "a string"),
                                                  ("INT32", 5, "a number"), ("BOOL", True, "true"),
                                                  ("FP32", {"a": 1}, "an object"), ("FP32", None, "null")])
def test_data_that_is_not_an_array_is_refused(datatype, data, kind):
    """Triton refuses it (a 500, "attempt to access JSON non-array as array"); it was read as one element."""
    error = decode_error(one_input(datatype, [1], data))
    assert isinstance(error, InvalidArgument)
    assert error.message == f"input 'A' for model 'm': 'data' must be a JSON array, got {kind}"


@pytest.mark.parametrize("data", [[[1, 2], 3, 4], [[[1], 2]], [[1, [2]]]])
def test_ragged_nesting_is_refused_at_any_depth(data):
    error = decode_error(one_input("INT32", [2, 2], data))
    assert isinstance(error, InvalidArgument) and error.message.endswith("is ragged")


def test_data_nested_deeper_than_python_s_recursion_limit_is_read():
    """Triton 2.51 reads JSON data of any depth (990 arrays deep checked)."""
    data = "[" * 990 + "7" + "]" * 990
    body = b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": %s}]}' % data.encode()
    request, _ = decode_infer_request("m", None, body, None)
    assert bytes(request.inputs[0].data) == struct.pack("<i", 7)


def test_element_count_mismatch_uses_triton_wording():
    error = decode_error(one_input("INT32", [1, 4], [1, 2, 3]))
    assert error.message == "Unable to parse 'data': Shape does not match true shape of 'data' field"


# -- binary tensor data ----------------------------------------------------------------------

def binary_input(name, datatype, shape, size):
    return {"name": name, "datatype": datatype, "shape": shape,
            "parameters": {"binary_data_size": size}}


def test_binary_inputs_are_memoryview_slices_of_the_body_in_order():
    a = np.arange(4, dtype="<f4").tobytes()
    b = np.arange(3, dtype="<i8").tobytes()
    head = orjson.dumps({"inputs": [
        binary_input("A", "FP32", [4], len(a)),
        {"name": "J", "datatype": "INT32", "shape": [1], "data": [9]},
        binary_input("B", "INT64", [3], len(b)),
    ]})
    body = head + a + b
    request, _ = decode_infer_request("m", None, body, len(head))
    ta, tj, tb = request.inputs
    for tensor, expected in ((ta, a), (tb, b)):
        assert isinstance(tensor.data, memoryview)
        assert tensor.data.obj is body          # a view into the body: not copied
        assert bytes(tensor.data) == expected
    assert bytes(tj.data) == struct.pack("<i", 9)
    # The slices point at the right places of the body.
    base = np.frombuffer(body, dtype=np.uint8)
    assert np.shares_memory(np.frombuffer(ta.data, dtype=np.uint8), base)
    assert np.frombuffer(tb.data, dtype="<i8").tolist() == [0, 1, 2]


def test_a_zero_size_binary_input():
    request, _ = decode({"inputs": [binary_input("A", "FP32", [0], 0),
                                    binary_input("B", "UINT8", [2], 2)]}, b"\x01\x02")
    assert bytes(request.inputs[0].data) == b""
    assert bytes(request.inputs[1].data) == b"\x01\x02"


def test_missing_binary_bytes():
    error = decode_error({"inputs": [binary_input("A", "FP32", [2], 8),
                                     binary_input("B", "FP32", [2], 8)]}, b"\x00" * 12)
    assert isinstance(error, InvalidArgument)
    assert error.message == "unexpected size for input 'B', expecting 4 additional bytes for model 'm'"


def test_left_over_binary_bytes():
    error = decode_error({"inputs": [binary_input("A", "FP32", [2], 8)]}, b"\x00" * 9)
    assert isinstance(error, InvalidArgument)
    assert error.message == "unexpected additional input data for model 'm'"


def test_binary_bytes_after_an_all_json_header_are_left_over():
    error = decode_error(one_input("INT32", [1], [1]), b"\x00\x00")
    assert error.message == "unexpected additional input data for model 'm'"


@pytest.mark.parametrize("header_length", [-1, 10_000])
def test_header_length_out_of_range(header_length):
    document = {"inputs": [binary_input("A", "FP32", [1], 4)]}
    body = orjson.dumps(document) + b"\x00" * 4
    with pytest.raises(InvalidArgument) as info:
        decode_infer_request("m", None, body, header_length)
    assert info.value.message == (
        f"inference header size should be in range (0, {len(body)}), got: {header_length}")


def test_binary_input_without_header_length():
    document = {"inputs": [binary_input("A", "FP32", [1], 4)]}
    body = orjson.dumps(document)
    with pytest.raises(InvalidArgument) as info:
        decode_infer_request("m", None, body, None)
    assert info.value.message == (
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format")


def test_header_length_equal_to_the_body_is_a_json_only_request():
    head = orjson.dumps(one_input("INT16", [2], [1, -1]))
    request, _ = decode_infer_request("m", None, head, len(head))
    assert bytes(request.inputs[0].data) == np.array([1, -1], dtype="<i2").tobytes()


def test_shared_memory_references_are_read_from_parameters():
    document = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [4],
                            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16,
                                           "shared_memory_offset": 32}}],
                "outputs": [{"name": "O", "parameters": {"shared_memory_region": "s",
                                                         "shared_memory_byte_size": 8}}]}
    request, _ = decode_infer_request("m", None, orjson.dumps(document), None)
    assert request.inputs[0].shared_memory == SharedMemoryRef("r", 32, 16)
    assert request.inputs[0].data == b""
    assert request.outputs[0].shared_memory == SharedMemoryRef("s", 0, 8)


@pytest.mark.parametrize("document, message", [
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0],
                  "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]},
     "Input must set only one of the following fields"),
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1],
                  "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": "4"}}]},
     "Unable to parse 'shared_memory_byte_size' of input 'A': expected an unsigned integer"),
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1],
                  "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4,
                                 "shared_memory_offset": -1}}]},
     "Unable to parse 'shared_memory_offset' of input 'A': expected an unsigned integer"),
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
      "outputs": [{"name": "O", "parameters": {"shared_memory_region": "s", "shared_memory_byte_size": 8,
                                               "binary_data": True}}]},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    # Triton checks an output's shared memory before its name
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
      "outputs": [{"parameters": {"shared_memory_region": "s", "binary_data": True}}]},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
      "outputs": [{"name": 5, "parameters": {"shared_memory_region": "s", "classification": 1}}]},
     "Output can't set both 'shared_memory_region' and 'classification'"),
])
def test_bad_shared_memory_parameters(document, message):
    error = decode_error(document)
    assert error.code.http_status == 400
    assert message in error.message


def test_an_output_s_parameters_triton_does_not_read_are_not_checked_as_in_triton():
    document = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
                "outputs": [{"name": "O", "parameters": {"x": [1, {"y": None}], "binary_data": True}}]}
    request, _ = decode_infer_request("m", None, orjson.dumps(document), None)
    assert request.outputs[0].name == "O" and request.outputs[0].parameters["binary_data"] is True


@pytest.mark.parametrize("parameters", [[], 0, "", False, [1], 5])
def test_an_output_s_parameters_that_are_not_an_object_are_refused(parameters):
    document = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
                "outputs": [{"name": "O", "parameters": parameters}]}
    error = decode_error(document)
    assert (error.code.http_status, error.message) == (400, "'parameters' of the output 'O' must be a JSON object")


def test_a_binary_switch_beside_shared_memory_that_is_not_a_boolean_gets_triton_s_words():
    document = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}],
                "outputs": [{"name": "O", "parameters": {"shared_memory_region": "s", "binary_data": "yes"}}]}
    error = decode_error(document)
    assert error.code.http_status == 500   # as Triton's JSON reader fails it
    assert error.message == "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean"


def test_outputs_in_shared_memory_carry_no_data():
    output = fp32_output()
    output.in_shared_memory = True
    result = InferResult("m", 1, "", [output, fp32_output("P")])
    headers, body = encode_infer_response(result, None, False)
    document = orjson.loads(body)
    assert document["outputs"][0] == {"name": "O", "datatype": "FP32", "shape": [2]}
    assert "data" in document["outputs"][1]


# -- responses --------------------------------------------------------------------------------

def fp32_output(name="O", values=(0.1, 1.0), shape=None):
    array = np.array(values, dtype="<f4")
    return OutputTensor(name, "FP32", list(shape or array.shape), array.tobytes())


def result(*outputs, request_id="", parameters=None, version=1) -> InferResult:
    return InferResult("m", version, request_id, list(outputs), parameters or {})


def json_response(res, requested=None, binary_default=False) -> tuple[dict, dict, bytes]:
    headers, body = encode_infer_response(res, requested, binary_default)
    return dict(headers), orjson.loads(body), body


def test_response_keys_are_in_triton_order():
    headers, document, _ = json_response(result(fp32_output(), request_id="7",
                                                parameters={"p": 1}, version=3))
    assert list(document) == ["id", "model_name", "model_version", "parameters", "outputs"]
    assert document["id"] == "7"
    assert document["model_name"] == "m"
    assert document["model_version"] == "3"
    assert document["parameters"] == {"p": 1}
    assert headers == {b"content-type": b"application/json"}


def test_id_and_parameters_are_omitted_when_empty():
    _, document, _ = json_response(result(fp32_output()))
    assert list(document) == ["model_name", "model_version", "outputs"]
    assert document["model_version"] == "1"


def test_fp32_json_output_prints_the_double_it_widens_to():
    _, document, body = json_response(result(fp32_output(values=(0.1, 2.5))))
    assert b"0.10000000149011612" in body
    (output,) = document["outputs"]
    assert output == {"name": "O", "datatype": "FP32", "shape": [2],
                      "data": [0.10000000149011612, 2.5]}


def test_json_output_data_is_flat_row_major():
    array = np.arange(6, dtype="<i4").reshape(2, 3)
    out = OutputTensor("O", "INT32", [2, 3], array.tobytes())
    _, document, _ = json_response(result(out))
    assert document["outputs"][0]["data"] == [0, 1, 2, 3, 4, 5]
    assert document["outputs"][0]["shape"] == [2, 3]


@pytest.mark.parametrize("datatype,values,dtype", [
    ("BOOL", [True, False], "?"), ("UINT8", [0, 255], "u1"), ("INT8", [-128, 127], "i1"),
    ("UINT16", [65535], "<u2"), ("INT16", [-2], "<i2"), ("UINT32", [2**32 - 1], "<u4"),
    ("INT32", [-2**31], "<i4"), ("UINT64", [2**64 - 1], "<u8"), ("INT64", [-2**63], "<i8"),
    ("FP64", [0.1, -1e300], "<f8"),
])
def test_json_outputs_of_every_json_datatype(datatype, values, dtype):
    out = OutputTensor("O", datatype, [len(values)], np.array(values, dtype=dtype).tobytes())
    _, document, _ = json_response(result(out))
    assert document["outputs"][0]["data"] == values


def test_bytes_outputs_are_json_strings():
    out = OutputTensor("S", "BYTES", [3], serialized(b"", "héllo".encode(), b"x"))
    _, document, _ = json_response(result(out))
    assert document["outputs"][0]["data"] == ["", "héllo", "x"]
    assert output_to_json("S", "BYTES", b"") == []


def test_non_utf8_bytes_outputs_cannot_be_json():
    with pytest.raises(TritiumError):
        output_to_json("S", "BYTES", serialized(b"\xff\xfe"))


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp16_and_bf16_outputs_are_refused_over_json(datatype):
    out = OutputTensor("O", datatype, [1], b"\x00\x3c")
    with pytest.raises(InvalidArgument):
        encode_infer_response(result(out), None, False)
    # ... and are fine as binary.
    headers, body = encode_infer_response(result(out), None, True)
    assert body.endswith(b"\x00\x3c")


def test_binary_outputs_follow_the_json_in_order_with_the_header_length():
    first = fp32_output("O0", (1.0, 2.0))
    second = OutputTensor("O1", "INT64", [3], np.array([7, 8, 9], dtype="<i8").tobytes())
    headers, body = encode_infer_response(result(first, second), None, True)
    headers = dict(headers)
    assert headers[b"content-type"] == b"application/octet-stream"
    header_length = int(headers[b"inference-header-content-length"])
    document = orjson.loads(body[:header_length])
    assert [o["name"] for o in document["outputs"]] == ["O0", "O1"]
    for output in document["outputs"]:
        assert "data" not in output
    sizes = [o["parameters"]["binary_data_size"] for o in document["outputs"]]
    assert sizes == [8, 24]
    assert body[header_length:] == first.data + second.data
    assert len(body) == header_length + sum(sizes)


def test_binary_data_output_applies_to_the_outputs_the_request_does_not_name():
    a, b = fp32_output("A", (1.0,)), fp32_output("B", (2.0,))
    # Triton's HTTP server reads a named output's own binary_data (default false), never the
    # request's binary_data_output
    for requested in ([RequestedOutput("A", {"binary_data": False}), RequestedOutput("B")],
                      [RequestedOutput("A"), RequestedOutput("B", {"classification": 0})]):
        headers, body = encode_infer_response(result(a, b), requested, True)
        assert dict(headers) == {b"content-type": b"application/json"}
        assert [o["data"] for o in orjson.loads(body)["outputs"]] == [[1.0], [2.0]]
    headers, body = encode_infer_response(result(a, b), None, True)
    header_length = int(dict(headers)[b"inference-header-content-length"])
    assert [o["parameters"] for o in orjson.loads(body[:header_length])["outputs"]] == [{"binary_data_size": 4}] * 2


def test_per_output_binary_data_overrides_the_default():
    a, b = fp32_output("A", (1.0,)), fp32_output("B", (2.0,))

    requested = [RequestedOutput("A", {"binary_data": True}), RequestedOutput("B")]
    headers, body = encode_infer_response(result(a, b), requested, False)
    header_length = int(dict(headers)[b"inference-header-content-length"])
    document = orjson.loads(body[:header_length])
    assert document["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert document["outputs"][1]["data"] == [2.0]
    assert body[header_length:] == a.data


def test_zero_size_binary_output_has_size_0_and_no_bytes():
    empty = OutputTensor("E", "FP32", [0], b"")
    full = fp32_output("F", (3.0,))
    headers, body = encode_infer_response(result(empty, full), None, True)
    header_length = int(dict(headers)[b"inference-header-content-length"])
    document = orjson.loads(body[:header_length])
    assert document["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert body[header_length:] == full.data


def test_binary_output_from_a_memoryview():
    data = memoryview(np.array([1.0, 2.0], dtype="<f4").tobytes())
    out = OutputTensor("O", "FP32", [2], data)
    headers, body = encode_infer_response(result(out), None, True)
    header_length = int(dict(headers)[b"inference-header-content-length"])
    assert body[header_length:] == bytes(data)


def test_bytes_binary_output_keeps_the_length_prefixes():
    raw = serialized(b"\xff", b"")
    out = OutputTensor("S", "BYTES", [2], raw)
    headers, body = encode_infer_response(result(out), None, True)
    header_length = int(dict(headers)[b"inference-header-content-length"])
    assert body[header_length:] == raw
    assert orjson.loads(body[:header_length])["outputs"][0]["parameters"] == {
        "binary_data_size": len(raw)}


@pytest.mark.parametrize("text, expected", [(b"2147483647", 2147483647), (b"0000000000082", 82), (b"", 0), (b" 5", 5),
                                            (b"82abc", 82), (b"+82", 82), (b"-0", 0)])
def test_the_header_length_is_read_as_stoi_reads_it_on_either_path(text, expected):
    assert inference_header_length(text) == expected


@pytest.mark.parametrize("text", [b"2147483648", b"9999999999", b"9" * 5000, b"-2147483649"])
def test_a_header_length_outside_a_c_int_is_out_of_range_on_either_path(text):
    with pytest.raises(InvalidArgument, match="value is out of range"):
        inference_header_length(text)
