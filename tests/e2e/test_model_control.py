"""Model control: explicit load / unload / index over HTTP and gRPC, reloads without a
dropped request, failed reloads that keep the old model, and poll mode."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.grpc_requests import NOT_SERVING, SERVING, health_check
from tests.e2e.rawhttp import error_of, request
from tests.models import SCALED_MODEL, SLOW_MODEL, scaled_config, scaled_config_json
from tests.servers import TritiumServer

MODELS = Path(__file__).parent / "python_repo"

def write_scaled(repo: Path, name: str, scale: float) -> None:
    """Write the model beside the repository and move it in at once, so that a poll never
    sees half of it (the way to change a polled repository)."""
    staging = repo.parent / f".staging-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "1").mkdir(parents=True)
    (staging / "1" / "model.py").write_text(SCALED_MODEL)
    (staging / "config.pbtxt").write_text(scaled_config(scale, name))
    shutil.rmtree(repo / name, ignore_errors=True)
    staging.rename(repo / name)


def replace_file(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(text)
    staging.replace(path)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("py_add_sub", "py_init_fails"):
        shutil.copytree(MODELS / name, repo / name)
    write_scaled(repo, "scaled", 1)
    write_scaled(repo, "spare", 3)
    write_scaled(repo, "slow", 1)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (repo / "py_config_fails" / "1").mkdir(parents=True)
    (repo / "py_config_fails" / "1" / "model.py").write_text(CONFIG_FAILS_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with TritiumServer(repo, "--model-control-mode=explicit", "--load-model=scaled") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


def scaled_infer(client, model: str = "scaled") -> np.ndarray:
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("Y")[0]


def touch_config(repo: Path, name: str) -> None:
    """The model's config.pbtxt seen as changed (a second later), its text the same."""
    path = repo / name / "config.pbtxt"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def index(server, ready: bool | None = None) -> dict:
    body = {} if ready is None else {"ready": ready}
    status, headers, data = request(server.url, "POST", "/v2/repository/index", body)
    assert status == 200, data
    assert headers["content-type"] == "application/json"
    return {(e["name"], e.get("version")): e for e in json.loads(data)}


def load(server, model: str, parameters: dict | None = None) -> tuple[int, bytes]:
    body = {"parameters": parameters} if parameters is not None else None
    status, _, data = request(server.url, "POST", f"/v2/repository/models/{model}/load", body)
    return status, data


def test_startup_loads_only_the_named_models(server):
    entries = index(server)
    assert entries[("scaled", "1")]["state"] == "READY"
    assert entries[("spare", None)] == {"name": "spare"}          # in the repository, never loaded
    assert entries[("py_add_sub", None)] == {"name": "py_add_sub"}
    assert list(index(server, ready=True)) == [("scaled", "1")]
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200


def test_load_then_infer_then_unload(server, client):
    status, data = load(server, "spare")
    assert (status, data) == (200, b"")
    # The model is served as soon as the load returns: no waiting for the gateway to learn of it.
    np.testing.assert_array_equal(scaled_infer(client, "spare"), [3, 6, 9, 12])
    assert index(server)[("spare", "1")]["state"] == "READY"

    status, _, data = request(server.url, "POST", "/v2/repository/models/spare/unload")
    assert (status, data) == (200, b"")
    with pytest.raises(InferenceServerException) as failure:
        scaled_infer(client, "spare")
    assert failure.value.status() == "404"
    assert "Request for unknown model: 'spare' has no available versions" in failure.value.message()
    deadline = time.monotonic() + 10
    while index(server)[("spare", "1")]["state"] != "UNAVAILABLE" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert index(server)[("spare", "1")] == {"name": "spare", "version": "1", "state": "UNAVAILABLE",
                                             "reason": "unloaded"}
    # Readiness of an unloaded model: 400, with or without the version, as for anything not ready.
    for path in ("/v2/models/spare/ready", "/v2/models/spare/versions/1/ready", "/v2/models/spare/versions/9/ready"):
        status, _, data = request(server.url, "GET", path)
        assert (status, error_of(data)) == (400, "Model version not ready")
    # Unloading what is not loaded succeeds, as in Triton; an unloaded model does not make the server unready.
    assert request(server.url, "POST", "/v2/repository/models/spare/unload")[0] == 200
    assert request(server.url, "POST", "/v2/repository/models/never_loaded/unload")[0] == 200
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200


