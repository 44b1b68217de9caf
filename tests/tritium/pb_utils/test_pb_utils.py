"""tritium's triton_python_backend_utils: the API Triton Python models program against."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pytest

from tritium.pb_utils import MODULE_DIR

sys.path.insert(0, MODULE_DIR)
import triton_python_backend_utils as pb_utils  # noqa: E402


def test_tensor_from_numpy_including_bytes():
    tensor = pb_utils.Tensor("T", np.array([b"a", b"bc"], dtype=np.object_))
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype()) == ("T", [2], 13)
    assert pb_utils.Tensor("F", np.zeros((2, 3), np.float16)).triton_dtype() == 10
    assert pb_utils.Tensor("F", np.zeros(3, np.float32)).is_cpu()


def test_a_tensor_of_fixed_width_bytes_keeps_its_dtype_as_triton_s_does():
    tensor = pb_utils.Tensor("S", np.array([[b"ab", b"c"]], dtype="S2"))
    assert tensor.as_numpy().dtype == np.dtype("S2") and tensor.as_numpy().tolist() == [[b"ab", b"c"]]
    assert (tensor.shape(), tensor.triton_dtype()) == ([1, 2], 13)


@pytest.mark.parametrize("array", [np.zeros(2, np.complex64), np.array(["x", "y"])], ids=["complex", "text"])
def test_tensor_refuses_what_has_no_triton_datatype(array):
    with pytest.raises(pb_utils.TritonModelException, match=f"tensor 'C' has numpy dtype {array.dtype}, which has "
                                                            "no Triton datatype"):
        pb_utils.Tensor("C", array)


def test_type_helpers_follow_the_proto_enum():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    assert pb_utils.triton_type_to_numpy(1) is np.bool_   # as Triton's helper maps it
    assert pb_utils.numpy_to_triton_type(np.bool_) == 1 and pb_utils.numpy_to_triton_type(np.bytes_) == 13


@pytest.mark.parametrize("data_type, expected", [
    (np.dtype("float32"), 11), (np.dtype(object), 13), (np.dtype("S"), 13),
    # What Triton's helper compares unequal to every numpy type has no type, as there:
    (np.dtype("S5"), None), (bytes, None), (float, None), (bool, None), (int, None), (object, None),
    ("float32", None), (np.str_, None), (np.dtype("U3"), None),
])
def test_numpy_to_triton_type_compares_as_triton_s_helper(data_type, expected):
    assert pb_utils.numpy_to_triton_type(data_type) == expected


def test_serialize_and_deserialize_byte_tensors_as_triton_2_51_s_helpers_do():
    data = np.array([b"one", b"", "\u00e9".encode()], dtype=np.object_)
    blob = pb_utils.serialize_byte_tensor(data)
    assert blob == b"\x03\x00\x00\x00one\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"   # bytes, as 2.51 returns
    assert list(pb_utils.deserialize_bytes_tensor(blob)) == list(data)
    assert pb_utils.serialize_byte_tensor(np.array(["a", 1], dtype=np.object_)) == b"\x01\x00\x00\x00a\x01\x00\x00\x001"
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1.0])) is None


def test_response_with_error_and_parameters():
    error = pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)
    response = pb_utils.InferenceResponse(error=error, parameters={"n": 3, "ok": True})
    assert response.has_error() and response.error().message() == "bad input"
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG == 3
    assert json.loads(response.parameters()) == {"n": 3, "ok": True}
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


def test_error_codes_are_an_enum_that_equals_and_hashes_as_its_numbers_as_triton_s_binding():
    code = pb_utils.TritonError("x", pb_utils.TritonError.NOT_FOUND).code()
    assert (repr(code), str(code), code.name, code.value, int(code)) == (
        "<__ErrorCode.NOT_FOUND: 2>", "__ErrorCode.NOT_FOUND", "NOT_FOUND", 2, 2)
    assert code == 2 and code != 5 and code != pb_utils.TritonError.INTERNAL and not isinstance(code, int)
    assert code == np.int64(2) and code == 2.0 and code != "2"
    assert pickle.loads(pickle.dumps(code)) is code
    assert {2: "by number"}[code] == "by number" and {pb_utils.TritonError.NOT_FOUND: "by code"}[2] == "by code"
    with pytest.raises(TypeError, match="not supported between"):
        assert code < pb_utils.TritonError.UNAVAILABLE


def test_an_error_takes_one_of_the_codes_not_a_number_as_triton_s_constructor():
    with pytest.raises(TypeError) as refused:
        pb_utils.TritonError("x", 2)
    assert str(refused.value).startswith("__init__(): incompatible constructor arguments.")
    assert str(refused.value).endswith("Invoked with: 'x', 2")


@pytest.mark.parametrize("parameters, message", [
    ({"f": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ({"n": None}, "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
    ({"l": ["x"]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
    ([], "Expect N8pybind114dictE, got <class 'list'>"),
    ('{"a": 1}', "Expect N8pybind114dictE, got <class 'str'>"),
])
def test_parameters_triton_refuses_are_refused_with_its_words(parameters, message):
    for make in (lambda: pb_utils.InferenceResponse(parameters=parameters),
                 lambda: pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                                   parameters=parameters)):
        with pytest.raises(pb_utils.TritonModelException) as raised:
            make()
        assert str(raised.value) == message


def test_a_received_request_gives_its_parameters_as_tritons_backend_writes_them():
    """Compact, non-ASCII unescaped (Triton's JSON writer); a model's own request keeps json.dumps's spacing."""
    received = pb_utils.InferenceRequest._received("id", 0, 0, [], set(), "m", 1,
                                                   {"name": "é", "f": 1.5, "b": True, "n": -3}, None)
    assert received.parameters() == '{"name":"é","f":1.5,"b":true,"n":-3}'
    assert pb_utils.InferenceRequest._received("id", 0, 0, [], set(), "m", 1, {}, None).parameters() == "{}"
    own = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                   parameters={"a": 1, "b": "x"})
    assert own.parameters() == '{"a": 1, "b": "x"}'


