"""Poll mode as Triton's (checked side by side with Triton 2.51, poll interval 1 s): a file
replaced in place reloads its model, a broken config or model.py keeps the old load serving,
a removed model leaves the index, and an ensemble follows its composing model away and back."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from examples.models import add_sub
from tests.e2e.rawhttp import error_of, request
from tests.servers import TritiumServer

MODEL = '''
import triton_python_backend_utils as pb_utils

FACTOR = {factor}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * FACTOR)]))
        return responses
'''

CONFIG = '''
name: "{name}"
backend: "python"
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "{output}", data_type: TYPE_FP32, dims: [ 2 ] }} ]
'''

ENSEMBLE = '''
name: "ens"
platform: "ensemble"
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "comp" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
'''


def replace_file(path: Path, text: str) -> None:
    """Write beside and rename over: an editor's save, atomic for whoever reads it."""
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(text)
    os.replace(staging, path)


def write_model(root: Path, name: str, factor: float) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MODEL.format(factor=factor))
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, output="Y"))


@pytest.fixture(scope="module")
def polled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("polled")
    for name, factor in (("edited", 2), ("versions", 4), ("comp", 10)):
        write_model(repo, name, factor)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    with TritiumServer(repo, "--model-control-mode=poll", "--repository-poll-secs=1") as running:
        yield running, repo


def infer(server, model: str, version: str | None = None) -> tuple[int, object]:
    """(200, Y as a list) or (status, the error text)."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [1.0, 1.0]}]}
    status, _, data = request(server.url, "POST", path, body=body)
    return (status, json.loads(data)["outputs"][0]["data"]) if status == 200 else (status, error_of(data))


def index(server) -> dict:
    status, _, data = request(server.url, "POST", "/v2/repository/index", {})
    assert status == 200, data
    return {(e["name"], e.get("version")): e for e in json.loads(data)}


def eventually(condition, timeout_s: float = 30.0):
    """Poll ``condition`` until it holds (returns its value) or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result or time.monotonic() > deadline:
            assert result, "condition not met in time"
            return result
        time.sleep(0.1)


def logged(server, text: str) -> bool:
    return text in server.logs()


def test_a_file_replaced_in_place_reloads_its_model(polled):
    server, repo = polled
    assert infer(server, "edited") == (200, [2.0, 2.0])
    replace_file(repo / "edited" / "1" / "model.py", MODEL.format(factor=5))   # same size, new mtime
    eventually(lambda: infer(server, "edited") == (200, [5.0, 5.0]))
    # Written in place, not renamed: noticed as well.
    (repo / "edited" / "1" / "model.py").write_text(MODEL.format(factor=7))
    eventually(lambda: infer(server, "edited") == (200, [7.0, 7.0]))


def test_a_broken_config_or_model_keeps_the_old_load_serving(polled):
    server, repo = polled
    assert infer(server, "edited") == (200, [7.0, 7.0])
    replace_file(repo / "edited" / "config.pbtxt", "max_batch_size: [\n")
    eventually(lambda: "reload failed" in index(server)[("edited", "1")].get("reason", ""))
    assert infer(server, "edited") == (200, [7.0, 7.0])
    assert index(server)[("edited", "1")]["state"] == "READY"
    assert request(server.url, "GET", "/v2/models/edited/ready")[0] == 200

    replace_file(repo / "edited" / "config.pbtxt", CONFIG.format(name="edited", output="Y"))
    eventually(lambda: "reason" not in index(server)[("edited", "1")])   # polling went on
    replace_file(repo / "edited" / "1" / "model.py", "this is not python (")
    eventually(lambda: "SyntaxError" in index(server)[("edited", "1")].get("reason", ""))
    assert infer(server, "edited") == (200, [7.0, 7.0])
    replace_file(repo / "edited" / "1" / "model.py", MODEL.format(factor=6))
    eventually(lambda: infer(server, "edited") == (200, [6.0, 6.0]))


def test_a_version_the_policy_drops_is_remembered(polled):
    server, repo = polled
    staging = repo.parent / ".versions-2"
    staging.mkdir()
    (staging / "model.py").write_text(MODEL.format(factor=8))
    staging.rename(repo / "versions" / "2")
    eventually(lambda: infer(server, "versions") == (200, [8.0, 8.0]))
    eventually(lambda: index(server)[("versions", "1")]["state"] == "UNAVAILABLE")
    status, message = infer(server, "versions", "1")
    # Known, not ready: Triton 2.51 remembers the version.
    assert (status, message) == (503, "Request for unknown model: 'versions' version 1 is not at ready state")
    assert infer(server, "versions", "9")[0] == 404


