"""Model names are names, never paths: hostile names in every API over HTTP and gRPC,
with the file system checked afterwards."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.rawhttp import error_of, request
from tests.models import SCALED_MODEL, scaled_config_json
from tests.servers import TritiumServer

MODELS = Path(__file__).parent / "python_repo"
NOT_A_NAME = "a model name is one folder name, not a path: no '/', '\\', '..', NUL or control characters"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` with its content (the check that nothing was written or deleted)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """A repository and, beside it, a folder a hostile name points at (with a file to lose)."""
    root = tmp_path_factory.mktemp("names")
    repo = root / "deep" / "er" / "repo"
    repo.mkdir(parents=True)
    shutil.copytree(MODELS / "py_add_sub", repo / "py_add_sub")
    victim = root / "victim"
    (victim / "1").mkdir(parents=True)
    (victim / "keep.txt").write_text("precious")
    return root, repo, victim


@pytest.fixture(scope="module")
def server(layout):
    _, repo, _ = layout
    with TritiumServer(repo, "--model-control-mode=explicit", "--load-model=py_add_sub") as running:
        yield running


def hostile_names(layout) -> list[str]:
    root, repo, victim = layout
    relative = os.path.relpath(victim, repo)             # ../../../victim
    return [relative, str(root / "absolute"), "a/b", "..", ".", "x\0y", "a\nb", "a\\b", "a\x7fb",
            "py_add_sub/../py_add_sub", f"{relative}/../victim"]


def override_parameters(name: str = "scaled") -> dict:
    return {"config": scaled_config_json(2, name), "file:1/model.py": base64.b64encode(SCALED_MODEL.encode()).decode()}


def assert_nothing_written(layout, before: dict) -> None:
    root, _, victim = layout
    assert snapshot(root) == before
    assert (victim / "keep.txt").read_text() == "precious"
    assert not (root / "absolute").exists()


def test_hostile_names_are_refused_by_the_http_load_and_unload(server, layout):
    before = snapshot(layout[0])
    for name in hostile_names(layout):
        # A '/' sent as %2F is decoded, so the path has one segment more: no route (Triton's 404).
        refusal = (404, "Not Found") if "/" in name else None
        for parameters in (override_parameters(), None):
            body = {"parameters": parameters} if parameters else None
            status, _, data = request(server.url, "POST", f"/v2/repository/models/{quote(name, safe='')}/load", body)
            expected = refusal or (400, f"failed to load '{name}', failed to poll from model repository: {NOT_A_NAME}")
            assert (status, error_of(data)) == expected, name
        status, _, data = request(server.url, "POST", f"/v2/repository/models/{quote(name, safe='')}/unload")
        assert (status, error_of(data)) == (refusal or (400, f"failed to unload '{name}': {NOT_A_NAME}")), name
    assert_nothing_written(layout, before)


def test_hostile_names_are_refused_by_the_grpc_load_and_unload(server, layout):
    before = snapshot(layout[0])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    files = {"file:1/model.py": SCALED_MODEL.encode()}
    for name in hostile_names(layout):
        for kwargs in ({"config": scaled_config_json(2), "files": files}, {}):
            with pytest.raises(InferenceServerException) as failure:
                client.load_model(name, **kwargs)
            assert failure.value.status() == "StatusCode.INVALID_ARGUMENT", name
            assert failure.value.message().startswith(f"failed to load '{name}', failed to poll"), name
        with pytest.raises(InferenceServerException) as failure:
            client.unload_model(name)
        assert failure.value.status() == "StatusCode.INVALID_ARGUMENT", name
    assert_nothing_written(layout, before)


def test_hostile_names_are_unknown_models_everywhere_else(server, layout):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name in hostile_names(layout):
        path = f"/v2/models/{quote(name, safe='')}"
        infer = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
        for method, suffix in (("GET", ""), ("GET", "/config"), ("GET", "/ready"), ("POST", "/infer")):
            status, _, data = request(server.url, method, path + suffix, infer if method == "POST" else None)
            assert status in (400, 404), (name, suffix, data)
            if "/" in name:   # sent as %2F, decoded: a path with no route
                assert (status, error_of(data)) == (404, "Not Found"), (name, suffix)
            elif suffix == "/ready":   # readiness says only not ready, for any name it does not know
                assert (status, error_of(data)) == (400, "Model version not ready"), name
            else:
                assert (status, error_of(data)) == (404, f"Request for unknown model: '{name}' is not found"), \
                    (name, suffix)
        status, _, data = request(server.url, "GET", path + "/stats")
        if "/" not in name:
            assert (status, error_of(data)) == (400, f"requested model '{name}' is not available"), name
        for call in (client.get_model_metadata, client.get_model_config, client.get_inference_statistics):
            with pytest.raises(InferenceServerException) as failure:
                call(name)
            assert failure.value.status() in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT"), name
        assert client.is_model_ready(name) is False


def test_a_file_override_path_outside_the_model_is_refused(server, layout):
    before = snapshot(layout[0])
    for path in ("1/../../../../victim/evil.py", "/tmp/evil.py", "1/a\\b.py", "1/\0.py", "model.py", "1/./x"):
        parameters = {"config": scaled_config_json(2), f"file:{path}": base64.b64encode(b"x").decode()}
        status, _, data = request(server.url, "POST", "/v2/repository/models/fresh/load", {"parameters": parameters})
        assert status == 400, (path, data)
        assert error_of(data).startswith(f"failed to load 'fresh': file override 'file:{path}' must be"), data
    assert_nothing_written(layout, before)


def test_the_server_serves_after_hostile_names(server):
    status, _, data = request(server.url, "POST", "/v2/repository/models/fresh/load", {"parameters": override_parameters("fresh")})
    assert status == 200, data
    x = np.arange(4, dtype=np.float32)[None]
    tensor = grpcclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("fresh", [tensor])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
    assert json.loads(request(server.url, "GET", "/v2/models/fresh/config")[2])["name"] == "fresh"