def test_lookups_by_name():
    tensor = pb_utils.Tensor("OUT", np.ones(2, np.float32))
    response = pb_utils.InferenceResponse([tensor])
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is tensor
    assert pb_utils.get_output_tensor_by_name(response, "NO") is None
    request = pb_utils.InferenceRequest(inputs=[pb_utils.Tensor("IN", np.ones(1))], requested_output_names=[],
                                        model_name="m")
    assert pb_utils.get_input_tensor_by_name(request, "IN").name() == "IN"
    config = {"input": [{"name": "IN", "data_type": "TYPE_FP32"}], "output": [{"name": "OUT"}]}
    assert pb_utils.get_input_config_by_name(config, "IN")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(config, "X") is None


def test_response_sender_closes_after_the_final_flag():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, final: sent.append((response, final)))
    response = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.ones(1))])
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, False), (None, True)]
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        sender.send(response)
    with pytest.raises(pb_utils.TritonModelException) as refused:
        pb_utils.InferenceResponseSender(lambda *a: None).send()
    assert str(refused.value) == "Inference Response object must be provided when the response flags is set to zero."
    for flags in (2, 3, 7):   # (Triton's words)
        with pytest.raises(pb_utils.TritonModelException) as refused:
            pb_utils.InferenceResponseSender(lambda *a: None).send(response, flags=flags)
        assert str(refused.value) == "Unable to send response. Unsupported flag provided."


def test_a_non_decoupled_sender_sends_one_response_then_closes_with_triton_s_texts():
    sent = []
    sender = pb_utils.InferenceResponseSender(lambda response, final: sent.append((response, final)), decoupled=False)
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. Non-decoupled model cannot "
                                                            "send complete final before sending a response.$"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    response = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.ones(1))])
    sender.send(response)
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. Non-decoupled model cannot "
                                                            "send more than one response.$"):
        sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, False), (None, True)]
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_a_sender_given_something_else_than_a_response_raises_a_type_error_as_triton_s_binding_does():
    sender = pb_utils.InferenceResponseSender(lambda response, final: None)
    with pytest.raises(TypeError, match="^send\\(\\): incompatible function arguments") as raised:
        sender.send("x")
    assert "Invoked with: " in str(raised.value) and str(raised.value).endswith(", 'x'")


@pytest.mark.parametrize("arguments, problem", [
    ({"model_name": "m"}, "missing required argument(s): inputs, requested_output_names"),
    ({"inputs": [], "requested_output_names": []}, "missing required argument(s): model_name"),
    ({"model_name": "m", "inputs": None, "requested_output_names": []}, "None given for: inputs"),
    ({"model_name": "m", "inputs": [], "requested_output_names": [], "request_id": None},
     "None given for: request_id"),
])
def test_a_request_without_what_triton_requires_is_a_type_error(arguments, problem):
    """Triton's bindings have no default for inputs, requested_output_names and model_name, and
    take None for none of them: a model that runs on tritium runs on Triton."""
    with pytest.raises(TypeError, match="incompatible constructor arguments") as raised:
        pb_utils.InferenceRequest(**arguments)
    assert problem in str(raised.value)


@pytest.mark.parametrize("argument, value", [("model_version", "1"), ("model_version", 1.0), ("flags", "x"),
                                             ("flags", 2 ** 32), ("timeout", -1), ("timeout", 0.5)])
