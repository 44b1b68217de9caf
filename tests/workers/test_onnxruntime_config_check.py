"""The onnxruntime backend refuses a config that does not match the ONNX file, at load."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from examples import models
from workers.backends.onnxruntime import check_against_config

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
    check_against_config("m", config("max_batch_size: 8" + TENSORS.format(dims="[ -1 ]")), session)
    check_against_config("m", config("max_batch_size: 0" + TENSORS.format(dims="[ -1, 16 ]").replace(
        'dims: [ 16 ]', 'dims: [ -1, 16 ]')), session)


@pytest.mark.parametrize("text, message", [
    ("max_batch_size: 0" + TENSORS.format(dims="[ 16 ]"),
     "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1, 16]) but the model configuration "
     "specifies 1 dimensions (shape [16])"),
    ("max_batch_size: 8" + TENSORS.format(dims="[ 8 ]"),
     "tensor 'INPUT0': the model expects 2 dimensions (shape [-1, 16]) but the model configuration specifies "
     "2 dimensions (shape [-1, 8], the first for the batch since max_batch_size > 0)"),
    ("max_batch_size: 8" + TENSORS.format(dims="[ 16 ]").replace('"INPUT1"', '"INPUT9"'),
     "model 'm': input 'INPUT9' of the model configuration is not in the model, whose inputs are "
     "['INPUT0', 'INPUT1']"),
])
def test_a_mismatch_fails_the_load_naming_the_tensor(session, text, message):
    with pytest.raises(ValueError) as failure:
        check_against_config("m", config(text), session)
    assert message in str(failure.value)
