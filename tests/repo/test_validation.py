"""Validation after auto-complete: each failure's message names the model, the tensor and the field."""

from __future__ import annotations

import pytest

from tritium.repo import ModelLoadError
from tritium.repo.errors import ConfigRejected, InvalidInputsOutputs
from tritium.repo.config_file import parse_config_text
from tritium.repo.normalize import normalize
from tritium.repo.validate import validate_basics, validate_config
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, load, load_error, minimal_io, version_error, write_model

IO = minimal_io()
BATCH_IO = minimal_io(max_batch_size=8)


def check(text: str, backend: str = "python", platform: str = "") -> None:
    config = parse_config_text("m", text)
    config.name = "m"
    config.backend = config.backend or backend
    config.platform = config.platform or platform
    normalize(config)
    validate_config(config)


def invalid(text: str, **kwargs) -> str:
    with pytest.raises(ModelLoadError) as info:
        check(text, **kwargs)
    assert info.value.model == "m"
    message = info.value.message
    assert message.startswith("model 'm': ")
    return message.removeprefix("model 'm': ")


def test_a_valid_config_passes():
    check(BATCH_IO + "dynamic_batching { preferred_batch_size: [ 2, 8 ] }")
    check(IO)


def test_negative_max_batch_size():
    assert invalid("max_batch_size: -2") == "'max_batch_size' must be non-negative, got -2"


# -- inputs and outputs --------------------------------------------------------------------

def test_tensor_without_name():
    assert invalid('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]') == "every input must specify 'name'"
    assert invalid('output [ { data_type: TYPE_FP32 dims: [ 1 ] } ]') == "every output must specify 'name'"


def test_duplicate_tensor_names():
    text = ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] },'
            ' { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]')
    assert invalid(text) == "input 'X' is listed more than once"
    text = ('output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },'
            ' { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    assert invalid(text) == "output 'Y' is listed more than once"


def test_missing_datatype():
    assert invalid('input [ { name: "X" dims: [ 1 ] } ]') == "input 'X' must specify 'data_type'"
    assert invalid('output [ { name: "Y" data_type: TYPE_INVALID dims: [ 1 ] } ]') == (
        "output 'Y' must specify 'data_type'")


def test_missing_dims():
    message = invalid('input [ { name: "X" data_type: TYPE_FP32 } ]')
    assert message.startswith("input 'X' must specify 'dims'")
    assert "reshape: { shape: [ ] }" in message


@pytest.mark.parametrize("dim", [0, -2])
def test_invalid_dims(dim):
    message = invalid(f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2, {dim} ] }} ]')
    assert message.startswith(f"output 'Y' has dimension {dim}; a dimension must be an integer >= 1")
    assert "or -1 for a variable-size dimension" in message


def test_empty_reshape_needs_batching():
    text = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]'
    assert "input 'X' cannot have an empty reshape for a non-batching model" in invalid(text)
    check("max_batch_size: 2\n" + text)  # fine when batching: a scalar per batch item


def test_reshape_element_counts_must_match():
    text = ('max_batch_size: 1 input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 3 ]'
            ' reshape: { shape: [ 4 ] } } ]')
    assert invalid(text) == "input 'X' has dims [2, 3] (6 elements) but reshape [4] (4 elements)"
    check(text.replace("shape: [ 4 ]", "shape: [ 3, 2 ]"))
    assert "has dims [2] (2 elements) but reshape [] (1 elements)" in invalid(
        text.replace("dims: [ 2, 3 ]", "dims: [ 2 ]").replace("shape: [ 4 ]", "shape: [ ]"))


def test_reshape_with_variable_dims():
    base = 'output [ {{ name: "Y" data_type: TYPE_FP32 dims: {dims} reshape: {{ shape: {shape} }} }} ]'
    check(base.format(dims="[ 2, 4, -1, 6 ]", shape="[ 8, -1, 1, 6 ]"))
    assert invalid(base.format(dims="[ 2, -1 ]", shape="[ 3, -1 ]")) == (
        "output 'Y' has different sizes for dims [2, -1] and reshape [3, -1]")
    assert invalid(base.format(dims="[ -1 ]", shape="[ 4 ]")) == (
        "output 'Y' has different sizes for dims [-1] and reshape [4]")
    assert "output 'Y' has reshape dimension 0" in invalid(base.format(dims="[ 4 ]", shape="[ 0 ]"))