def test_a_request_s_integer_arguments_of_another_type_or_out_of_range_are_a_type_error(argument, value):
    """As Triton's bindings, when the request is made (a flag of text failed only when it ran)."""
    with pytest.raises(TypeError, match=f"incompatible constructor arguments: {argument} must be an integer"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], **{argument: value})


def test_set_flags_takes_what_the_constructor_takes():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    request.set_flags(np.uint32(2))
    assert request.flags() == 2
    with pytest.raises(TypeError, match="flags must be an integer"):
        request.set_flags("x")


def test_a_request_s_integer_arguments_may_be_numpy_integers():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                        model_version=np.int64(2), flags=np.uint32(1), timeout=np.int64(5))
    assert (request.flags(), request.timeout()) == (1, 5)


def test_a_correlation_id_is_an_integer_or_a_string():
    for wrong in (1.5, b"seq"):   # bytes are not a string to Triton's check either
        with pytest.raises(pb_utils.TritonModelException, match="^Correlation ID must be integer or string$"):
            pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=wrong)
    for right in (7, "seq", 2 ** 64 - 1):
        assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                                         correlation_id=right).correlation_id() == right
    for outside in (-1, 2 ** 64):   # not a uint64: Triton's binding cannot cast it
        with pytest.raises(RuntimeError, match="^Unable to cast Python instance to C\\+\\+ type"):
            pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id=outside)


def test_a_request_a_model_builds_has_no_sender_and_bls_needs_an_instance():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="only available to requests given to execute"):
        request.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="BLS is only supported during the 'execute' function."):
        request.exec()


def test_model_config_auto_complete_methods():
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [], "output": []})
    config.set_max_batch_size(8)
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["max_batch_size"] == 8
    assert config.as_dict()["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config.as_dict()["dynamic_batching"] == {}
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(ValueError, match="greater than the max_batch_size 4"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [4]})


def test_tensors_cross_dlpack_both_ways_as_tritons_examples_use_it():
    import torch
    from torch.utils.dlpack import from_dlpack, to_dlpack

    source = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    from_capsule = pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(source))   # Triton's documented form
    from_object = pb_utils.Tensor.from_dlpack("OUTPUT1", source)
    source[0, 0] = 7   # the same memory, not a copy
    for tensor in (from_capsule, from_object):
        assert tensor.shape() == [2, 3] and tensor.triton_dtype() == 9
        assert tensor.as_numpy().tolist() == [[7, 1, 2], [3, 4, 5]]
    floats = pb_utils.Tensor("INPUT0", np.array([1.5, 2.5], np.float32))
    assert from_dlpack(floats.to_dlpack()).tolist() == [1.5, 2.5]
    assert torch.from_dlpack(floats).tolist() == [1.5, 2.5]   # a Tensor is a DLPack object itself


def test_names_read_from_bytes_tensors_are_taken_as_triton_takes_them():
    """Triton's BLS example names the model with a BYTES input's element (bytes): a C++ string to
    Triton's bindings, which take bytes as UTF-8."""
    name = np.array([b"add_sub"], dtype=np.object_)[0]
    request = pb_utils.InferenceRequest(model_name=name, request_id=b"r-1", requested_output_names=[b"OUTPUT0"],
                                        inputs=[pb_utils.Tensor(b"INPUT0", np.zeros(2, np.float32))])
    assert (request.model_name(), request.request_id(), request.requested_output_names()) == \
        ("add_sub", "r-1", ["OUTPUT0"])
    assert [type(tensor.name()) for tensor in request.inputs()] == [str]


# -- arguments refused as Triton's bindings refuse them ---------------------------------------

def _request(**arguments):
    return pb_utils.InferenceRequest(**{"model_name": "m", "inputs": [], "requested_output_names": [], **arguments})


