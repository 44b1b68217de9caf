"""A config checked against its model file at load, with the texts of Triton's backends."""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch

from tests.repo.helpers import FLOAT, INT64, add_sub, load, onnx_io, write_model

ONNX = 'platform: "onnxruntime_onnx"\n'


def version_errors(root, name, **options) -> dict[int, str | None]:
    return {v.version: v.error for v in load(root, name, **options).versions}


def onnx_model(root, config: str, inputs, outputs, name="m"):
    write_model(root, name, ONNX + config, {"1/model.onnx": onnx_io(inputs, outputs)})
    return version_errors(root, name)[1]


def test_a_model_that_fits_its_config_loads(tmp_path):
    write_model(tmp_path, "add_sub", ONNX + """
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.onnx": add_sub()})
    assert version_errors(tmp_path, "add_sub") == {1: None}


def test_input_datatype_other_than_the_files(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "input" data_type: TYPE_FP16 dims: [ 4 ] } ]
        output [ { name: "output" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("input", FLOAT, [4])], [("output", FLOAT, [4])])
    assert error == (f"{tmp_path / 'm' / 'config.pbtxt'}:3: unable to load model 'm', configuration "
                     "expects datatype TYPE_FP16 for input 'input', model provides TYPE_FP32")


def test_output_datatype_other_than_the_files(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_INT64 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("x", INT64, [4])], [("y", INT64, [4])])
    assert error.endswith("unable to load model 'm', configuration expects datatype TYPE_FP32 for "
                          "output 'y', model provides TYPE_INT64")
    assert error.startswith(f"{tmp_path / 'm' / 'config.pbtxt'}:4: ")


def test_an_input_name_the_file_does_not_have(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "image" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("pixels", FLOAT, [4])], [("y", FLOAT, [4])])
    assert error.endswith("unexpected inference input 'image', allowed inputs are: pixels")


def test_an_output_name_the_file_does_not_have(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "probs" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("x", FLOAT, [4])], [("b", FLOAT, [4]), ("a", FLOAT, [4])])
    assert error.endswith("unexpected inference output 'probs', allowed outputs are: a, b")


def test_more_config_inputs_than_the_file_takes(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("x", FLOAT, [4])], [("y", FLOAT, [4])])
    assert error == "unable to load model 'm', configuration expects 2 inputs, model provides 1"


def test_dims_in_another_order(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 224, 3 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 224 ] } ]
    """, [("x", FLOAT, [3, 224])], [("y", FLOAT, [3, 224])])
    assert error.endswith("model 'm', tensor 'x': the model expects 2 dimensions (shape [3,224]) but "
                          "the model configuration specifies 2 dimensions (shape [224,3])")


def test_batching_needs_a_variable_first_dimension(tmp_path):
    error = onnx_model(tmp_path, """
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("x", FLOAT, [8, 4])], [("y", FLOAT, [8, 4])])
    assert error.endswith("model 'm', tensor 'x': for the model to support batching the shape should "
                          "have at least 1 dimension and the first dimension must be -1; but shape "
                          "expected by the model is [8,4]")


def test_batch_dimension_is_counted(tmp_path):
    error = onnx_model(tmp_path, """
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, [("x", FLOAT, [-1, 4])], [("y", FLOAT, [-1, 4])])
    assert error.endswith(
        "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,4]) but the model "
        "configuration specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 "
        "followed by the explicit tensor shape, making complete shape [-1,2,4])")


def test_a_variable_model_dimension_takes_any_input_size_but_outputs_match_exactly(tmp_path):
    io = ([("x", FLOAT, [-1, 4])], [("y", FLOAT, [-1, 4])])
    assert onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 7, 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
    """, *io, name="ok") is None
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 7, 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 7, 4 ] } ]
    """, *io, name="exact")
    assert error.endswith("model 'exact', tensor 'y': the model expects 2 dimensions (shape [-1,4]) but "
                          "the model configuration specifies 2 dimensions (shape [7,4])")


