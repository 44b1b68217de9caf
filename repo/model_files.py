"""Checking a config against the model file it describes, as Triton's backends do at load.

Triton's onnxruntime and pytorch backends compare the config's inputs and outputs with
the model's own signature when an instance loads, and refuse the model with a message
naming the tensor and the problem. tritium does the same before any instance starts:
the ONNX graph is read with the ``onnx`` package (no onnxruntime in the broker), and a
TorchScript ``forward`` is read with torch where torch is loaded anyway (the worker,
``tritium repo check``). The error texts are Triton's.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tritium.model_config_proto import model_config_pb2

from tritium.repo.backends import ONNXRUNTIME, PYTORCH
from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import ModelLoadError
from tritium.repo.model import VersionInfo
from tritium.repo.onnx_autocomplete import OnnxSignature, read_onnx_signature

_SEQUENCE_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY",
                      "CONTROL_SEQUENCE_CORRID")


@dataclass(frozen=True)
class TensorProblem:
    """A config tensor that does not fit the model file; ``tensor`` finds its config line."""

    message: str
    tensor: str | None = None


@dataclass(frozen=True)
class ForwardArgument:
    """One argument of a TorchScript ``forward`` (``self`` left out)."""

    name: str
    kind: str        # torch's TypeKind name: TensorType, ListType, DictType...
    type_text: str


def check_versions(config: ModelConfig, versions: tuple[VersionInfo, ...], config_file: Path | None,
                   read_torchscript: bool = False) -> tuple[VersionInfo, ...]:
    """``versions`` with the error of each whose model file does not fit ``config``.

    TorchScript files are only opened with ``read_torchscript`` (it imports torch); the
    worker checks them when it loads them.
    """
    checked = []
    for info in versions:
        problem = None
        if info.error is None and config.default_model_filename:
            problem = _version_problem(config, info.path / config.default_model_filename, read_torchscript)
        checked.append(info if problem is None else replace(info, error=_located(problem, config_file)))
    return tuple(checked)


def _version_problem(config: ModelConfig, model_file: Path, read_torchscript: bool) -> TensorProblem | None:
    if config.backend == ONNXRUNTIME:
        try:
            return onnx_problem(config, read_onnx_signature(config.name, model_file))
        except ModelLoadError as exc:
            return TensorProblem(exc.message)
    if config.backend == PYTORCH and read_torchscript and model_file.is_file():
        try:
            arguments = read_forward_arguments(model_file)
        except Exception as exc:  # torch raises RuntimeError and more for a file it cannot read
            return TensorProblem(f"unable to load model '{config.name}': cannot read TorchScript "
                                 f"{model_file}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        return torchscript_problem(config, arguments)
    return None


def _located(problem: TensorProblem, config_file: Path | None) -> str:
    line = _config_line(config_file, problem.tensor) if problem.tensor else None
    return f"{config_file}:{line}: {problem.message}" if line else problem.message


def _config_line(config_file: Path | None, tensor: str) -> int | None:
    """The line of ``config_file`` that names ``tensor``, if there is one."""
    if config_file is None:
        return None
    try:
        text = config_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    pattern = re.compile(r"\bname\s*:\s*[\"']" + re.escape(tensor) + r"[\"']")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.search(line):
            return number
    return None


# -- ONNX (Triton's onnxruntime backend, ValidateInputs / ValidateOutputs) -----------------

def onnx_problem(config: ModelConfig, signature: OnnxSignature) -> TensorProblem | None:
    model = config.name
    expected = expected_input_count(config, skip_optional=True)
    if len(signature.inputs) != expected:
        return TensorProblem(f"unable to load model '{model}', configuration expects {expected} "
                             f"inputs, model provides {len(signature.inputs)}")
    inputs = {t.name: t for t in signature.inputs + signature.initializers}
    for tensor in config.input:
        problem = _onnx_input_problem(config, tensor, inputs)
        if problem is not None:
            return TensorProblem(problem, tensor.name)
    outputs = {t.name: t for t in signature.outputs}
    batch_outputs = {name for b in config.batch_output for name in b.target_name}
    for tensor in config.output:
        problem = _onnx_output_problem(config, tensor, outputs, batch_outputs)
        if problem is not None:
            return TensorProblem(problem, tensor.name)
    return None


def _onnx_input_problem(config: ModelConfig, tensor, inputs: dict) -> str | None:
    model, name = config.name, tensor.name
    if tensor.optional and config.max_batch_size != 0:
        return (f"unable to load model '{model}', optional input '{name}' is not supported for "
                "models that support batching")
    info = inputs.get(name)
    if info is None:
        return f"unexpected inference input '{name}', allowed inputs are: {', '.join(sorted(inputs))}"
    problem = _datatype_problem(model, "input", tensor, info.data_type)
    if problem:
        return problem
    dims = _config_dims(tensor)
    if tensor.allow_ragged_batch:
        if tensor.optional:
            return (f"unable to load model '{model}', configuration expects model provides input with "
                    f"shape [-1] for ragged input '{name}', which is not supported for optional input")
        if info.dims != (-1,):
            return (f"unable to load model '{model}', configuration expects model provides input with "
                    f"shape [-1]  for ragged input '{name}', model provides {_shape(info.dims)}")
        return None
    return _dims_problem(config, name, info.dims, dims, compare_exact=False)


def _onnx_output_problem(config: ModelConfig, tensor, outputs: dict, batch_outputs: set) -> str | None:
    model, name = config.name, tensor.name
    info = outputs.get(name)
    if info is None:
        return f"unexpected inference output '{name}', allowed outputs are: {', '.join(sorted(outputs))}"
    problem = _datatype_problem(model, "output", tensor, info.data_type)
    if problem or name in batch_outputs:  # a batch output's shape need not be the model's
        return problem
    return _dims_problem(config, name, info.dims, _config_dims(tensor), compare_exact=True)


def _datatype_problem(model: str, kind: str, tensor, model_type: str) -> str | None:
    config_type = model_config_pb2.DataType.Name(tensor.data_type)
    if config_type == model_type:
        return None
    return (f"unable to load model '{model}', configuration expects datatype {config_type} for "
            f"{kind} '{tensor.name}', model provides {model_type}")


def _config_dims(tensor) -> tuple[int, ...]:
    # A reshape is what the model sees, so it is what must match the model file.
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)


def _dims_problem(config: ModelConfig, name: str, model_shape: tuple[int, ...], dims: tuple[int, ...],
                  compare_exact: bool) -> str | None:
    model = config.name
    if not model_shape:  # a scalar in the model: the config may only say 1s
        if all(d == 1 for d in dims):
            return None
        return (f"unable to load model '{model}', scalar tensor '{name}', should only provide 1 in the "
                "model configuration when the model doesn't support batching. Model configuration "
                f"provided: {_shape(dims)}.")
    if config.max_batch_size > 0:
        if model_shape[0] != -1:
            return (f"model '{model}', tensor '{name}': for the model to support batching the shape "
                    "should have at least 1 dimension and the first dimension must be -1; but shape "
                    f"expected by the model is {_shape(model_shape)}")
        full = (-1,) + dims
        if _dims_match(model_shape, full, compare_exact):
            return None
        return (f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions "
                f"(shape {_shape(model_shape)}) but the model configuration specifies {len(full)} "
                "dimensions (an initial batch dimension because max_batch_size > 0 followed by the "
                f"explicit tensor shape, making complete shape {_shape(full)})")
    if _dims_match(model_shape, dims, compare_exact):
        return None
    return (f"model '{model}', tensor '{name}': the model expects {len(model_shape)} dimensions "
            f"(shape {_shape(model_shape)}) but the model configuration specifies {len(dims)} "
            f"dimensions (shape {_shape(dims)})")


def _dims_match(model_shape: Sequence[int], dims: Sequence[int], compare_exact: bool) -> bool:
    # A variable model dimension takes any config value, unless the match must be exact (outputs).
    return len(model_shape) == len(dims) and all(
        m == d for m, d in zip(model_shape, dims) if compare_exact or m != -1)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def expected_input_count(config: ModelConfig, skip_optional: bool) -> int:
    """How many inputs the model file must take: Triton counts batch, control and state inputs."""
    count = sum(1 for t in config.input if not (skip_optional and t.optional)) + len(config.batch_input)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        kinds = {model_config_pb2.ModelSequenceBatching.Control.Kind.Name(c.kind)
                 for control_input in sequence.control_input for c in control_input.control}
        count += sum(1 for kind in _SEQUENCE_CONTROLS if kind in kinds) + len(sequence.state)
    return count


# -- TorchScript (Triton's pytorch backend, ValidateInputs) --------------------------------

def read_forward_arguments(model_file: Path) -> list[ForwardArgument]:
    """The arguments of ``forward`` in a TorchScript file (imports torch)."""
    import torch

    with warnings.catch_warnings():  # torch.jit is deprecated for torch.export; Triton serves TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(model_file), map_location="cpu")
    return forward_arguments(module)


def forward_arguments(module) -> list[ForwardArgument]:
    arguments = module.forward.schema.arguments
    if arguments and arguments[0].type.kind() == "ClassType":  # self
        arguments = arguments[1:]
    return [ForwardArgument(a.name, a.type.kind(), str(a.type)) for a in arguments]


def torchscript_problem(config: ModelConfig, arguments: Sequence[ForwardArgument]) -> TensorProblem | None:
    for control in config.sequence_batching.control_input:   # bound by the index in their names only
        _, delimiter, index = control.name.partition("__")
        if not delimiter or not all(c.isdigit() for c in index):
            return TensorProblem(f"input '{control.name}' does not follow <name>__<index> naming convention.")
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        return None  # one Dict[str, Tensor]: inputs are bound by name, whatever they are
    if any(a.kind == "DictType" for a in arguments[1:]):
        return TensorProblem("Multiple inputs of kind DictType were detected. Only a single input of "
                             "type Dict(str, Tensor) is supported.")
    for argument in arguments:
        if argument.kind not in ("TensorType", "ListType"):
            return TensorProblem(f"An input of type '{argument.type_text}' was detected in the model. "
                                 "Only a single input of type Dict(str, Tensor) or input(s) of type "
                                 "Tensor are supported.")
    expected = expected_input_count(config, skip_optional=False)
    if arguments and len(arguments) != expected:
        return TensorProblem(f"unable to load model '{config.name}', configuration expects {expected} "
                             f"inputs, model provides {len(arguments)}")
    return None
