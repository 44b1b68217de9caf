"""``--model-load-retry-count``: a model version that fails to load is loaded again, at once, up to
that many more times, at startup and through the load API, as Triton does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.models import python_model
from tests.servers import TritiumServer

# Counts its initializations in its model folder; fails until the try ``SUCCEEDS_AT``.
MODEL = '''
import os
import triton_python_backend_utils as pb_utils

SUCCEEDS_AT = {succeeds_at}


class TritonPythonModel:
    def initialize(self, args):
        tries = os.path.join(args["model_repository"], "tries")
        with open(tries, "a") as f:
            f.write("x")
        with open(tries) as f:
            count = len(f.read())
        if count < SUCCEEDS_AT:
            raise RuntimeError(f"try {{count}} fails")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "flaky", MODEL.format(succeeds_at=3), CONFIG)
    python_model(repo, "broken", MODEL.format(succeeds_at=99), CONFIG)
    with TritiumServer(repo, "--model-control-mode", "explicit", "--load-model", "flaky",
                       "--model-load-retry-count", "2") as server:
        yield server, repo


def tries(repo: Path, model: str) -> int:
    return len((repo / model / "tries").read_text())


def test_a_model_that_loads_on_its_third_try_serves_after_two_retries(served):
    server, repo = served
    assert tries(repo, "flaky") == 3
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("flaky")
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([4.0], dtype=np.float32))
    assert client.infer("flaky", [x]).as_numpy("Y").tolist() == [4.0]
    assert "failed to load, trying again (retry 2 of 2): Internal: RuntimeError: try 2 fails" in server.logs()


def test_a_load_that_fails_every_try_answers_the_last_error(served):
    server, repo = served
    answer = requests.post(f"http://{server.url}/v2/repository/models/broken/load", timeout=60)
    assert answer.status_code == 400
    # As Triton's stub reports an exception of initialize: its status, the exception, the model's frames.
    raises_at = next(n for n, text in enumerate(MODEL.splitlines(), 1) if "raise RuntimeError" in text)
    reason = (f"Internal: RuntimeError: try 3 fails\n\nAt:\n  {repo / 'broken' / '1' / 'model.py'}({raises_at}): "
              "initialize\n")
    assert answer.json()["error"] == f"load failed for model 'broken': version 1 is at UNAVAILABLE state: {reason};\n"
    assert tries(repo, "broken") == 3
    index = requests.post(f"http://{server.url}/v2/repository/index", timeout=10).json()
    assert {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": reason} in index
