"""Auto-complete of ONNX models: inputs, outputs and batching read from the model file.

Follows Triton's onnxruntime backend: nothing happens when the config lists both inputs
and outputs; a model whose every input and output has a variable first dimension can
batch, gets ``max_batch_size`` = the default (4) when it has none, and gets
``dynamic_batching {}`` when it batches beyond 1 and names no scheduler. The file is read
with the ``onnx`` package (protobuf only), so the broker never imports onnxruntime.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from tritium.model_config_proto import model_config_pb2

from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import ModelLoadError

# onnx.TensorProto.DataType -> model config data type name
_ONNX_TO_CONFIG = {
    1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
    6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16",
    11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16",
}


@dataclass(frozen=True, slots=True)
class OnnxTensorInfo:
    name: str
    data_type: str
    dims: tuple[int, ...]   # -1 for a symbolic or unknown dimension


@dataclass(frozen=True, slots=True)
class OnnxSignature:
    inputs: tuple[OnnxTensorInfo, ...]         # graph inputs a request must feed
    initializers: tuple[OnnxTensorInfo, ...]   # graph inputs with a default (overridable initializers)
    outputs: tuple[OnnxTensorInfo, ...]


def read_onnx_io(model: str, path: Path) -> tuple[list[OnnxTensorInfo], list[OnnxTensorInfo]]:
    """Graph inputs (without initializers) and outputs of an ONNX file or folder."""
    signature = read_onnx_signature(model, path)
    return list(signature.inputs), list(signature.outputs)


def read_onnx_signature(model: str, path: Path) -> OnnxSignature:
    """The inputs and outputs of an ONNX file or folder (a large model is a folder of model.onnx)."""
    if path.is_dir():
        path = path / "model.onnx"
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(model, f"cannot read ONNX model: {exc.strerror or exc}", path) from exc
    # Auto-complete and the load check both read the file; parsing a large one twice is slow.
    return _read_signature(model, path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_signature(model: str, path: Path, mtime_ns: int, size: int) -> OnnxSignature:
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelLoadError(model, f"cannot read ONNX model: {exc}", path) from exc
    graph = proto.graph
    defaults = {init.name for init in graph.initializer}
    return OnnxSignature(
        inputs=tuple(_tensor_info(model, path, v) for v in graph.input if v.name not in defaults),
        initializers=tuple(_tensor_info(model, path, v) for v in graph.input if v.name in defaults),
        outputs=tuple(_tensor_info(model, path, v) for v in graph.output))


def _tensor_info(model: str, path: Path, value) -> OnnxTensorInfo:
    tensor_type = value.type.tensor_type
    data_type = _ONNX_TO_CONFIG.get(tensor_type.elem_type)
    if data_type is None:
        raise ModelLoadError(
            model, f"ONNX tensor '{value.name}' has element type {tensor_type.elem_type}, "
            "which has no Triton datatype", path)
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
    return OnnxTensorInfo(value.name, data_type, dims)


def auto_complete_onnx(model: str, config: ModelConfig, model_file: Path,
                       default_max_batch_size: int) -> None:
    """Complete ``config`` in place from the model file."""
    # Triton counts batch_input entries as inputs: a config with batch inputs and
    # outputs is complete, and its (regular) inputs are not filled from the model.
    input_count = len(config.input) + len(config.batch_input)
    if input_count > 0 and len(config.output) > 0:
        return
    inputs, outputs = read_onnx_io(model, model_file)
    can_batch = all(len(t.dims) > 0 and t.dims[0] == -1 for t in inputs + outputs)
    if can_batch:
        if config.max_batch_size == 0:
            config.max_batch_size = max(default_max_batch_size, 0)
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ModelLoadError(
            model, f"autofill failed for model '{model}': model does not support batching "
            "while non-zero max_batch_size is specified")
    if input_count == 0:
        _fill(config.input, inputs, config.max_batch_size)
    if len(config.output) == 0:
        _fill(config.output, outputs, config.max_batch_size)


def _fill(target, infos: list[OnnxTensorInfo], max_batch_size: int) -> None:
    for info in infos:
        tensor = target.add()
        tensor.name = info.name
        tensor.data_type = model_config_pb2.DataType.Value(info.data_type)
        dims = info.dims[1:] if max_batch_size > 0 else info.dims
        if dims:
            tensor.dims.extend(dims)
        else:
            tensor.dims.append(1)
            if max_batch_size > 0:  # a scalar per batch item; Triton reshapes to []
                tensor.reshape.SetInParent()