def test_a_removed_model_leaves_the_index(polled):
    server, repo = polled
    assert infer(server, "versions") == (200, [8.0, 8.0])
    (repo / "versions").rename(repo.parent / ".removed")
    assert not any(name == "versions" for name, _ in index(server))   # the index lists the folders there, as Triton's
    eventually(lambda: infer(server, "versions") == (404, "Request for unknown model: 'versions' has no available "
                                                          "versions"))   # unloaded at the next poll
    # The same folder moved back (same files, same times) loads again.
    (repo.parent / ".removed").rename(repo / "versions")
    eventually(lambda: infer(server, "versions") == (200, [8.0, 8.0]))
    assert index(server)[("versions", "2")]["state"] == "READY"


def test_an_ensemble_follows_its_composing_model_away_and_back(polled):
    server, repo = polled
    assert infer(server, "ens") == (200, [10.0, 10.0])
    (repo / "comp").rename(repo.parent / ".comp")
    eventually(lambda: index(server).get(("ens", "1"), {}).get("reason") == "unloaded")
    assert index(server)[("ens", "1")]["state"] == "UNAVAILABLE"
    assert ("comp", "1") not in index(server)
    assert infer(server, "ens")[0] == 404
    (repo.parent / ".comp").rename(repo / "comp")
    eventually(lambda: infer(server, "ens") == (200, [10.0, 10.0]))
    assert index(server)[("ens", "1")]["state"] == "READY"


def test_an_ensemble_changed_while_its_model_is_away_loads_when_the_model_is_back(polled):
    server, repo = polled
    (repo / "comp").rename(repo.parent / ".comp")
    eventually(lambda: index(server).get(("ens", "1"), {}).get("reason") == "unloaded")
    said = "ensemble ens stays unloaded until its models fit it"
    before = server.logs().count(said)
    replace_file(repo / "ens" / "config.pbtxt", ENSEMBLE)               # read again: it cannot load
    eventually(lambda: server.logs().count(said) > before)
    assert index(server)[("ens", "1")] == {"name": "ens", "version": "1", "state": "UNAVAILABLE",
                                           "reason": "unloaded"}   # as Triton's index says
    (repo.parent / ".comp").rename(repo / "comp")
    eventually(lambda: infer(server, "ens") == (200, [10.0, 10.0]))


def test_an_ensemble_that_no_longer_fits_its_model_is_unloaded_until_it_does(polled):
    server, repo = polled
    assert infer(server, "ens") == (200, [10.0, 10.0])
    replace_file(repo / "comp" / "config.pbtxt", CONFIG.format(name="comp", output="Z"))
    eventually(lambda: index(server)[("ens", "1")].get("reason") == "unloaded")
    assert logged(server, "unloading ensemble ens, which no longer fits model comp")
    replace_file(repo / "comp" / "config.pbtxt", CONFIG.format(name="comp", output="Y"))
    eventually(lambda: infer(server, "ens") == (200, [10.0, 10.0]))


ONNX_ADD_SUB = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: {dtype}, dims: [ 16 ] }}, {{ name: "INPUT1", data_type: {dtype}, dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0", data_type: {dtype}, dims: [ 16 ] }}, {{ name: "OUTPUT1", data_type: {dtype}, dims: [ 16 ] }} ]
"""


def test_a_config_that_does_not_fit_its_onnx_file_is_refused_at_load(polled):
    server, repo = polled
    staging = repo.parent / ".onnx"
    add_sub(staging / "1" / "model.onnx")
    (staging / "config.pbtxt").write_text(ONNX_ADD_SUB.format(dtype="TYPE_FP16"))
    staging.rename(repo / "onnx")
    entry = eventually(lambda: index(server).get(("onnx", "1")))
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].endswith("unable to load model 'onnx', configuration expects datatype TYPE_FP16 "
                                    "for input 'INPUT0', model provides TYPE_FP32")
    assert infer(server, "onnx")[0] == 404
    replace_file(repo / "onnx" / "config.pbtxt", ONNX_ADD_SUB.format(dtype="TYPE_FP32"))
    eventually(lambda: index(server)[("onnx", "1")]["state"] == "READY")