def test_unload_lets_running_requests_finish(server, client):
    assert load(server, "slow") == (200, b"")
    results = []
    own = httpclient.InferenceServerClient(server.url, network_timeout=60)  # one client per thread
    running = threading.Thread(target=lambda: results.append(scaled_infer(own, "slow")))
    running.start()
    time.sleep(0.3)   # the request is executing (the model sleeps a second)
    assert request(server.url, "POST", "/v2/repository/models/slow/unload")[0] == 200
    with pytest.raises(InferenceServerException) as failure:
        scaled_infer(client, "slow")
    assert failure.value.status() == "404"
    running.join()
    np.testing.assert_array_equal(results[0], [1, 2, 3, 4])


CONFIG_FAILS_MODEL = '''class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        raise ValueError("no tokenizer to read the inputs from")
'''


@pytest.mark.parametrize("model, reason", [
    ("py_init_fails", "Internal: RuntimeError: cannot find the weights file\n\nAt:\n  {file}(3): initialize\n"),
    # Triton runs auto_complete_config as a version loads: the model is listed, its version failed.
    ("py_config_fails", "Internal: ValueError: no tokenizer to read the inputs from\n\nAt:\n"
                        "  {file}(4): auto_complete_config\n")])
def test_a_model_that_fails_to_load_is_reported_and_others_keep_serving(repo, server, client, model, reason):
    status, data = load(server, model)
    assert status == 400
    reason = reason.format(file=repo / model / "1" / "model.py")
    assert error_of(data) == f"load failed for model '{model}': version 1 is at UNAVAILABLE state: {reason};\n"
    assert index(server)[(model, "1")] == {"name": model, "version": "1", "state": "UNAVAILABLE", "reason": reason}
    np.testing.assert_array_equal(scaled_infer(client), [1, 2, 3, 4])
    # A failed model keeps the server not ready (strict readiness), unloaded or not, until a load of
    # it succeeds, as in Triton 2.51 (unloading what is not loaded changes nothing); gRPC's health
    # checking protocol says the same, as Triton's.
    assert request(server.url, "GET", "/v2/health/ready")[0] == 400
    assert health_check(server.grpc_url) == NOT_SERVING
    assert request(server.url, "POST", f"/v2/repository/models/{model}/unload")[0] == 200
    assert request(server.url, "GET", "/v2/health/ready")[0] == 400
    assert index(server)[(model, "1")]["reason"] == reason
    clear_failure(repo, server, model)
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200
    assert health_check(server.grpc_url) == SERVING