@pytest.mark.parametrize("make, error, message", [
    (lambda: _request(inputs=[None]), pb_utils.TritonModelException,
     "Input tensor for request with id '' and model name 'm' should not be empty."),
    (lambda: _request(requested_output_names=[""], request_id="r"), pb_utils.TritonModelException,
     "Requested output name for request with id 'r' and model name 'm' should not be empty."),
    (lambda: _request(requested_output_names=[None]), TypeError, None),
    (lambda: _request(inputs=[np.ones(2)]), TypeError, None),
    (lambda: _request(requested_output_names="OUT"), TypeError, None),
    (lambda: _request(requested_output_names={"OUT"}), TypeError, None),
    (lambda: _request(flags=None), TypeError, None),
    (lambda: pb_utils.InferenceResponse(output_tensors=[None]), pb_utils.TritonModelException,
     "Output tensor for inference response should not be empty."),
    (lambda: pb_utils.InferenceResponse(output_tensors=None), TypeError, None),
    (lambda: pb_utils.InferenceResponse(error="text"), TypeError, None),
    (lambda: pb_utils.Tensor(None, np.ones(2)), TypeError, None),
    (lambda: pb_utils.Tensor("OUT", None), TypeError, None),
    (lambda: pb_utils.Tensor("OUT", [1, 2]), TypeError, None),
    (lambda: pb_utils.Tensor("", None), TypeError, None),
    (lambda: pb_utils.Tensor("", np.ones(2)), pb_utils.TritonModelException, "Tensor name cannot be an empty string."),
    (lambda: pb_utils.Tensor.from_dlpack("", None), pb_utils.TritonModelException,
     "Tensor name cannot be an empty string."),
    (lambda: pb_utils.Tensor.from_dlpack("OUT", None), pb_utils.TritonModelException,
     "Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and "
     "`__dlpack_device__` attributes"),
    (lambda: pb_utils.Logger.log("text", None), TypeError, None),
    (lambda: pb_utils.Logger.log("text", 1), TypeError, None),
    # pybind11's words, as Triton 2.51 says them
    (lambda: pb_utils.Logger.log_info(None), TypeError, "log_info(): incompatible function arguments. The following "
                                                        "argument types are supported:\n    1. (message: str) -> None"
                                                        "\n\nInvoked with: None"),
    (lambda: pb_utils.Logger.log(None), TypeError, "log(): incompatible function arguments. The following argument "
                                                   "types are supported:\n    1. (message: str, level: "
                                                   "c_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"
                                                   "\n\nInvoked with: None"),
    (lambda: pb_utils.Logger.log_verbose(None), TypeError, "log_verbose(): incompatible function arguments. The "
                                                           "following argument types are supported:\n    1. (message: "
                                                           "str) -> None\n\nInvoked with: None"),
], ids=["request-none-input", "request-empty-output-name", "request-none-output-name", "request-array-input",
        "request-output-names-str", "request-output-names-set",
        "request-none-flags", "response-none-tensor", "response-none-list", "response-text-error",
        "tensor-none-name", "tensor-none-data", "tensor-list-data", "tensor-empty-name-none-data",
        "tensor-empty-name", "dlpack-empty-name", "dlpack-none", "log-none-level", "log-int-level",
        "log-info-none", "log-none", "log-verbose-none"])
def test_arguments_triton_refuses_are_refused_with_its_error_types_and_words(make, error, message):
    with pytest.raises(error) as raised:
        make()
    if message is not None:
        assert str(raised.value) == message


def test_arguments_triton_takes_are_taken():
    assert _request(correlation_id=5).correlation_id() == 5
    assert pb_utils.InferenceResponse(output_tensors=[]).output_tensors() == []
    assert pb_utils.Tensor(b"OUT", np.ones(2)).name() == "OUT"
    assert pb_utils.Logger.LogLevel.WARNING is pb_utils.Logger.WARNING and int(pb_utils.Logger.WARNING) == 1
    pb_utils.Logger.log("level unspecified")
    pb_utils.Logger.log("warned", pb_utils.Logger.WARNING)


def test_a_bf16_tensor_goes_through_dlpack_not_numpy():
    torch = pytest.importorskip("torch")
    values = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    for given in (torch.utils.dlpack.to_dlpack(values), values):   # a capsule, or the tensor itself
        tensor = pb_utils.Tensor.from_dlpack("X", given)
        with pytest.raises(pb_utils.TritonModelException, match=r"^Tensor dtype is BF16 and cannot be converted to "
                                                                r"NumPy\. Use to_dlpack\(\) and from_dlpack\(\) instead\.$"):
            tensor.as_numpy()
        back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        assert back.dtype == torch.bfloat16 and back.tolist() == [[1.5, -2.0]]
        assert torch.from_dlpack(tensor).tolist() == [[1.5, -2.0]]
        assert torch.from_dlpack(pb_utils.Tensor.from_dlpack("Z", tensor)).tolist() == [[1.5, -2.0]]
    shared = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(torch.ones(2)))
    assert shared.as_numpy().tolist() == [1.0, 1.0]


def test_c_python_backend_utils_holds_the_same_classes_and_the_shared_memory():
    import c_python_backend_utils as c_utils

    assert c_utils.Tensor is pb_utils.Tensor and c_utils.InferenceRequest is pb_utils.InferenceRequest
    assert c_utils.TritonModelException is pb_utils.TritonModelException
    assert c_utils.shared_memory.free_memory() > 0


def test_get_model_dir_is_the_models_version_folder():
    from tritium.pb_utils.types import runtime

    runtime.model_dir = "/models/m/1"
    assert pb_utils.get_model_dir() == "/models/m/1"
