"""A Python model loading, unloading and asking after other models (``pb_utils.load_model``,
``unload_model``, ``is_model_ready``), with Triton's answers and error texts (asked of Triton 2.51)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.servers import TritiumServer

REPO = Path(__file__).parent / "python_repo"
MADE_HERE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() * 3)]) for r in requests]
'''
MADE_HERE_CONFIG = json.dumps({"backend": "python", "max_batch_size": 0,
                               "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
                               "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("py_model_control", "py_add_sub"):
        shutil.copytree(REPO / name, repo / name)
    with TritiumServer(repo, "--model-control-mode", "explicit", "--load-model", "py_model_control") as running:
        yield running


def call(server, op: str, **args) -> str:
    """What the model's call of ``pb_utils.<op>(**args)`` gave: ``ok <result>`` or the exception."""
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("CALL", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps({"op": op, "args": args}).encode()], dtype=object))
    return client.infer("py_model_control", [tensor]).as_numpy("RESULT")[0].decode()


def refused(what: str, message: str) -> str:
    return f"TritonModelException: {what}: Failed to process the request for model 'py_model_control_0', message: {message}"


def test_a_model_loads_another_which_then_serves_and_is_ready(server):
    assert call(server, "ready", model_name="py_add_sub") == "ok False"
    assert call(server, "load", model_name="py_add_sub") == "ok None"   # answered once loaded
    assert call(server, "ready", model_name="py_add_sub") == "ok True"
    assert call(server, "ready", model_name="py_add_sub", model_version="1") == "ok True"
    assert call(server, "ready", model_name="py_add_sub", model_version="2") == "ok False"
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("py_add_sub")
    inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    assert client.infer("py_add_sub", inputs).as_numpy("OUTPUT0").tolist() == [[2.0] * 16]


def test_a_model_loads_one_made_of_its_own_config_and_files(server):
    assert call(server, "load", model_name="made_here", config=MADE_HERE_CONFIG,
                files={"file:1/model.py": MADE_HERE}) == "ok None"
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2], np.float32))
    assert client.infer("made_here", [tensor]).as_numpy("OUT").tolist() == [3.0, 6.0]


def test_a_model_unloads_another(server):
    assert call(server, "load", model_name="py_add_sub") == "ok None"
    assert call(server, "unload", model_name="py_add_sub") == "ok None"   # answered once begun, as in Triton
    deadline = time.monotonic() + 10
    while call(server, "ready", model_name="py_add_sub") != "ok False" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert call(server, "ready", model_name="py_add_sub") == "ok False"
    assert not httpclient.InferenceServerClient(server.url).is_model_ready("py_add_sub")
    assert call(server, "unload", model_name="nope") == "ok None"   # as Triton: nothing to unload is no error


@pytest.mark.parametrize("op, args, answer", [
    ("load", {"model_name": "nope"}, refused("Failed to load model", "failed to load 'nope', failed to poll from "
                                                                     "model repository")),
    ("ready", {"model_name": "nope"}, "ok False"),
    ("ready", {"model_name": "py_add_sub", "model_version": "x"}, refused(
        "Failed to check model readiness", "failed to get model version from specified version string 'x' "
        "(details: stol), version should be an integral value > 0")),
    ("ready", {"model_name": "py_add_sub", "model_version": "-1"}, refused(
        "Failed to check model readiness", "failed to get model version from specified version string '-1', "
        "version should be an integral value > 0")),
    ("load", {"model_name": "py_add_sub", "files": ["file:1/model.py"]},
     "TritonModelException: failed to load model 'py_add_sub', files should be a dictionary of file paths and "
     "file contents"),
    ("load", {"model_name": "py_add_sub", "files": {"model.py": "x"}}, refused(
        "Failed to load model", "unrecognized load parameter 'model.py'.")),
    ("load", {"model_name": None}, "TypeError: load_model(): incompatible function arguments. The following "
                                   "argument types are supported:\n    1. (model_name: str, config: str = '', "
                                   "files: object = None) -> None"),
])
def test_what_triton_refuses_is_refused_with_its_words(server, op, args, answer):
    assert call(server, op, **args).split("\n\nInvoked with:")[0] == answer   # (pybind's rendering of the arguments aside)