def test_image_formats_need_three_dims():
    text = 'input [ { name: "X" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 224, 224 ] } ]'
    assert invalid(text) == "input 'X' has format FORMAT_NHWC, which needs exactly 3 dims, got 2"
    check(text.replace("dims: [ 224, 224 ]", "dims: [ 224, 224, 3 ]"))


def test_shape_tensors_are_tensorrt_only():
    text = 'input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]'
    assert invalid(text) == "input 'X' sets is_shape_tensor, which only TensorRT models support"


# -- dynamic batching ----------------------------------------------------------------------

def test_preferred_batch_size_larger_than_max_batch_size():
    assert invalid(BATCH_IO + "dynamic_batching { preferred_batch_size: [ 4, 16 ] }") == (
        "dynamic_batching preferred_batch_size 16 is larger than max_batch_size 8")
    assert invalid(IO + "dynamic_batching { preferred_batch_size: [ 1 ] }") == (
        "dynamic_batching preferred_batch_size 1 is larger than max_batch_size 0")


def test_preferred_batch_size_must_be_positive():
    assert invalid(BATCH_IO + "dynamic_batching { preferred_batch_size: [ 0 ] }") == (
        "dynamic_batching preferred_batch_size 0 must be positive")


def test_dynamic_batching_without_max_batch_size_is_accepted():
    check(IO + "dynamic_batching { }")  # Triton accepts it; the batcher never batches


def test_priority_levels():
    assert invalid(BATCH_IO + "dynamic_batching { priority_levels: 3 }") == (
        "dynamic_batching default_priority_level must be in range [1, 3], got 0")
    assert invalid(BATCH_IO + "dynamic_batching { priority_levels: 3 default_priority_level: 4 }") == (
        "dynamic_batching default_priority_level must be in range [1, 3], got 4")
    text = (BATCH_IO + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 5 value { max_queue_size: 1 } } }")
    assert invalid(text) == "dynamic_batching priority_queue_policy level 5 must be in range [1, 2]"
    check(text.replace("key: 5", "key: 2"))


def test_preserve_ordering_conflicts():
    text = (BATCH_IO + "dynamic_batching { preserve_ordering: true priority_levels: 2 "
            "default_priority_level: 1 }")
    assert invalid(text) == "only one priority level is allowed when 'preserve_ordering' is true"
    text = (BATCH_IO + "dynamic_batching { preserve_ordering: true default_queue_policy { "
            "timeout_action: DELAY default_timeout_microseconds: 100 } }")
    assert invalid(text) == ("a queue policy cannot have timeout_action DELAY when "
                             "'preserve_ordering' is true")
    check(text.replace("DELAY", "REJECT"))


# -- sequence batching ---------------------------------------------------------------------

def control(name: str, body: str) -> str:
    return f'control_input [ {{ name: "{name}" control [ {{ {body} }} ] }} ]'


def test_valid_sequence_controls():
    check(BATCH_IO + "sequence_batching { "
          + control("START", "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]")
          + control("CORRID", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64") + " }")
    # Triton 2.51 loads a string CORRID too.
    check(BATCH_IO + "sequence_batching { "
          + control("CORRID", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING") + " }")


def test_sequence_control_errors():
    def seq(body: str) -> str:
        return invalid(BATCH_IO + f"sequence_batching {{ {body} }}")

    start = "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]"
    assert seq('control_input [ { control [ { ' + start + ' } ] } ]') == (
        "every sequence_batching control_input must have a name")
    assert seq(control("S", start) + control("S", "kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ]")) == (
        "sequence_batching control tensor 'S' is specified more than once")
    assert seq(control("A", start) + control("B", start)) == (
        "sequence_batching specifies more than one CONTROL_SEQUENCE_START tensor")
    assert seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32")) == (
        "sequence_batching control 'C' (CONTROL_SEQUENCE_CORRID) has data type TYPE_FP32; "
        "allowed are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
    assert seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 "
                            "int32_false_true: [ 0, 1 ]")) == (
        "sequence_batching control 'C' (CONTROL_SEQUENCE_CORRID) must not specify false/true values")
    assert seq(control("R", "kind: CONTROL_SEQUENCE_READY")) == (
        "sequence_batching control 'R' (CONTROL_SEQUENCE_READY) must specify exactly one of "
        "int32_false_true, fp32_false_true or bool_false_true")
    assert seq(control("R", "kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1, 1 ]")) == (
        "sequence_batching control 'R' (CONTROL_SEQUENCE_READY) must have exactly 2 false/true "
        "values, got 3")


