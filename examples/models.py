"""Small ONNX models built with the ``onnx`` helper API, for the example repository, tests and benchmarks.

No weights are downloaded anywhere in tritium: every model it serves in examples,
tests and benchmarks is built here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int16): TensorProto.INT16, np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64, np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.uint32): TensorProto.UINT32,
    np.dtype(np.uint64): TensorProto.UINT64, np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(object): TensorProto.STRING,
}


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _model(graph) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime tritium supports
    return model


def add_sub(path: Path, dims=(-1, 16), dtype=np.float32) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (Triton's add_sub example)."""
    elem = _NP_TO_ONNX[np.dtype(dtype)]
    shape = ["batch" if d == -1 else d for d in dims]
    inputs = [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return _save(_model(helper.make_graph(nodes, "add_sub", inputs, outputs)), path)


def identity(path: Path, dims=(-1, -1), dtype=np.float32, name: str = "identity") -> Path:
    """OUTPUT0 = INPUT0, for any datatype ONNX has (BYTES included)."""
    elem = _NP_TO_ONNX[np.dtype(dtype)]
    shape = [f"d{i}" if d == -1 else d for i, d in enumerate(dims)]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name,
        [helper.make_tensor_value_info("INPUT0", elem, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem, shape)])
    return _save(_model(graph), path)


def mlp(path: Path, sizes=(1024, 4096, 4096, 1024), seed: int = 0) -> Path:
    """A ReLU MLP with a dynamic batch dimension: INPUT0 [-1, sizes[0]] -> OUTPUT0 [-1, sizes[-1]]."""
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "INPUT0"
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        weight = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        bias = np.zeros(fan_out, dtype=np.float32)
        initializers += [numpy_helper.from_array(weight, f"W{layer}"),
                         numpy_helper.from_array(bias, f"B{layer}")]
        last = layer == len(sizes) - 2
        gemm_out = "OUTPUT0" if last else f"H{layer}"
        nodes.append(helper.make_node("Gemm", [current, f"W{layer}", f"B{layer}"], [gemm_out]))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"R{layer}"]))
            current = f"R{layer}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializers)
    return _save(_model(graph), path)
