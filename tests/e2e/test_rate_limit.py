"""``--rate-limit=execution_count``: models whose instance groups name the same resource run one
batch at a time when there are not enough of it for two; a model that could never get what it
asks for fails to load with Triton's reason, and the others keep serving."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.models import python_model
from tests.servers import TritiumServer

# Answers when it started and ended running each batch, and which instance ran it.
MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        started = time.time()
        time.sleep(0.15)
        ended = time.time()
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("WINDOW", np.array([started, ended], dtype=np.float64)),
            pb_utils.Tensor("INSTANCE", np.array([self.instance.encode()], dtype=np.object_))]) for _ in requests]
'''


def config(resources: str, count: int = 1) -> str:
    return f'''
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "WINDOW", data_type: TYPE_FP64, dims: [ 2 ] }}, {{ name: "INSTANCE", data_type: TYPE_STRING, dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: {count}, rate_limiter {{ resources [ {resources} ] }} }} ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "pair", MODEL, config('{ name: "R", count: 2 }', count=2))
    python_model(repo, "single", MODEL, config('{ name: "R", count: 1 }'))
    python_model(repo, "greedy", MODEL, config('{ name: "R", count: 3 }'))
    with TritiumServer(repo, "--rate-limit", "execution_count", "--rate-limit-resource", "R:2",
                       "--model-control-mode", "explicit", "--load-model", "pair", "--load-model", "single") as served:
        yield served


def run(url: str, model: str) -> tuple[float, float, str]:
    # Closed here, in the thread that made it: left to the collector, its gevent pool would be
    # closed from another thread, which gevent refuses (an "exception ignored" warning).
    client = httpclient.InferenceServerClient(url)
    try:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        result = client.infer(model, [x])
    finally:
        client.close()
    started, ended = result.as_numpy("WINDOW").tolist()
    return started, ended, result.as_numpy("INSTANCE")[0].decode()


def test_batches_that_together_need_more_than_there_is_never_overlap(server):
    with ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(lambda model: run(server.url, model), ["pair", "single"] * 3))
    assert len(runs) == 6
    overlapping = [(a, b) for a, b in itertools.combinations(sorted(runs), 2) if b[0] < a[1]]
    assert overlapping == []
    # pair has two instances: without the limiter both would run at once
    assert {instance for _, _, instance in runs} == {"pair_0_0", "pair_0_1", "single_0_0"}


def test_a_model_needing_more_than_the_flag_gives_fails_to_load_with_tritons_reason(server):
    answer = requests.post(f"http://{server.url}/v2/repository/models/greedy/load", timeout=60)
    reason = ('Invalid argument: Resource count for "R" is limited to 2 which will prevent scheduling of one or '
              "more model instances, the minimum required count is 3")
    assert (answer.status_code, answer.json()["error"]) == (
        400, f"load failed for model 'greedy': version 1 is at UNAVAILABLE state: {reason};\n")
    index = requests.post(f"http://{server.url}/v2/repository/index", timeout=10).json()
    assert {"name": "greedy", "version": "1", "state": "UNAVAILABLE", "reason": reason} in index
    assert run(server.url, "single")[2] == "single_0_0"
