"""Custom backends found where Triton looks for backends, and in the tritium.backends entry points."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.rawhttp import request
from tests.models import write_config
from tests.servers import TritiumServer

BACKEND = '''
import numpy as np

from tritium.workers.backends.base import Backend, Instance, Model

WHERE = "{where}"


class Echo(Instance):
    def __init__(self, factor):
        self.factor = factor

    def execute_batch(self, inputs, output_names):
        x = inputs["X"]
        outputs = {{"Y": x * self.factor,
                    "WHERE": np.array([[WHERE.encode()]] * x.shape[0], dtype=np.object_)}}
        return {{name: outputs[name] for name in output_names}}


class EchoModel(Model):
    def __init__(self, factor):
        self.factor = factor

    def create_instance(self, context):
        return Echo(self.factor)


class TritiumBackend(Backend):
    def create_model(self, context):
        return EchoModel(float(self.config.options.get("factor", "1")))
'''

CONFIG = """backend: "{backend}"
max_batch_size: 4
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }}, {{ name: "WHERE", data_type: TYPE_STRING, dims: [ 1 ] }} ]
"""


# A Python-based backend, as Triton has them: a model.py in <backend-directory>/<backend>/ serving
# every model that names it; its auto_complete_config gives the models their inputs and outputs,
# and each model's operation comes from a file in its version folder (pb_utils.get_model_dir()).
PYTHON_BASED = '''
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in ("A", "B"):
            config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "operation.json")) as file:
            self.operation = json.load(file)["operation"]

    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in ("A", "B"))
            out = a + b if self.operation == "add" else a - b
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''


def model(repo, name, backend):
    write_config(repo / name, CONFIG.format(backend=backend))
    (repo / name / "1").mkdir(exist_ok=True)
    return repo / name


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("custom")
    repo, backends, site = root / "repo", root / "backends", root / "site"
    (model(repo, "in_version", "v_echo") / "1" / "tritium_v_echo.py").write_text(BACKEND.format(where="version folder"))
    (model(repo, "in_model", "m_echo") / "tritium_m_echo.py").write_text(BACKEND.format(where="model folder"))
    model(repo, "in_backend_directory", "b_echo")
    package = backends / "b_echo" / "tritium_b_echo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BACKEND.format(where="backend directory"))
    model(repo, "from_entry_point", "ep_echo")
    site.mkdir()
    (site / "ep_echo_backend.py").write_text(BACKEND.format(where="entry point"))
    dist = site / "ep_echo_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-echo-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tritium.backends]\nep_echo = ep_echo_backend:TritiumBackend\n")
    model(repo, "nowhere", "missing")
    (backends / "add_sub").mkdir(parents=True)
    (backends / "add_sub" / "model.py").write_text(PYTHON_BASED)
    for operation in ("add", "sub"):
        write_config(repo / operation, 'backend: "add_sub"')
        (repo / operation / "1").mkdir()
        (repo / operation / "1" / "operation.json").write_text(f'{{"operation": "{operation}"}}')
    import os

    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    with TritiumServer(repo, "--exit-on-error=false", "--backend-directory", str(backends),
                       "--backend-config", "b_echo,factor=3", env=env) as running:
        running.backends = backends
        yield running


@pytest.mark.parametrize("model_name, where, factor", [
    ("in_version", "version folder", 1), ("in_model", "model folder", 1),
    ("in_backend_directory", "backend directory", 3), ("from_entry_point", "entry point", 1),
])
def test_a_custom_backend_is_found_in_each_place(server, model_name, where, factor):
    client = httpclient.InferenceServerClient(server.url)
    x = np.array([[1.0, -2.0]], dtype=np.float32)
    tensor = httpclient.InferInput("X", [1, 2], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model_name, [tensor])
    assert result.as_numpy("WHERE")[0, 0] == where.encode()
    np.testing.assert_array_equal(result.as_numpy("Y"), x * factor)


def test_a_python_based_backend_completes_and_serves_the_models_that_name_it(server):
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("add")
    assert [i["name"] for i in config["input"]] == ["A", "B"] and config["output"][0]["name"] == "OUT"
    a, b = np.array([3.0, 4.0], dtype=np.float32), np.array([1.0, 2.5], dtype=np.float32)
    tensors = [httpclient.InferInput(name, [2], "FP32") for name in ("A", "B")]
    for tensor, array in zip(tensors, (a, b)):
        tensor.set_data_from_numpy(array)
    np.testing.assert_array_equal(client.infer("add", tensors).as_numpy("OUT"), a + b)
    np.testing.assert_array_equal(client.infer("sub", tensors).as_numpy("OUT"), a - b)


def test_a_backend_found_nowhere_fails_the_load_saying_where_it_looked(server):
    assert request(server.url, "GET", "/v2/models/nowhere/ready")[0] == 400
    logs = server.logs()
    assert "backend 'missing' not found: looked for tritium_missing.py or a package tritium_missing/ in " in logs
    assert (f"{server.backends / 'missing'}, then for a Python-based backend {server.backends / 'missing' / 'model.py'}, "
            "then for entry point 'missing' in group 'tritium.backends'") in logs
    assert request(server.url, "GET", "/v2/models/in_model/ready")[0] == 200


def test_the_example_custom_backend_serves(tmp_path):
    from tests.servers import PROJECT_ROOT

    with TritiumServer(PROJECT_ROOT / "examples" / "custom_backend" / "model_repository") as example:
        client = httpclient.InferenceServerClient(example.url)
        x = np.array([[1, 2, 3, 4]], dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("scaled", [tensor]).as_numpy("OUTPUT0"), x * 2.5)
