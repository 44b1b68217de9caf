"""Dynamic batching seen through statistics, instance pinning, and an instance killed mid-batch."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import PYTHON_IDENTITY, add_sub_model, python_model, slow_model, write_config
from tests.servers import TritiumServer, instance_processes


WHO_ANSWERS = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        open(os.path.join({marks!r}, self.name), "w").close()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", np.array([self.name.encode()], np.object_))])
                for _ in requests]
"""


@pytest.fixture(scope="module")
def initialized(tmp_path_factory) -> Path:
    """Where each instance of ``standby`` leaves its name once its ``initialize`` has run."""
    return tmp_path_factory.mktemp("initialized")


@pytest.fixture(scope="module")
def server(tmp_path_factory, initialized):
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "standby", WHO_ANSWERS.replace("{marks!r}", repr(str(initialized))), """
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "WHO", data_type: TYPE_STRING, dims: [ 1 ] } ]
instance_group [ { name: "active", kind: KIND_CPU, count: 1 },
                 { name: "spare", kind: KIND_CPU, count: 2, passive: true } ]
""")
    add_sub_model(repo, "batched", max_batch_size=32,
                  extra="dynamic_batching { max_queue_delay_microseconds: 300000 }")
    add_sub_model(repo, "pinned", max_batch_size=8)
    write_config(repo / "pinned", (repo / "pinned" / "config.pbtxt").read_text().replace(
        "instance_group [ { kind: KIND_CPU, count: 1 } ]",
        "instance_group [ { kind: KIND_GPU, count: 2, gpus: [ 0, 1 ] }, { name: \"cpu\", kind: KIND_CPU, count: 1 } ]"))
    slow_model(repo / "slow" / "1" / "model.onnx")
    python_model(repo, "echo", PYTHON_IDENTITY, """
backend: "python"
max_batch_size: 16
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 50000 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 50000 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 2 } ]
""")
    write_config(repo / "slow", "max_batch_size: 8\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n")
    # The machine has no GPU: declare two, so that GPU placement can be checked without one.
    with TritiumServer(repo, env={"TRITIUM_GPUS": "0,1"}) as running:
        yield running


def _infer(url, model, a, b=None):
    names = ["INPUT0"] if b is None else ["INPUT0", "INPUT1"]
    inputs = []
    for name, array in zip(names, [a] if b is None else [a, b]):
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    # Closed in the thread that made it: the HTTP client's gevent pool cannot be joined from another.
    with httpclient.InferenceServerClient(url, network_timeout=120) as client:
        return client.infer(model, inputs)


def test_passive_instances_are_initialized_and_given_no_request(server, initialized):
    """As Triton: a passive group's instances are started and initialized (the load waits for
    them), and the scheduler sends them nothing."""
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    client = grpcclient.InferenceServerClient(server.grpc_url)   # (safe to share between threads)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.infer("standby", [tensor]).as_numpy("WHO")[0], range(40)))
    assert set(answers) == {b"active_0"}
    assert sorted(os.listdir(initialized)) == ["active_0", "spare_0", "spare_1"]


def test_concurrent_requests_are_batched_and_answered_each_with_its_own_result(server):
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("batched")["model_stats"][0]
    assert stats["execution_count"] == 0
    arrays = [np.full((1, 16), i, dtype=np.float32) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda a: _infer(server.url, "batched", a, np.ones_like(a)), arrays))
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array + 1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), array - 1)
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("batched")["model_stats"][0]
    assert stats["inference_count"] == 16
    assert stats["execution_count"] < 16, stats
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"]) == 16
    assert stats["inference_stats"]["queue"]["ns"] > 0  # requests waited for company


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_many_large_tensors_at_once_each_come_back_as_sent(server, protocol):
    """200 KB inputs, 32 clients at a time, three rounds: each crosses the links through the
    gateway's shared pool and comes back through its instance's, slots reused round after round."""
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    rng = np.random.default_rng(11)

    def echo(array):
        tensor = module.InferInput("IN", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        client = module.InferenceServerClient(url)
        try:
            return client.infer("echo", [tensor]).as_numpy("OUT")
        finally:
            client.close()

    for _ in range(3):
        arrays = [rng.standard_normal((1, 50000)).astype(np.float32) for _ in range(32)]
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(echo, arrays))
        for array, answer in zip(arrays, answers):
            np.testing.assert_array_equal(answer, array)
    (gateway,) = instance_processes(server, b"gateway")
    maps = Path(f"/proc/{gateway['pid']}/maps").read_text().splitlines()
    pools = {line.split()[4] for line in maps if "memfd:tritium-tensors" in line}   # by inode
    assert len(pools) >= 2   # its own, and an instance's it was passed with the first answer in it


