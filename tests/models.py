"""Model repositories for the tests, written into temporary folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

from examples import models

# A Python model answering its input IN as its output OUT.
PYTHON_IDENTITY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
"""


def add_sub_inputs(a: np.ndarray, b: np.ndarray, module=grpcclient) -> list:
    """add_sub's INPUT0 and INPUT1 as ``module``'s (tritonclient.grpc, .http or .grpc.aio) InferInputs."""
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def write_config(model_dir: Path, text: str) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)


def python_model(repo: Path, name: str, source: str, config: str) -> Path:
    """A Python-backend model ``name`` in ``repo``: version 1's model.py and the config."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    write_config(repo / name, config)
    return repo / name


def add_sub_model(repo: Path, name: str = "add_sub", max_batch_size: int = 8, extra: str = "",
                  instances: int = 1) -> Path:
    model_dir = repo / name
    models.add_sub(model_dir / "1" / "model.onnx")
    write_config(model_dir, f"""
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }},
        {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }},
         {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]
{extra}
""")
    return model_dir


def slow_model(path: Path, iterations: int = 1_000_000, size: int = 64) -> Path:
    """OUTPUT0 = INPUT0 after ``iterations`` rounds of tanh(x @ W): a model that takes its time.

    A Loop keeps the file tiny; a million rounds take about 3 s on a 2-core CI machine.
    """
    weight = (np.random.default_rng(0).standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_in", "W"], ["m"]),
         helper.make_node("Tanh", ["m"], ["x_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["N", "C", "INPUT0"], ["OUTPUT0"], body=body)], "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", size])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", size])],
        [numpy_helper.from_array(np.array(iterations, np.int64), "N"),
         numpy_helper.from_array(np.array(True), "C"), numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# Every datatype ONNX and tritium share, with the numpy dtype tests send.
ALL_TYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}
_ONNX_TYPE = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
_CONFIG_TYPE = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in ALL_TYPES}


def all_types_model(repo: Path, name: str = "all_types", max_batch_size: int = 8) -> Path:
    """IN_<T> -> OUT_<T> identities, one pair per datatype, in one model (one process)."""
    model_dir = repo / name
    inputs, outputs, nodes = [], [], []
    for dtype in ALL_TYPES:
        inputs.append(helper.make_tensor_value_info(f"IN_{dtype}", _ONNX_TYPE[dtype], ["batch", "n"]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{dtype}", _ONNX_TYPE[dtype], ["batch", "n"]))
        nodes.append(helper.make_node("Identity", [f"IN_{dtype}"], [f"OUT_{dtype}"]))
    model = helper.make_model(helper.make_graph(nodes, "all_types", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    def tensors(kind: str) -> str:
        return ",\n".join(f'{{ name: "{kind}_{d}", data_type: {_CONFIG_TYPE[d]}, dims: [ -1 ] }}' for d in ALL_TYPES)

    write_config(model_dir, f"""
max_batch_size: {max_batch_size}
input [ {tensors("IN")} ]
output [ {tensors("OUT")} ]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
""")
    return model_dir


# Multiplies X by its config's "scale" parameter, so a test can tell which load answered.
SCALED_MODEL = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.scale = float(config["parameters"]["scale"]["string_value"])
        if self.scale == 0:
            raise ValueError("scale must not be 0")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * self.scale)]))
        return responses
'''


SLOW_MODEL = SCALED_MODEL.replace("import json", "import json\nimport time").replace(
    "        responses = []", "        time.sleep(1.0)\n        responses = []")


def scaled_config(scale: float, name: str = "scaled") -> str:
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "scale" value {{ string_value: "{scale}" }} }}
'''


def scaled_config_json(scale: float, name: str = "scaled") -> str:
    return json.dumps({
        "name": name, "backend": "python", "max_batch_size": 8,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}],
        "parameters": {"scale": {"string_value": str(scale)}},
    })