def test_a_load_where_one_version_fails_unloads_the_versions_it_loaded(server, client, repo):
    """As Triton: "If any of the versions fails to load, abort the load and unload all newly loaded
    versions" (2.51 side by side: version 1 'unloaded', version 2 its failure, the server not ready)."""
    write_scaled(repo, "halves", 1)
    (repo / "halves" / "2").mkdir()
    (repo / "halves" / "2" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('half of it')\n")
    with open(repo / "halves" / "config.pbtxt", "a") as config:
        config.write("version_policy: { all { } }\n")
    status, data = load(server, "halves")
    assert status == 400 and error_of(data).startswith(
        "load failed for model 'halves': version 2 is at UNAVAILABLE state: Internal: RuntimeError: half of it")
    entries = index(server)
    assert entries[("halves", "1")] == {"name": "halves", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert entries[("halves", "2")]["reason"].startswith("Internal: RuntimeError: half of it")
    with pytest.raises(InferenceServerException) as failure:
        scaled_infer(client, "halves")
    assert failure.value.status() == "404"
    assert failure.value.message() == "Request for unknown model: 'halves' has no available versions"
    assert request(server.url, "GET", "/v2/health/ready")[0] == 400
    clear_failure(repo, server, "halves")
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200


def clear_failure(repo: Path, server, model: str) -> None:
    """Load a model that failed from good files, then unload it and put its files back."""
    saved = {path: path.read_bytes() for path in (repo / model).rglob("*") if path.is_file()}
    write_scaled(repo, model, 1)
    try:
        assert load(server, model) == (200, b"")
        assert request(server.url, "POST", f"/v2/repository/models/{model}/unload")[0] == 200
    finally:
        shutil.rmtree(repo / model)
        for path, data in saved.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def test_an_instance_that_dies_while_starting_fails_the_load(server, repo):
    write_scaled(repo, "crasher", 1)
    (repo / "crasher" / "1" / "model.py").write_text(
        "import os\n\nclass TritonPythonModel:\n    def initialize(self, args):\n        os._exit(7)\n")
    status, data = load(server, "crasher")
    assert status == 400
    assert "instance crasher_0 exited with status 7 before it was ready" in error_of(data)
    clear_failure(repo, server, "crasher")
    assert load(server, "spare")[0] == 200   # and loads go on
    assert request(server.url, "POST", "/v2/repository/models/spare/unload")[0] == 200


def test_loading_a_model_the_repository_does_not_have(server):
    status, data = load(server, "nowhere")
    assert status == 400
    assert error_of(data) == "failed to load 'nowhere', failed to poll from model repository"
    assert not any(name == "nowhere" for name, _ in index(server))


def test_reload_under_load_drops_no_request(server, client, repo):
    """Change the model on disk and load it again while requests keep coming."""
    answers, failures, stop = [], [], threading.Event()
    readiness = []

    def keep_probing():  # a readiness probe (Kubernetes) must not flip during a reload
        while not stop.is_set():
            readiness.append(request(server.url, "GET", "/v2/health/ready")[0])
            time.sleep(0.02)

    def keep_asking():
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            while not stop.is_set():
                try:
                    answers.append(float(scaled_infer(own)[0]))
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    failures.append(repr(exc))
        finally:
            own.close()   # in its own thread: gevent's pool cannot be joined from another (at collection)

    workers = [threading.Thread(target=keep_asking) for _ in range(3)] + [threading.Thread(target=keep_probing)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.5)
        (repo / "scaled" / "config.pbtxt").write_text(scaled_config(2))
        status, data = load(server, "scaled")
        assert (status, data) == (200, b"")
        time.sleep(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
        (repo / "scaled" / "config.pbtxt").write_text(scaled_config(1))
    assert failures == []
    assert set(readiness) == {200}
    assert set(answers) <= {1.0, 2.0} and answers[-1] == 2.0
    assert answers.count(1.0) > 0 and answers.count(2.0) > 0
    np.testing.assert_array_equal(scaled_infer(client), [2, 4, 6, 8])  # after the load returned: the new one
    # The config went back to scale 1 on disk (above): loading again reads it.
    assert load(server, "scaled")[0] == 200
    np.testing.assert_array_equal(scaled_infer(client), [1, 2, 3, 4])


def test_a_change_of_version_policy_alone_leaves_a_version_that_stays_running(server, client, repo):
    for version in ("1", "2"):
        (repo / "policy" / version).mkdir(parents=True)
        (repo / "policy" / version / "model.py").write_text(SCALED_MODEL)
    config = json.loads(scaled_config_json(2, "policy"))
    config["version_policy"] = {"all": {}}
    assert load(server, "policy", {"config": json.dumps(config)}) == (200, b"")
    assert [index(server)[("policy", v)]["state"] for v in ("1", "2")] == ["READY", "READY"]
    config["version_policy"] = {"specific": {"versions": [2]}}
    assert load(server, "policy", {"config": json.dumps(config)}) == (200, b"")
    assert index(server)[("policy", "1")]["reason"] == "unloaded"
    np.testing.assert_array_equal(scaled_infer(client, "policy"), [2, 4, 6, 8])
    assert server.logs().count("serving model policy version 2 ") == 1, "version 2 was loaded again"
    assert client.get_model_config("policy")["version_policy"] == {"specific": {"versions": [2]}}


def test_failed_reload_keeps_the_old_model_serving(server, client):
    before = scaled_infer(client)
    status, data = load(server, "scaled", {"config": scaled_config_json(0)})
    assert status == 400
    assert "scale must not be 0" in error_of(data)
    np.testing.assert_array_equal(scaled_infer(client), before)
    assert index(server)[("scaled", "1")]["state"] == "READY"
    assert request(server.url, "GET", "/v2/models/scaled/ready")[0] == 200


def test_config_override_and_shipped_files(server, client, repo):
    # A config given with the request replaces config.pbtxt (its keys may go unquoted, as
    # Triton's JSON reader takes them)...
    unquoted = re.sub(r'"(\w+)"(\s*):', r"\1\2:", scaled_config_json(5))
    assert '"' not in unquoted.split(":")[0]
    assert load(server, "scaled", {"config": unquoted}) == (200, b"")
    np.testing.assert_array_equal(scaled_infer(client), [5, 10, 15, 20])
    config = client.get_model_config("scaled")
    assert config["parameters"]["scale"]["string_value"] == "5"
    # one object where a list is expected, as Triton's reader takes it too
    single = json.loads(scaled_config_json(6))
    single["instance_group"] = {"kind": "KIND_CPU", "count": 2}
    assert load(server, "scaled", {"config": json.dumps(single)}) == (200, b"")
    np.testing.assert_array_equal(scaled_infer(client), [6, 12, 18, 24])
    assert client.get_model_config("scaled")["instance_group"][0]["count"] == 2
    assert load(server, "scaled", {"config": unquoted}) == (200, b"")
    # ...and files shipped with it make a model the repository does not have (a leading '/' is
    # below the model folder, as in Triton).
    files = {"config": scaled_config_json(7, "shipped"),
             "file:/1/model.py": base64.b64encode(SCALED_MODEL.encode()).decode()}
    assert load(server, "shipped", files) == (200, b"")
    np.testing.assert_array_equal(scaled_infer(client, "shipped"), [7, 14, 21, 28])
    assert load(server, "scaled") == (200, b"")  # nothing changed on disk: the override stays
    np.testing.assert_array_equal(scaled_infer(client), [5, 10, 15, 20])
    touch_config(repo, "scaled")
    assert load(server, "scaled") == (200, b"")  # the folder changed: back to the files on disk
    np.testing.assert_array_equal(scaled_infer(client), [1, 2, 3, 4])


def test_the_index_lists_the_repository_s_folders_as_triton_does(server, client, repo):
    """As Triton 2.51 (side by side, explicit mode): a model loaded from the load API's files alone
    is not in the index, and a loaded model whose folder is removed leaves it while it still serves."""
    files = {"config": scaled_config_json(9, "unlisted"),
             "file:1/model.py": base64.b64encode(SCALED_MODEL.encode()).decode()}
    write_scaled(repo, "moved_away", 3)
    try:
        assert load(server, "unlisted", files) == (200, b"")
        assert load(server, "moved_away") == (200, b"")
        assert ("moved_away", "1") in index(server)
        (repo / "moved_away").rename(repo.parent / ".moved_away")
        listed = {name for name, _ in index(server)}
        assert "unlisted" not in listed and "moved_away" not in listed and "spare" in listed
        np.testing.assert_array_equal(scaled_infer(client, "unlisted"), [9, 18, 27, 36])
        np.testing.assert_array_equal(scaled_infer(client, "moved_away"), [3, 6, 9, 12])
    finally:
        for name in ("unlisted", "moved_away"):
            request(server.url, "POST", f"/v2/repository/models/{name}/unload")


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/repository/index", {"ready": 1}, 400, "Unable to parse 'ready', expect bool"),
    ("/v2/repository/index", "[1", 400, "failed to parse the request JSON buffer"),
    ("/v2/repository/models/scaled/load", {"parameters": {"config": {"a": 1}}}, 400,
     "failed to load 'scaled': the 'config' parameter must be a JSON string"),
    ("/v2/repository/models/scaled/load", {"parameters": {"config": "{bad"}}, 400,
     "failed to load 'scaled': invalid 'config' parameter"),
    ("/v2/repository/models/scaled/load", {"parameters": {"file:1/model.py": "eA=="}}, 400,
     "a 'file:' override needs a 'config' parameter"),
    ("/v2/repository/models/scaled/load", {"parameters": {"config": scaled_config_json(1), "file:../x": "eA=="}},
     400, "file override 'file:../x' must be a relative path inside the model folder"),
    ("/v2/repository/models/scaled/unload", {"parameters": {"unload_dependents": "yes"}}, 400,
     "Unable to parse 'unload_dependents', expect bool"),
    ("/v2/repository/r1/models/scaled/load", None, 501, "'repository_name' specification is not supported"),
    ("/v2/repository/models/scaled/load", {"parameters": {"foo": "bar"}}, 400, "unrecognized load parameter 'foo'."),
])
def test_bad_repository_requests(server, client, path, body, status, message):
    got, _, data = request(server.url, "POST", path, body)
    assert got == status
    assert message in error_of(data)
    np.testing.assert_array_equal(scaled_infer(client), [1, 2, 3, 4])  # still serving, unchanged


def test_repository_routes_answer_only_post(server):
    status, _, data = request(server.url, "GET", "/v2/repository/index")
    assert (status, error_of(data)) == (405, "Method Not Allowed")


def test_grpc_index_load_unload(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    names = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert names[("scaled", "1")] == "READY" and ("py_add_sub", "") in names
    assert client.is_model_ready("py_add_sub") is False   # model_analyzer asks this of every indexed model
    client.load_model("py_add_sub")
    assert client.is_model_ready("py_add_sub")
    a = np.ones((1, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("py_add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    client.load_model("scaled", config=scaled_config_json(4))
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    np.testing.assert_array_equal(client.infer("scaled", [x]).as_numpy("Y"), [[4, 4, 4, 4]])
    with pytest.raises(InferenceServerException) as failure:
        client.load_model("nowhere")
    assert failure.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.unload_model("py_add_sub")
    with pytest.raises(InferenceServerException) as failure:
        client.infer("py_add_sub", inputs)
    assert failure.value.status() == "StatusCode.NOT_FOUND"
    client.load_model("scaled")


def test_grpc_load_takes_files_as_bytes(server, client):
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_client.load_model("from_grpc", config=scaled_config_json(5, "from_grpc"),
                               files={"file:1/model.py": SCALED_MODEL.encode()})
        np.testing.assert_array_equal(scaled_infer(client, "from_grpc"), [5, 10, 15, 20])
    finally:
        grpc_client.unload_model("from_grpc")


def _grpc_control(server, rpc: str, name: str, parameters: dict | None = None) -> tuple[str, str]:
    """``rpc`` (RepositoryModelLoad or RepositoryModelUnload) with ``parameters`` as {key: (kind, value)}:
    its status code's name and its details."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = getattr(service_pb2, f"{rpc}Request")(model_name=name)
    for key, (kind, value) in (parameters or {}).items():
        parameter = request.parameters[key]   # a kind of None: present, no value
        if kind is not None:
            setattr(parameter, kind, value)
    try:
        getattr(stub, rpc)(request, timeout=60)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()
    return "OK", ""


@pytest.mark.parametrize("rpc, parameters, message", [
    ("RepositoryModelLoad", {"config": ("bytes_param", b"{}")},
     "invalid value type for load parameter 'config', expected string_param."),
    ("RepositoryModelLoad", {"config": ("string_param", "{}"), "file:1/model.py": ("string_param", "eA==")},
     "invalid value type for load parameter 'file:1/model.py', expected bytes_param."),
    ("RepositoryModelUnload", {"unload_dependents": ("string_param", "true")},
     "invalid value type for 'unload_dependents' parameter, expected bool_param."),
    ("RepositoryModelLoad", {"config": (None, None)}, "invalid value type for load parameter 'config', expected string_param."),
    ("RepositoryModelLoad", {"p": (None, None)}, "unrecognized load parameter 'p'."),
])
def test_grpc_load_parameters_of_the_wrong_type_get_triton_s_words(server, client, rpc, parameters, message):
    """Each refused with Triton's words: a parameter of the wrong type (a file's contents as text
    included: base64 is HTTP's way), a value left unset, a parameter Triton does not know."""
    assert _grpc_control(server, rpc, "scaled", parameters) == ("INVALID_ARGUMENT", message)
    assert client.is_model_ready("scaled")


@pytest.fixture(scope="module")
def polled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("polled")
    write_scaled(repo, "scaled", 1)
    with TritiumServer(repo, "--model-control-mode=poll", "--repository-poll-secs=1") as running:
        yield running, repo


@pytest.mark.parametrize("rpc, name", [("RepositoryModelLoad", "../x"), ("RepositoryModelLoad", ""),
                                       ("RepositoryModelUnload", "a/b"), ("RepositoryModelUnload", "")])
def test_outside_explicit_mode_any_name_is_refused_for_the_mode_first(polled, rpc, name):
    """As Triton: the mode is checked before the name, so every load and unload gets the mode's refusal."""
    server, _ = polled
    assert _grpc_control(server, rpc, name) == ("UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")


def wait_for(condition, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_poll_mode_follows_the_repository(polled):
    server, repo = polled
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    np.testing.assert_array_equal(scaled_infer(client), [1, 2, 3, 4])
    # The load API is refused in poll mode, with Triton's message.
    status, data = load(server, "scaled")
    assert (status, error_of(data)) == (503, "explicit model load / unload is not allowed if polling is enabled")

    write_scaled(repo, "added", 6)                                        # a new model
    wait_for(lambda: index(server).get(("added", "1"), {}).get("state") == "READY")
    np.testing.assert_array_equal(scaled_infer(client, "added"), [6, 12, 18, 24])

    replace_file(repo / "scaled" / "config.pbtxt", scaled_config(9))     # a changed config
    wait_for(lambda: scaled_infer(client)[0] == 9)

    shutil.copytree(repo / "scaled" / "1", repo / "scaled" / "staging")  # a new version folder
    (repo / "scaled" / "staging").rename(repo / "scaled" / "2")
    x = httpclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    def serves_version_2():
        try:
            return client.infer("scaled", [x]).get_response()["model_version"] == "2"
        except InferenceServerException:   # the request raced the swap: version 1 just went
            return False

    wait_for(serves_version_2)
    assert index(server)[("scaled", "1")]["reason"] == "unloaded"         # latest 1: version 1 goes

    (repo.parent / ".staging-broken").mkdir()                             # a failed load...
    (repo.parent / ".staging-broken" / "config.pbtxt").write_text("max_batch_size: [")
    (repo.parent / ".staging-broken").rename(repo / "broken")
    wait_for(lambda: "model broken failed to load" in server.logs())
    # A config that does not parse keeps the model out of Triton's lifecycle: listed by name only
    assert index(server)[("broken", None)] == {"name": "broken"}
    write_scaled(repo, "broken", 2)                                       # ...and polling goes on
    wait_for(lambda: index(server).get(("broken", "1"), {}).get("state") == "READY")
    np.testing.assert_array_equal(scaled_infer(client, "broken"), [2, 4, 6, 8])

    (repo / "added").rename(repo.parent / ".removed-added")               # a removed model
    assert not any(name == "added" for name, _ in index(server))          # leaves the index at once, as in Triton
    wait_for(lambda: not client.is_model_ready("added"))                  # and is unloaded at the next poll
    with pytest.raises(InferenceServerException):
        scaled_infer(client, "added")


# -- the logging extension (on this module's server, which logs model loads) -----------

DEFAULT_LOG_SETTINGS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}


def log_settings(server, changes: dict | None = None) -> dict:
    if changes is None:
        status, _, data = request(server.url, "GET", "/v2/logging")
    else:
        status, _, data = request(server.url, "POST", "/v2/logging", changes)
    assert status == 200, data
    return json.loads(data)


def new_log_lines(server, since: int) -> list[str]:
    return server.logs().splitlines()[since:]


def test_log_settings_reach_every_process(server, repo):
    assert log_settings(server) == DEFAULT_LOG_SETTINGS
    try:
        changed = log_settings(server, {"log_format": "ISO8601", "log_verbose_level": 1, "unknown_key": 1})
        assert changed == {**DEFAULT_LOG_SETTINGS, "log_format": "ISO8601", "log_verbose_level": 1}
        write_scaled(repo, "logged", 2)
        mark = len(server.logs().splitlines())
        assert load(server, "logged") == (200, b"")
        # ISO8601 lines end their timestamp with Z; each role logs the load in that format
        # (the instance may write its line just after the load has been answered).
        for role in ("D gateway[", "I broker[", "I worker[", "I instance:logged:"):
            wait_for(lambda: any(f"Z {role}" in line for line in new_log_lines(server, mark)), 10)

        log_settings(server, {"log_info": False})
        time.sleep(0.3)  # the answer comes once the broker has sent the change; let instances read it
        mark = len(server.logs().splitlines())
        assert request(server.url, "POST", "/v2/repository/models/logged/unload")[0] == 200
        assert load(server, "logged") == (200, b"")
        assert load(server, "py_init_fails")[0] == 400
        lines = new_log_lines(server, mark)
        assert not any(" I " in line for line in lines), lines             # info is off everywhere...
        assert any("Z E broker[" in line and "py_init_fails" in line for line in lines)  # ...errors are not
    finally:
        assert log_settings(server, {k: v for k, v in DEFAULT_LOG_SETTINGS.items() if k != "log_file"}) \
            == DEFAULT_LOG_SETTINGS
        clear_failure(repo, server, "py_init_fails")


@pytest.mark.parametrize("changes, status, message", [
    ({"log_file": "/tmp/x.log"}, 501, "log file location can not be updated through network protocol"),
    ({"log_info": "yes"}, 400, "log_info must be a boolean"),
    ({"log_verbose_level": -1}, 400, "log_verbose_level must be an unsigned integer"),
    # gRPC's LogSettings carries the level as uint32: a larger one stored would fail every later call
    ({"log_verbose_level": 2**32}, 400, "log_verbose_level must be an unsigned integer"),
    ({"log_format": "xml"}, 400, "invalid argument for --log_format, got: xml"),
])
def test_bad_log_settings(server, changes, status, message):
    got, _, data = request(server.url, "POST", "/v2/logging", changes)
    assert (got, error_of(data)) == (status, message)
    assert log_settings(server) == DEFAULT_LOG_SETTINGS


def test_log_settings_ignore_unknown_keys_whatever_they_hold(server):
    """As Triton: a key it does not know is ignored, numbers no process could carry (past 64 bits,
    NaN) included."""
    body = '{"log_verbose_level": 0, "junk": [NaN, -1108362631823252004218, 99999999999999999999999]}'
    status, _, data = request(server.url, "POST", "/v2/logging", body)
    assert (status, json.loads(data)) == (200, DEFAULT_LOG_SETTINGS)


def test_grpc_log_settings_round_trip(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_verbose_level"] == {"uint32_param": 0}
    assert settings["log_info"] == {"bool_param": True}
    try:
        updated = client.update_log_settings({"log_warning": False}, as_json=True)["settings"]
        assert updated["log_warning"] == {"bool_param": False}
        assert log_settings(server)["log_warning"] is False   # one set of settings, seen over HTTP too
    finally:
        client.update_log_settings({"log_warning": True})


def test_the_http_index_ignores_a_repository_name_as_triton_does(server):
    status, _, data = request(server.url, "POST", "/v2/repository/any-name/index", {})
    assert status == 200
    assert {(e["name"], e.get("version")): e for e in json.loads(data)} == index(server)


def test_statistics_list_the_models_by_name_then_version_as_triton_does(server, client):
    assert load(server, "py_add_sub")[0] == 200   # loaded after scaled (at startup), named before it
    try:
        stats = json.loads(request(server.url, "GET", "/v2/models/stats")[2])["model_stats"]
        keys = [(entry["name"], int(entry["version"])) for entry in stats]
        assert {("py_add_sub", 1), ("scaled", 1)} <= set(keys) and keys == sorted(keys)
        assert [(s["name"], int(s["version"])) for s in client.get_inference_statistics()["model_stats"]] == keys
    finally:
        request(server.url, "POST", "/v2/repository/models/py_add_sub/unload")