def test_sequence_strategy_errors():
    assert invalid(BATCH_IO + "sequence_batching { oldest { preferred_batch_size: [ 9 ] } }") == (
        "sequence_batching oldest preferred_batch_size 9 must be in range [1, max_batch_size 8]")
    assert invalid(BATCH_IO + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }") == (
        "sequence_batching direct minimum_slot_utilization 1.5 must be in range (0.0, 1.0]")


STATE = ('sequence_batching { state [ { input_name: "IS" output_name: "OS" data_type: TYPE_INT32 dims: [ 1 ] '
         '%s } ] }')


@pytest.mark.parametrize("initial, message", [
    ("initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: \"i\" }",
     "'initial_state' dim for input name 'IS' doesn't match 'state' dim description. 2 != 1"),
    ("initial_state { data_type: TYPE_INT32 dims: [ 1 ] name: \"i\" }",
     "initial_state setting expects state'IS' to have state_data set"),
    ("initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }",
     "Field 'name' must be set when using initial_state for state input 'IS'."),
    ("initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: \"i\" }",
     "The data type used for 'initial_state' field of state 'IS' does not match the state data type."),
    ("initial_state { data_type: TYPE_INT32 dims: [ 1, 1 ] zero_data: true name: \"i\" }",
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
     "'IS'. 2 != 1"),
])
def test_initial_state_errors_are_tritons(initial, message):
    assert invalid(BATCH_IO + STATE % initial) == message
    check(BATCH_IO + STATE % 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "i" }')


def test_a_state_without_a_data_type_is_refused_by_name():
    assert invalid(BATCH_IO + STATE.replace("data_type: TYPE_INT32 ", "") % "") == (
        "sequence_batching state 'IS' must specify a data_type")


# -- ensembles and decoupled ---------------------------------------------------------------

def test_ensemble_platform_needs_ensemble_scheduling():
    assert invalid(IO, backend="", platform="ensemble") == (
        "ensemble scheduling must be set for ensemble 'm' whose platform is ensemble")


def test_ensemble_scheduling_needs_ensemble_platform():
    text = IO + 'ensemble_scheduling { step [ { model_name: "a" } ] }'
    assert invalid(text, backend="onnxruntime", platform="onnxruntime_onnx") == (
        "'ensemble_scheduling' is set but platform is 'onnxruntime_onnx', not 'ensemble'")


def test_ensemble_tensor_both_input_and_output():
    text = ('input [ { name: "T" data_type: TYPE_FP32 dims: [ 1 ] } ]'
            'output [ { name: "T" data_type: TYPE_FP32 dims: [ 1 ] } ]'
            'ensemble_scheduling { step [ { model_name: "a" } ] }')
    assert invalid(text, backend="", platform="ensemble") == (
        "ensemble tensor 'T' is both an input and an output")


@pytest.mark.parametrize("backend, platform", [("onnxruntime", "onnxruntime_onnx"),
                                               ("pytorch", "pytorch_libtorch")])
def test_decoupled_needs_a_backend_that_can_serve_it(backend, platform):
    message = invalid(IO + "model_transaction_policy { decoupled: true }", backend=backend,
                      platform=platform)
    assert message == (f"'model_transaction_policy {{ decoupled: true }}' is not supported by the "
                       f"{backend} backend; only python and custom backends can be decoupled")


def test_decoupled_python_is_fine_but_not_with_the_response_cache():
    check(IO + "model_transaction_policy { decoupled: true } dynamic_batching { }")
    assert invalid(IO + "model_transaction_policy { decoupled: true } response_cache { enable: true }") == (
        "Response Cache does not currently support model m with 'decoupled' transaction policy. "
        "Please disable the response cache.")