def test_a_reshape_is_what_must_match_the_file(tmp_path):
    assert onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] reshape: { shape: [ 2, 4 ] } } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]
    """, [("x", FLOAT, [2, 4])], [("y", FLOAT, [2, 4])]) is None


def test_each_version_is_checked_against_its_own_file(tmp_path):
    write_model(tmp_path, "m", ONNX + """
        version_policy { all { } }
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, {"1/model.onnx": onnx_io([("x", FLOAT, [4])], [("y", FLOAT, [4])]),
          "2/model.onnx": onnx_io([("x", INT64, [4])], [("y", INT64, [4])])})
    errors = version_errors(tmp_path, "m")
    assert errors[1] is None
    assert "configuration expects datatype TYPE_FP32 for input 'x', model provides TYPE_INT64" in errors[2]
    assert load(tmp_path, "m").loadable_versions == (1,)


def test_an_unreadable_onnx_file_fails_its_version(tmp_path):
    write_model(tmp_path, "m", ONNX + """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """, {"1/model.onnx": b"not a model"})
    assert "cannot read ONNX model" in version_errors(tmp_path, "m")[1]


# -- TorchScript ---------------------------------------------------------------------------

class TwoInputs(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> torch.Tensor:
        return INPUT0 + INPUT1


class DictInputs(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        return [inputs["A"]]


class IntArgument(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n


def torchscript_model(root, name: str, module: torch.nn.Module, inputs: list[str]) -> None:
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in inputs)
    write_model(root, name, f"""platform: "pytorch_libtorch"
        input [ {tensors} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    """, {"1/model.pt": lambda path: torch.jit.script(module).save(str(path))})


def test_torchscript_with_fewer_inputs_than_the_config(tmp_path):
    torchscript_model(tmp_path, "ts", TwoInputs(), ["INPUT__0", "INPUT__1", "INPUT__2"])
    assert version_errors(tmp_path, "ts", read_torchscript=True)[1] == (
        "unable to load model 'ts', configuration expects 3 inputs, model provides 2")
    # The broker leaves TorchScript files to the worker, which has torch loaded anyway.
    assert version_errors(tmp_path, "ts") == {1: None}


@pytest.mark.parametrize("control, error", [
    ("START__1", None), ("START", "input 'START' does not follow <name>__<index> naming convention."),
    ("START__x", "input 'START__x' does not follow <name>__<index> naming convention.")])
def test_torchscript_sequence_controls_are_named_by_index_as_triton_requires(tmp_path, control, error):
    write_model(tmp_path, "ts", f"""platform: "pytorch_libtorch"
        max_batch_size: 1
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        sequence_batching {{ control_input [ {{ name: "{control}"
            control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ] }}
    """, {"1/model.pt": lambda path: torch.jit.script(TwoInputs()).save(str(path))})
    assert version_errors(tmp_path, "ts", read_torchscript=True)[1] == error


@pytest.mark.parametrize("module, inputs", [
    (TwoInputs(), ["INPUT0", "INPUT1"]), (TwoInputs(), ["INPUT__1", "INPUT__0"]),
    (DictInputs(), ["A", "B", "C"])])
def test_torchscript_that_fits(tmp_path, module, inputs):
    torchscript_model(tmp_path, "ts", module, inputs)
    assert version_errors(tmp_path, "ts", read_torchscript=True) == {1: None}


def test_torchscript_argument_that_is_not_a_tensor(tmp_path):
    torchscript_model(tmp_path, "ts", IntArgument(), ["x", "n"])
    assert version_errors(tmp_path, "ts", read_torchscript=True)[1] == (
        "An input of type 'int' was detected in the model. Only a single input of type "
        "Dict(str, Tensor) or input(s) of type Tensor are supported.")


def test_torchscript_file_torch_cannot_read(tmp_path):
    write_model(tmp_path, "ts", 'platform: "pytorch_libtorch"\n'
                'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]', {"1/model.pt": b"x"})
    assert "cannot read TorchScript" in version_errors(tmp_path, "ts", read_torchscript=True)[1]


def test_scalar_model_tensor_takes_only_ones(tmp_path):
    error = onnx_model(tmp_path, """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """, [("x", FLOAT, [])], [("y", FLOAT, [])])
    assert error.endswith("unable to load model 'm', scalar tensor 'x', should only provide 1 in the "
                          "model configuration when the model doesn't support batching. Model "
                          "configuration provided: [2].")
