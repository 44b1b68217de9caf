"""Model repositories in S3, served as Triton serves them (``--model-repository
s3://host:port/bucket/path``): the servers read a real S3 server (moto's, on loopback) with the
credentials in AWS's variables; polling follows the bucket, a load reads it as it is at the
load, and a worker host on its own fetches the models it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import cluster
from tests.e2e.rawhttp import error_of, request
from tests.s3_server import CREDENTIALS, s3_server
from tests.servers import TritiumServer, free_port

MODEL = '''
import triton_python_backend_utils as pb_utils

FACTOR = {factor}


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(request, "X").as_numpy() * FACTOR)]) for request in requests]
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
'''


@pytest.fixture(scope="module")
def s3():
    with pytest.MonkeyPatch.context() as patch, s3_server("models") as server:
        for name, value in CREDENTIALS.items():   # the servers started here read them as Triton does
            patch.setenv(name, value)
        yield server


def put_model(s3, prefix: str, name: str, factor: float, batch: int = 4) -> None:
    s3.put("models", f"{prefix}/{name}/config.pbtxt", CONFIG.format(name=name, batch=batch))
    s3.put("models", f"{prefix}/{name}/1/model.py", MODEL.format(factor=factor))


def infer(url: str, model: str) -> list[float]:
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    return client.infer(model, [x]).as_numpy("Y").ravel().tolist()


def wait_for(condition, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception:  # not yet: the server has not polled the change in
            pass
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_polling_follows_the_bucket(s3):
    put_model(s3, "poll", "scale", factor=2)
    with TritiumServer(s3.location("models", "poll"), "--model-control-mode", "poll",
                       "--repository-poll-secs", "1") as server:
        polling_follows(s3, server.url, "poll", "scale")


def polling_follows(store, url: str, prefix: str, model: str) -> None:
    """A server polling the bucket's ``prefix``, ``model`` served at factor 2: a replaced
    model.py, an added model and a deleted one are each polled in."""
    assert infer(url, model) == [2.0, 4.0]
    store.put("models", f"{prefix}/{model}/1/model.py", MODEL.format(factor=3))
    wait_for(lambda: infer(url, model) == [3.0, 6.0], "the replaced model.py served")
    put_model(store, prefix, "added", factor=5)
    wait_for(lambda: infer(url, "added") == [5.0, 10.0], "the added model served")
    store.delete_prefix("models", f"{prefix}/added/")
    wait_for(lambda: request(url, "GET", "/v2/models/added/ready")[0] == 400, "the deleted model unloaded")
    assert infer(url, model) == [3.0, 6.0]


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "twice" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
"""


def test_an_ensemble_whose_version_folder_is_a_folder_marker_serves(s3):
    put_model(s3, "ensemble", "twice", factor=2)
    s3.put("models", "ensemble/ens/config.pbtxt", ENSEMBLE)
    s3.put("models", "ensemble/ens/1/", "")   # the empty version folder, as the S3 console makes it
    with TritiumServer(s3.location("models", "ensemble")) as server:
        assert infer(server.url, "ens") == [2.0, 4.0]