def as_written(text: str) -> None:
    """The checks of the config as written, before auto-complete (Triton's while polling)."""
    config = parse_config_text("m", text)
    config.name, config.backend = "m", config.backend or "python"
    validate_basics(config)


def test_a_stateful_model_cannot_use_the_response_cache():
    """Triton 2.51 refuses it as it polls the repository (side by side), in these words."""
    with pytest.raises(ConfigRejected) as info:
        as_written(BATCH_IO + "sequence_batching { } response_cache { enable: true }")
    assert info.value.message == (
        "model 'm': Response Cache does not currently support model m with sequence batching scheduler. "
        "Please disable the response cache.")


POLLING_RULES_BROKEN = (
    "max_batch_size: -2", BATCH_IO + "dynamic_batching { preferred_batch_size: [ 16 ] }",
    IO + "sequence_batching { oldest { preferred_batch_size: [ 4 ] } }",   # against max_batch_size 0 as written
    BATCH_IO + 'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
    "int32_false_true: [ 0 ] } ] } ] }",
    IO + "model_transaction_policy { decoupled: true } response_cache { enable: true }")


@pytest.mark.parametrize("text", POLLING_RULES_BROKEN)
def test_the_rules_triton_checks_while_polling_refuse_the_config_as_written(text):
    with pytest.raises(ConfigRejected):
        as_written(text)
    with pytest.raises(ModelLoadError) as info:   # broken only once completed: Triton meets it as a version loads
        check(text)
    assert info.value.stage == "load"


def test_inputs_and_outputs_fail_as_a_version_loads_after_the_polling_rules():
    wrong_dims = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ -2 ] } ] '
    with pytest.raises(InvalidInputsOutputs):
        check("max_batch_size: 8 " + wrong_dims + 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    with pytest.raises(ModelLoadError) as info:   # a polling rule broken too is found first
        check("max_batch_size: 8 " + wrong_dims + "sequence_batching { } response_cache { enable: true }")
    assert "Response Cache" in info.value.message and not isinstance(info.value, InvalidInputsOutputs)


# -- through the loader: the file is named -------------------------------------------------

def test_validation_errors_name_the_config_file(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" input [ { name: "X" dims: [ 1 ] } ]',
                {"1/model.py": PLAIN_PY_MODEL})
    # As Triton checks inputs and outputs: as each version loads, which fails with the reason
    assert version_error(tmp_path, "m") == (
        f"{tmp_path / 'm' / 'config.pbtxt'}: model 'm': input 'X' must specify 'data_type'")


def test_torchscript_without_inputs_and_outputs(tmp_path):
    write_model(tmp_path, "ts", 'platform: "pytorch_libtorch"', {"1/model.pt": b"torchscript"})
    assert load_error(tmp_path, "ts") == (
        f"{tmp_path / 'ts' / 'config.pbtxt'}: TorchScript model 'ts' must list its inputs and outputs "
        "in config.pbtxt: the pytorch backend cannot read them from model.pt")
    write_model(tmp_path, "no_config", None, {"1/model.pt": b"torchscript"})
    assert "TorchScript model 'no_config' must list its inputs and outputs" in load_error(
        tmp_path, "no_config")
    write_model(tmp_path, "inputs_only", 'backend: "pytorch" input [ { name: "INPUT__0" '
                'data_type: TYPE_FP32 dims: [ 1 ] } ]', {"1/model.pt": b"torchscript"})
    assert "must list its inputs and outputs" in load_error(tmp_path, "inputs_only")


def test_torchscript_with_inputs_and_outputs_loads(tmp_path):
    write_model(tmp_path, "ts", 'backend: "pytorch"' + minimal_io(max_batch_size=4), {"1/model.pt": b"x"})
    config = load(tmp_path, "ts").config
    assert (config.platform, config.max_batch_size) == ("pytorch_libtorch", 4)
    assert config.WhichOneof("scheduling_choice") is None  # no auto-complete for TorchScript


def test_onnx_config_errors_after_auto_complete(tmp_path):
    write_model(tmp_path, "m", 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 0 ] } ]',
                {"1/model.onnx": add_sub()})
    assert "model 'm': output 'OUTPUT0' has dimension 0" in version_error(tmp_path, "m")
