"""A request's inputs and outputs against ModelSpec.from_config, with Triton's messages (reference 1.4, 2.12)."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from tritium.gateway.inference import InferRequest, InputTensor, RequestedOutput
from tritium.gateway.model_table import ModelSpec
from tritium.gateway.validation import check_bytes_elements, check_requested_outputs, element_count, validate_inputs
from tritium.errors import ErrorCode, InvalidArgument, TritiumError, Unsupported


def validate_request(model: ModelSpec, request: InferRequest) -> int:
    """The inputs, then the requested outputs, as the data plane checks them; the batch size."""
    batch_size = validate_inputs(model, request)
    check_requested_outputs(model, request)
    return batch_size


def tensor_config(name, data_type="TYPE_FP32", dims=(16,), optional=False):
    entry = {"name": name, "data_type": data_type, "dims": list(dims)}
    if optional:
        entry["optional"] = True
    return entry


def spec(inputs=None, outputs=None, max_batch_size=8, name="m", decoupled=False) -> ModelSpec:
    config = {
        "name": name, "platform": "onnxruntime_onnx", "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": inputs if inputs is not None else [tensor_config("A"), tensor_config("B")],
        "output": outputs if outputs is not None else [tensor_config("OUT0"), tensor_config("OUT1")],
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return ModelSpec.from_config(config)


def fp32(name, shape, datatype="FP32"):
    return InputTensor(name, datatype, list(shape), np.zeros(shape, dtype=np.float32).tobytes())


def bytes_tensor(name, shape, items):
    data = b"".join(struct.pack("<I", len(i)) + i for i in items)
    return InputTensor(name, "BYTES", list(shape), data)


def request(*inputs, outputs=None, model="m") -> InferRequest:
    return InferRequest(model=model, version=None, inputs=list(inputs), outputs=outputs)


def error_of(model_spec, req) -> TritiumError:
    with pytest.raises(TritiumError) as info:
        validate_request(model_spec, req)
    return info.value


def invalid(model_spec, req) -> str:
    error = error_of(model_spec, req)
    assert isinstance(error, InvalidArgument)
    assert error.code.http_status == 400
    return error.message


# -- good requests --------------------------------------------------------------------------

def test_a_good_batched_request_returns_its_batch_size():
    assert validate_request(spec(), request(fp32("A", (3, 16)), fp32("B", (3, 16)))) == 3


def test_a_good_request_to_a_non_batching_model_has_batch_size_1():
    s = spec(inputs=[tensor_config("A", dims=(4, 16))], max_batch_size=0)
    assert validate_request(s, request(fp32("A", (4, 16)))) == 1


def test_input_order_does_not_matter():
    assert validate_request(spec(), request(fp32("B", (2, 16)), fp32("A", (2, 16)))) == 2


def test_requested_outputs_that_exist_pass():
    req = request(fp32("A", (1, 16)), fp32("B", (1, 16)), outputs=[RequestedOutput("OUT1")])
    assert validate_request(spec(), req) == 1


# -- inputs: unknown, missing, optional --------------------------------------------------------

def test_unknown_input():
    message = invalid(spec(), request(fp32("A", (1, 16)), fp32("X", (1, 16))))
    assert message == "unexpected inference input 'X' for model 'm'"


def test_missing_required_input_uses_triton_wording():
    message = invalid(spec(), request(fp32("A", (1, 16))))
    assert message == (
        "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['A'], but missing "
        "required input(s) ['B']. Please provide all required input(s).")


def test_an_input_too_many_is_listed_as_triton_lists_it():
    """Triton 2.51 side by side: its hash map's order (the reverse of the request's, for a few
    inputs), and its list of missing inputs, when empty, without its "["."""
    message = invalid(spec(), request(fp32("A", (1, 16)), fp32("B", (1, 16)), fp32("X", (1, 16))))
    assert message == (
        "expected 2 inputs but got 3 inputs for model 'm'. Got input(s) ['X','B','A'], but missing "
        "required input(s) ]. Please provide all required input(s).")


def test_no_inputs_at_all():
    message = invalid(spec(), request())
    assert message == (
        "expected 2 inputs but got 0 inputs for model 'm'. Got input(s) [], but missing "
        "required input(s) ['A','B']. Please provide all required input(s).")


def test_missing_input_with_optional_inputs_gives_the_range():
    s = spec(inputs=[tensor_config("A"), tensor_config("B"), tensor_config("C", optional=True)])
    message = invalid(s, request(fp32("C", (1, 16))))
    assert message == (
        "expected number of inputs between 2 and 3 but got 1 inputs for model 'm'. Got input(s) "
        "['C'], but missing required input(s) ['A','B']. Please provide all required input(s).")


def test_optional_inputs_may_be_left_out():
    s = spec(inputs=[tensor_config("A"), tensor_config("C", optional=True)])
    assert validate_request(s, request(fp32("A", (2, 16)))) == 2
    assert validate_request(s, request(fp32("A", (2, 16)), fp32("C", (2, 16)))) == 2


def test_an_input_given_twice_is_refused():
    message = invalid(spec(), request(fp32("A", (1, 16)), fp32("A", (1, 16)), fp32("B", (1, 16))))
    assert "'A'" in message and "'m'" in message


def test_too_few_inputs_is_reported_before_an_unknown_name():
    message = invalid(spec(), request(fp32("X", (1, 16))))
    assert message.startswith("expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['X']")


# -- datatype ------------------------------------------------------------------------------

def test_datatype_mismatch():
    bad = InputTensor("A", "INT32", [1, 16], np.zeros((1, 16), np.int32).tobytes())
    message = invalid(spec(), request(bad, fp32("B", (1, 16))))
    assert message == "inference input 'A' data-type is 'INT32', but model 'm' expects 'FP32'"


def test_bytes_config_type_is_called_bytes():
    s = spec(inputs=[tensor_config("S", "TYPE_STRING", (1,))])
    message = invalid(s, request(fp32("S", (1, 1))))
    assert message == "inference input 'S' data-type is 'FP32', but model 'm' expects 'BYTES'"


# -- shape -----------------------------------------------------------------------------------

def test_shape_without_the_batch_dimension():
    message = invalid(spec(), request(fp32("A", (4,)), fp32("B", (4, 16))))
    assert message.startswith(
        "unexpected shape for input 'A' for model 'm'. Expected [-1,16], got [4]. NOTE: Setting a "
        "non-zero max_batch_size in the model config requires a batch dimension to be prepended "
        "to each input shape.")


def test_shape_note_ends_with_triton_words():
    message = invalid(spec(), request(fp32("A", (4,)), fp32("B", (4, 16))))
    assert message.endswith(
        "If you want to specify the full shape including the batch dim in your input dims config, "
        "try setting max_batch_size to zero. See the model configuration docs for more info on "
        "max_batch_size.")


def test_shape_with_a_wrong_dim():
    message = invalid(spec(), request(fp32("A", (1, 15)), fp32("B", (1, 16))))
    assert message.startswith("unexpected shape for input 'A' for model 'm'. Expected [-1,16], got [1,15].")


def test_shape_of_a_non_batching_model_has_no_batch_dim_and_no_note():
    s = spec(inputs=[tensor_config("A", dims=(2, 3))], max_batch_size=0)
    message = invalid(s, request(fp32("A", (1, 2, 3))))
    # Triton's words, the space before the (absent) note included
    assert message == "unexpected shape for input 'A' for model 'm'. Expected [2,3], got [1,2,3]. "


def test_variable_dims_accept_any_size():
    s = spec(inputs=[tensor_config("A", dims=(-1, 4))], max_batch_size=8)
    assert validate_request(s, request(fp32("A", (2, 7, 4)))) == 2
    assert validate_request(s, request(fp32("A", (1, 1, 4)))) == 1
    message = invalid(s, request(fp32("A", (2, 7, 5))))
    assert "Expected [-1,-1,4], got [2,7,5]" in message


def test_variable_dims_of_a_non_batching_model():
    s = spec(inputs=[tensor_config("A", dims=(-1, -1))], max_batch_size=0)
    assert validate_request(s, request(fp32("A", (3, 5)))) == 1
    message = invalid(s, request(fp32("A", (3,))))
    assert "Expected [-1,-1], got [3]" in message


def test_empty_shape_on_a_batching_model_is_refused():
    message = invalid(spec(inputs=[tensor_config("A")]), request(InputTensor("A", "FP32", [], b"")))
    assert message == "input 'A' has no shape but model requires batch dimension for 'm'"


def test_several_faults_get_the_message_triton_gives_first():
    """Triton checks every input's batch dimension, then the batch size, then each input's
    datatype and shape, inputs in the reverse of the request's order (its hash map's, for a few
    inputs; each case checked with Triton 2.51)."""
    # B's datatype is wrong, and A's batch size is not B's: the batch sizes come first, B's the reference.
    message = invalid(spec(), request(fp32("A", (2, 16)), InputTensor("B", "INT32", [1, 16], b"\0" * 64)))
    assert message == "input 'A' batch size does not match other inputs for 'm'"
    # A's shape is wrong and the batch is too large: the batch size comes first.
    message = invalid(spec(), request(fp32("B", (9, 16)), fp32("A", (9, 15))))
    assert message == "inference request batch-size must be <= 8 for 'm'"
    # Both have a wrong datatype: the one given last.
    message = invalid(spec(), request(InputTensor("B", "INT32", [1, 16], b"\0" * 64),
                                      InputTensor("A", "INT32", [1, 16], b"\0" * 64)))
    assert message == "inference input 'A' data-type is 'INT32', but model 'm' expects 'FP32'"


# -- batch size ----------------------------------------------------------------------------

def test_batch_size_above_max_batch_size():
    message = invalid(spec(), request(fp32("A", (9, 16)), fp32("B", (9, 16))))
    assert message == "inference request batch-size must be <= 8 for 'm'"


def test_batch_size_equal_to_max_batch_size_passes():
    assert validate_request(spec(), request(fp32("A", (8, 16)), fp32("B", (8, 16)))) == 8


def test_inconsistent_batch_sizes_across_inputs_are_refused():
    message = invalid(spec(), request(fp32("A", (2, 16)), fp32("B", (3, 16))))
    assert "'A'" in message and "'m'" in message   # B, given last, is checked first (Triton's order)


def test_inconsistent_batch_sizes_use_triton_wording():
    message = invalid(spec(), request(fp32("A", (2, 16)), fp32("B", (3, 16))))
    assert message == "input 'A' batch size does not match other inputs for 'm'"


# -- byte sizes ------------------------------------------------------------------------------

def test_byte_size_mismatch():
    short = InputTensor("A", "FP32", [1, 16], b"\x00" * 60)
    message = invalid(spec(), request(short, fp32("B", (1, 16))))
    assert message == "input byte size mismatch for input 'A' for model 'm'. Expected 64, got 60"


@pytest.mark.parametrize("data_type,datatype,itemsize", [
    ("TYPE_BOOL", "BOOL", 1), ("TYPE_UINT8", "UINT8", 1), ("TYPE_INT16", "INT16", 2),
    ("TYPE_UINT32", "UINT32", 4), ("TYPE_INT64", "INT64", 8), ("TYPE_FP16", "FP16", 2),
    ("TYPE_FP64", "FP64", 8), ("TYPE_BF16", "BF16", 2),
])
def test_byte_size_follows_the_datatype(data_type, datatype, itemsize):
    s = spec(inputs=[tensor_config("A", data_type, (3,))])
    good = InputTensor("A", datatype, [2, 3], memoryview(b"\x00" * (6 * itemsize)))
    assert validate_request(s, request(good)) == 2
    bad = InputTensor("A", datatype, [2, 3], b"\x00" * (6 * itemsize + 1))
    assert invalid(s, request(bad)) == (
        f"input byte size mismatch for input 'A' for model 'm'. Expected {6 * itemsize}, "
        f"got {6 * itemsize + 1}")


def test_zero_sized_tensor_needs_zero_bytes():
    s = spec(inputs=[tensor_config("A", dims=(-1,))])
    assert validate_request(s, request(InputTensor("A", "FP32", [1, 0], b""))) == 1


# -- BYTES ---------------------------------------------------------------------------------

def bytes_spec():
    return spec(inputs=[tensor_config("S", "TYPE_STRING", (-1,))])


def test_bytes_element_count_matches_shape():
    req = request(bytes_tensor("S", (1, 3), [b"a", b"", b"\xff\xfe"]))
    assert validate_request(bytes_spec(), req) == 1


def test_bytes_with_fewer_elements_than_the_shape():
    message = invalid(bytes_spec(), request(bytes_tensor("S", (1, 3), [b"a", b"b"])))
    assert message == "expected 3 string elements for inference input 'S' for model 'm', got 2"


def test_bytes_with_more_elements_than_the_shape_are_refused_at_the_first_too_many():
    message = invalid(bytes_spec(), request(bytes_tensor("S", (1, 1), [b"a", b"b", b"c"])))
    assert message == "unexpected number of string elements 2 for inference input 'S' for model 'm', expecting 1"


LENGTH_CUT = ("incomplete string length indicator for inference input 'S' for model 'm', expecting 4 bytes but "
              "only {} bytes available. Please make sure the string length indicator is in one buffer.")


@pytest.mark.parametrize("shape, data, message", [   # Triton 2.51's words, core's then the backend's
    ([1, 1], b"\x01\x00", LENGTH_CUT.format(2)),
    ([1, 2], struct.pack("<I", 1) + b"a" + b"\x05", LENGTH_CUT.format(1)),
    ([1, 1], struct.pack("<I", 10) + b"ab",
     "incomplete string data for inference input 'S', expecting string of length 10 but only 2 bytes available"),
    ([1, 2], struct.pack("<I", 10) + b"ab", "expected 2 string elements for inference input 'S' for model 'm', got 1"),
    ([1, 1], struct.pack("<I", 1) + b"a" + struct.pack("<I", 9), "unexpected number of string elements 2 for "
     "inference input 'S' for model 'm', expecting 1"),
])
def test_malformed_bytes_framing_is_refused_as_triton_refuses_it(shape, data, message):
    assert invalid(bytes_spec(), request(InputTensor("S", "BYTES", shape, data))) == message


def test_check_bytes_elements():
    data = b"".join(struct.pack("<I", len(i)) + i for i in [b"", b"xy", b"\x00" * 5])
    check_bytes_elements(data, "S", "m", 3)
    check_bytes_elements(memoryview(data), "S", "m", 3)
    check_bytes_elements(b"", "S", "m", 0)
    with pytest.raises(InvalidArgument):
        check_bytes_elements(data[:-1], "S", "m", 3)


def test_element_count():
    assert element_count([]) == 1
    assert element_count([2, 3, 4]) == 24
    assert element_count([5, 0]) == 0


# -- outputs, decoupled ----------------------------------------------------------------------

def test_unknown_requested_output():
    req = request(fp32("A", (1, 16)), fp32("B", (1, 16)),
                  outputs=[RequestedOutput("OUT0"), RequestedOutput("NOPE")])
    assert invalid(spec(), req) == "unexpected inference output 'NOPE' for model 'm'"


def test_decoupled_model_is_unsupported_501():
    from tritium.gateway.validation import check_single_response

    with pytest.raises(TritiumError) as raised:
        check_single_response(spec(decoupled=True), "HTTP end point doesn't support models with "
                                                    "decoupled transaction policy")
    error = raised.value
    assert isinstance(error, Unsupported)
    assert error.code == ErrorCode.UNSUPPORTED
    assert error.code.http_status == 501
    assert error.message == "HTTP end point doesn't support models with decoupled transaction policy"


# -- ModelSpec.from_config -----------------------------------------------------------------

def test_model_spec_from_config():
    s = ModelSpec.from_config({
        "name": "m", "platform": "", "backend": "python", "max_batch_size": 4,
        "input": [{"name": "A", "data_type": "TYPE_INT64", "dims": [-1, 3]},
                  {"name": "B", "data_type": "TYPE_STRING", "dims": [1], "optional": True}],
        "output": [{"name": "O", "data_type": "TYPE_BF16", "dims": [2, 3]}],
    })
    assert s.platform == "python"
    assert s.max_batch_size == 4
    assert s.decoupled is False
    assert list(s.inputs) == ["A", "B"]
    assert s.inputs["A"].datatype.name == "INT64"
    assert s.inputs["A"].dims == (-1, 3)
    assert s.inputs["A"].fixed_elements is None
    assert s.inputs["B"].datatype.name == "BYTES"
    assert s.inputs["B"].optional is True
    assert s.outputs["O"].fixed_elements == 6
    assert s.required_inputs == ["A"]
    assert s.metadata_shape(s.inputs["A"]) == [-1, -1, 3]


def test_inputs_found_valid_are_remembered_and_what_differs_is_checked_again():
    """The model remembers valid inputs by their names, datatypes, shapes and sizes: the same
    again is valid at once, with its batch size; a size, shape or order it has not seen is
    checked (and refused) as the first time; BYTES inputs are always counted."""
    model = spec()
    assert validate_request(model, request(fp32("A", [3, 16]), fp32("B", [3, 16]))) == 3
    assert validate_request(model, request(fp32("A", [3, 16]), fp32("B", [3, 16]))) == 3
    assert len(model.valid_inputs) == 1
    short = fp32("B", [3, 16])
    short.data = short.data[:-4]
    assert error_of(model, request(fp32("A", [3, 16]), short)).message.startswith("input byte size mismatch")
    assert "does not match" in error_of(model, request(fp32("A", [3, 16]), fp32("B", [2, 16]))).message
    assert validate_request(model, request(fp32("B", [2, 16]), fp32("A", [2, 16]))) == 2
    texts = spec(inputs=[tensor_config("T", "TYPE_STRING", (2,))])
    assert validate_request(texts, request(bytes_tensor("T", [1, 2], [b"ab", b"c"]))) == 1
    one_in_the_same_bytes = bytes_tensor("T", [1, 2], [b"abcdefg"])
    assert len(one_in_the_same_bytes.data) == len(bytes_tensor("T", [1, 2], [b"ab", b"c"]).data)
    assert "expected 2 string elements" in error_of(texts, request(one_in_the_same_bytes)).message
    assert texts.valid_inputs == {}


def test_a_request_without_inputs_to_a_model_whose_inputs_are_all_optional():
    """A model without batching takes it; a batching one refuses it as Triton 2.51 does (checked side
    by side: its core reads the batch size from the first input)."""
    assert validate_request(spec(inputs=[tensor_config("A", optional=True)], max_batch_size=0), request()) == 1
    with pytest.raises(InvalidArgument) as refused:
        validate_request(spec(inputs=[tensor_config("A", optional=True)]), request())
    assert refused.value.message.endswith("out of bounds index 0: request has 0 inputs")


@pytest.mark.parametrize("config", [
    {"sequence_batching": {"control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]}},
    {"sequence_batching": {"state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
                                      "dims": [1]}]}},
    {"platform": "ensemble"},
])
def test_a_batching_model_whose_scheduler_adds_inputs_runs_a_request_given_none(config):
    """Sequence controls and implicit state reach the model as inputs (Triton's backend finds an
    input 0), and an ensemble's steps get what they get: a batch of one."""
    model = spec(inputs=[tensor_config("A", optional=True)])
    model = ModelSpec.from_config({**orjson.loads(model.config_json), **config})
    assert validate_request(model, request()) == 1