def test_a_bucket_that_stops_answering_keeps_its_models_and_the_folders_beside_it_are_polled(s3, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    with s3_server("flaky") as flaky:
        flaky.put("flaky", "repo/remote/config.pbtxt", CONFIG.format(name="remote", batch=4))
        flaky.put("flaky", "repo/remote/1/model.py", MODEL.format(factor=2))
        with TritiumServer(flaky.location("flaky", "repo"), "--model-repository", str(local),
                           "--model-control-mode", "poll", "--repository-poll-secs", "1") as server:
            assert infer(server.url, "remote") == [2.0, 4.0]
            flaky.stop()
            (local / "here" / "1").mkdir(parents=True)
            (local / "here" / "config.pbtxt").write_text(CONFIG.format(name="here", batch=4))
            (local / "here" / "1" / "model.py").write_text(MODEL.format(factor=3))
            wait_for(lambda: infer(server.url, "here") == [3.0, 6.0], "the folder's new model served")
            assert infer(server.url, "remote") == [2.0, 4.0]   # read as last fetched: not unloaded
            assert "its copy is read as last fetched" in server.logs()


def test_a_load_reads_the_bucket_as_it_is_then(s3, tmp_path):
    put_model(s3, "explicit", "m", factor=2, batch=4)
    put_model(s3, "explicit", "other", factor=5)
    with TritiumServer(s3.location("models", "explicit"), "--model-control-mode", "explicit",
                       "--load-model", "m", env={"TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path)}) as server:
        assert request(server.url, "GET", "/v2/models/m/config")[2].count(b'"max_batch_size":4') == 1
        # Explicit mode fetched the names for the index, and the files of what it loaded only.
        index = json.loads(request(server.url, "POST", "/v2/repository/index", b"{}")[2])
        assert sorted(entry["name"] for entry in index) == ["m", "other"]
        [mirror] = tmp_path.glob("tritium-s3-*/*/repository")
        assert (mirror / "other").is_dir() and not any((mirror / "other").iterdir())
        assert request(server.url, "POST", "/v2/repository/models/other/load", b"")[0] == 200
        assert infer(server.url, "other") == [5.0, 10.0]
        put_model(s3, "explicit", "m", factor=7, batch=8)
        assert infer(server.url, "m") == [2.0, 4.0]   # nothing changes until the load
        status, _, _ = request(server.url, "POST", "/v2/repository/models/m/load", b"")
        assert status == 200
        assert b'"max_batch_size":8' in request(server.url, "GET", "/v2/models/m/config")[2]
        assert infer(server.url, "m") == [7.0, 14.0]
        status, _, body = request(server.url, "POST", "/v2/repository/models/absent/load", b"")
        assert (status, error_of(body)) == (400, "failed to load 'absent', failed to poll from model repository")


def test_a_worker_host_with_a_mirror_of_its_own_fetches_the_models_it_serves(s3, tmp_path):
    put_model(s3, "hosts", "m", factor=4)
    location = s3.location("models", "hosts")
    worker_mirrors = tmp_path / "worker-host"
    broker = cluster.broker(location)   # (its mirror under the run's temporary folder)
    parts = [broker]
    try:
        broker.wait_ready()
        parts.append(cluster.worker(broker.backend, location, env={"TRITON_AWS_MOUNT_DIRECTORY": str(worker_mirrors)}))
        parts.append(cluster.gateway(broker.frontend))
        for part in parts[1:]:
            part.wait_ready()
        assert wait_for(lambda: infer(parts[2].url, "m") == [4.0, 8.0], "m served by the worker host")
        [mirror] = worker_mirrors.glob("tritium-s3-*/*/repository")
        fetched = [path.relative_to(mirror).as_posix() for path in mirror.rglob("*")
                   if path.is_file() and path.parent.name != "__pycache__"]
        assert sorted(fetched) == ["m/1/model.py", "m/config.pbtxt"]
        [snapshot] = mirror.parent.glob("snapshots/agent-*/*/m")   # what the instance runs from
        assert (snapshot / "1" / "model.py").read_text() == MODEL.format(factor=4)
        broker.kill()   # a new broker process: its epochs start again, the worker keeps its instance
        broker.start()
        broker.wait_ready()
        assert wait_for(lambda: infer(parts[2].url, "m") == [4.0, 8.0], "m served again after the broker's restart")
        assert "adopting running instance" in broker.logs()
        assert snapshot.is_dir()   # the adopted instance still runs from it
    finally:
        for part in reversed(parts):
            part.stop()


def test_a_bucket_that_cannot_be_read_stops_startup_naming_the_location(s3):
    location = s3.location("no-such-bucket", "models")
    output = failed_start(location)
    assert f"model repository '{location}' cannot be read: cannot list s3://{s3.host_port}/no-such-bucket/models/: " \
        in output
    assert "NoSuchBucket" in output


def failed_start(location: str) -> str:
    """What ``tritium serve`` of the repository says, given that it fails to start."""
    result = subprocess.run([sys.executable, "-m", "tritium.cli", "serve", "--model-repository", location,
                             "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                             "--metrics-port", str(free_port())],
                            capture_output=True, timeout=60, env=dict(os.environ), cwd=Path(__file__).parents[2])
    assert result.returncode != 0
    return result.stdout.decode() + result.stderr.decode()


def test_repo_check_reads_an_s3_repository_as_serve_would(s3):
    put_model(s3, "check", "c", factor=1, batch=2)

    def check(location: str) -> tuple[int, dict]:
        done = subprocess.run([sys.executable, "-m", "tritium.cli", "repo", "check", location, "--json"],
                              capture_output=True, timeout=60, cwd=Path(__file__).parents[2])
        return done.returncode, json.loads(done.stdout)

    code, report = check(s3.location("models", "check"))
    assert (code, report["ok"], [row["name"] for row in report["models"]]) == (0, True, ["c"])
    location = s3.location("no-such-bucket")
    code, report = check(location)
    assert (code, report["ok"], report["models"]) == (1, False, [])
    [error] = report["repository_errors"]
    assert error.startswith(f"model repository '{location}' cannot be read: "
                            f"cannot list s3://{s3.host_port}/no-such-bucket/: ")
