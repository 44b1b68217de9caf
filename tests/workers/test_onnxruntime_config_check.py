"""The onnxruntime backend refuses a config that does not match the ONNX file, at load."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from examples import models
from tritium.errors import InvalidArgument
from tritium.workers.backends.onnxruntime import check_against_config

TENSORS = """
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: {dims} }}, {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }}, {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }} ]
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    path = models.add_sub(tmp_path_factory.mktemp("m") / "model.onnx")   # shapes [batch, 16]
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def config(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_a_matching_config_passes(session):
    check_against_config("m", config("max_batch_size: 8" + TENSORS.format(dims="[ 16 ]")), session)
    check_against_config("m", config("max_batch_size: 0" + TENSORS.format(dims="[ -1, 16 ]").replace(
        'dims: [ 16 ]', 'dims: [ -1, 16 ]')), session)


BATCHED = ("model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model "
           "configuration specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 "
           "followed by the explicit tensor shape, making complete shape [-1,{dim}])")


@pytest.mark.parametrize("text, message", [   # Triton's onnxruntime backend's texts
    ("max_batch_size: 0" + TENSORS.format(dims="[ 16 ]"),
     "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
     "specifies 1 dimensions (shape [16])"),
    ("max_batch_size: 8" + TENSORS.format(dims="[ 8 ]"), BATCHED.format(dim=8)),
    # A variable config dim does not match a fixed model dim (the reverse is fine).
    ("max_batch_size: 8" + TENSORS.format(dims="[ -1 ]"), BATCHED.format(dim=-1)),
    ("max_batch_size: 8" + TENSORS.format(dims="[ 16 ]").replace('"INPUT1"', '"INPUT9"'),
     "unexpected inference input 'INPUT9', allowed inputs are: INPUT0, INPUT1"),
    ("max_batch_size: 8" + TENSORS.format(dims="[ 16 ]").replace("TYPE_FP32", "TYPE_INT32", 1),
     "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'INPUT0', model "
     "provides TYPE_FP32"),
])
def test_a_mismatch_fails_the_load_naming_the_tensor(session, text, message):
    with pytest.raises(InvalidArgument) as failure:
        check_against_config("m", config(text), session)
    assert failure.value.message == message