def _tensor_pools(server) -> dict[tuple[str, str], list[float]]:
    """(process, kind) -> the pool's size, bytes in use and tensors sent as bytes, from /metrics."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found: dict[tuple[str, str], list[float]] = {}
    for name in ("tritium_tensor_pool_bytes", "tritium_tensor_pool_used_bytes", "tritium_tensor_pool_overflows_total"):
        for labels, value in re.findall(rf"^{name}{{([^}}]*)}} (\S+)$", text, re.M):
            label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            found.setdefault((label["process"], label["kind"]), []).append(float(value))
    return found


def test_the_gateways_and_instances_tensor_pools_are_in_metrics(server):
    """After large echoes in both directions (above): the gateway's pool for inputs and each echo
    instance's for outputs, 256 MiB each, nothing held once every answer was read, nothing sent as
    bytes for want of room. The figures come with the heartbeats."""
    client = httpclient.InferenceServerClient(server.url)
    for _ in range(4):   # the pools have held tensors, and given them back
        tensor = httpclient.InferInput("IN", [1, 50000], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 50000), np.float32))
        assert client.infer("echo", [tensor]).as_numpy("OUT").sum() == 50000
    client.close()
    mib256 = [float(256 << 20), 0.0, 0.0]

    def settled():
        pools = _tensor_pools(server)
        requests = [figures for (_, kind), figures in pools.items() if kind == "request"]
        echoes = [figures for (process, kind), figures in pools.items() if kind == "answer" and "/echo/" in process]
        return requests == [mib256] and echoes == [mib256, mib256]

    deadline = time.monotonic() + 15
    while not settled():
        assert time.monotonic() < deadline, _tensor_pools(server)
        time.sleep(0.2)


def _instances_of(server, model):
    return [p for p in instance_processes(server) if p["env"].get("TRITIUM_MODEL") == f"{model}/1"]


def test_each_instance_process_is_pinned_to_its_gpu_or_cpu(server):
    pinned = _instances_of(server, "pinned")
    placements = sorted((p["env"]["TRITIUM_INSTANCE_NAME"], p["env"].get("CUDA_VISIBLE_DEVICES"),
                         p["argv"][-1].split("/")[-2]) for p in pinned)
    assert placements == [
        ("cpu_0", None, "cpu_0"),
        ("pinned_0_0", "0", "pinned_0_0@gpu0"),
        ("pinned_0_0", "1", "pinned_0_0@gpu1"),
        ("pinned_0_1", "0", "pinned_0_1@gpu0"),
        ("pinned_0_1", "1", "pinned_0_1@gpu1"),
    ]
    a = np.ones((2, 16), dtype=np.float32)
    np.testing.assert_array_equal(_infer(server.url, "pinned", a, a).as_numpy("OUTPUT0"), 2 * a)


def test_a_request_whose_instance_is_killed_runs_again_on_the_restarted_instance(server):
    (victim,) = _instances_of(server, "slow")
    x = np.ones((1, 64), dtype=np.float32)
    outcome = {}

    def send():
        try:
            outcome["result"] = _infer(server.url, "slow", x)
        except InferenceServerException as exc:
            outcome["error"] = exc

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.5)  # the request is running: the model takes over a second
    os.kill(victim["pid"], signal.SIGKILL)
    sender.join(60)
    assert "result" in outcome, f"the request must run again, not fail: {outcome.get('error')}"
    assert outcome["result"].as_numpy("OUTPUT0").shape == (1, 64)
    assert np.isfinite(outcome["result"].as_numpy("OUTPUT0")).all()
    (replacement,) = _instances_of(server, "slow")
    assert replacement["pid"] != victim["pid"], "the agent must restart the instance"
    assert ("instance slow_0_0 of model slow version 1 was killed by signal 9; running its 1 request(s) "
            "again elsewhere") in server.logs()
