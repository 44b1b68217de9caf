"""Inference over HTTP through real processes, with tritonclient (JSON and binary) and curl-like raw HTTP."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.models import ALL_TYPES, add_sub_model, all_types_model
from tests.servers import TritiumServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8)
    add_sub_model(repo, "add_sub_nobatch", max_batch_size=0)
    (repo / "add_sub_nobatch" / "config.pbtxt").write_text(
        (repo / "add_sub_nobatch" / "config.pbtxt").read_text().replace("dims: [ 16 ]", "dims: [ -1, 16 ]"))
    all_types_model(repo)
    with TritiumServer(repo) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url)


def _add_sub_inputs(a, b, binary=True):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
              httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_returns_sum_and_difference(client, binary):
    a = np.arange(48, dtype=np.float32).reshape(3, 16) / 7
    b = np.full((3, 16), 0.1, dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = client.infer("add_sub", _add_sub_inputs(a, b, binary), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"
    assert "id" not in response


def test_request_id_is_echoed_and_outputs_can_be_selected(client):
    a = np.ones((1, 16), dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a), request_id="req-42",
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    response = result.get_response()
    assert response["id"] == "req-42"
    assert [o["name"] for o in response["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))
    assert result.as_numpy("OUTPUT0") is None


def test_explicit_version_and_non_batching_model(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    result = client.infer("add_sub_nobatch", _add_sub_inputs(a, a), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def _all_types_arrays(rows=2):
    arrays = {}
    for name, dtype in ALL_TYPES.items():
        if name == "BYTES":
            values = [b"tritium", b"", "\u00e9t\u00e9".encode(), b"x" * 300]
            arrays[name] = np.array([values[i % 4] for i in range(rows * 3)], dtype=np.object_).reshape(rows, 3)
        elif name == "BOOL":
            arrays[name] = (np.arange(rows * 3) % 2 == 0).reshape(rows, 3)
        elif name.startswith("FP"):
            arrays[name] = (np.arange(rows * 3, dtype=dtype) - 2.5).reshape(rows, 3)
        else:
            info = np.iinfo(dtype)
            arrays[name] = np.array([info.min, info.max, 7, 0, 1, info.max - 1][: rows * 3],
                                    dtype=dtype).reshape(rows, 3)
    return arrays


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(client, binary):
    arrays = _all_types_arrays()
    inputs, outputs = [], []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(f"IN_{name}", list(array.shape), name)
        # FP16 cannot travel as JSON (Triton's rule), so it always goes binary.
        tensor.set_data_from_numpy(array, binary_data=binary or name == "FP16")
        inputs.append(tensor)
        outputs.append(httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=binary or name == "FP16"))
    result = client.infer("all_types", inputs, outputs=outputs)
    for name, array in arrays.items():
        returned = result.as_numpy(f"OUT_{name}")
        if name == "BYTES" and not binary:
            returned = np.array([s.encode() if isinstance(s, str) else s for s in returned.ravel()],
                                dtype=np.object_).reshape(returned.shape)
        assert returned.dtype == array.dtype or name == "BYTES", name
        np.testing.assert_array_equal(returned, array, err_msg=name)


def test_nan_and_infinities_travel_as_json_as_triton_writes_them(client, server):
    # Triton's JSON reader takes NaN, Infinity and -Infinity, and its writer sends them back so
    # (Python's json reads them); orjson alone would refuse them, and write null.
    arrays = _all_types_arrays(rows=1)
    arrays["FP32"] = np.array([[np.nan, np.inf, -np.inf]], np.float32)
    arrays["FP64"] = np.array([[-np.inf, 0.5, np.nan]], np.float64)
    inputs, outputs = [], []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(f"IN_{name}", list(array.shape), name)
        tensor.set_data_from_numpy(array, binary_data=name == "FP16")
        inputs.append(tensor)
        outputs.append(httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=name == "FP16"))
    result = client.infer("all_types", inputs, outputs=outputs)
    for name in ("FP32", "FP64"):
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{name}"), arrays[name], err_msg=name)
    row = "[NaN, Infinity, -Infinity" + ", 1.5" * 13 + "]"
    raw = ('{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": %s}, '
           '{"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [%s]}]}' % (row, ", ".join(["0"] * 16)))
    with urllib.request.urlopen(urllib.request.Request(f"http://{server.url}/v2/models/add_sub/infer",
                                                       data=raw.encode())) as response:
        answer = response.read()
    assert b'"name":"OUTPUT0","datatype":"FP32","shape":[1,16],"data":[NaN,Infinity,-Infinity,1.5,' in answer


def test_a_json_body_of_megabytes_is_answered_in_full(client):
    # Over a megabyte of JSON values is decoded off the event loop (gateway/offload.py).
    arrays = _all_types_arrays(rows=1)
    arrays["BYTES"] = np.array([str(i).encode() for i in range(200_000)], dtype=np.object_).reshape(1, -1)
    arrays["INT32"] = np.arange(100_000, dtype=np.int32).reshape(1, -1)
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(f"IN_{name}", list(array.shape), name)
        tensor.set_data_from_numpy(array, binary_data=name == "FP16")
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=True) for name in arrays]
    result = client.infer("all_types", inputs, outputs=outputs)
    for name, array in arrays.items():
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{name}"), array, err_msg=name)


def test_fp32_json_output_prints_the_double_it_widens_to(server):
    import json
    import urllib.request

    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.1] * 16},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}],
            "outputs": [{"name": "OUTPUT0"}]}
    request = urllib.request.Request(f"http://{server.url}/v2/models/add_sub/infer",
                                     data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request) as response:
        assert response.headers["Content-Type"] == "application/json"
        text = response.read().decode()
    assert '"data":[0.10000000149011612,' in text
    assert text.startswith('{"model_name":"add_sub","model_version":"1","outputs":')


def test_model_error_is_reported_and_server_keeps_serving(client):
    a = np.ones((9, 16), dtype=np.float32)  # above max_batch_size 8
    with pytest.raises(InferenceServerException) as error:
        client.infer("add_sub", _add_sub_inputs(a, a))
    assert "inference request batch-size must be <= 8 for 'add_sub'" in str(error.value)
    b = np.ones((8, 16), dtype=np.float32)
    np.testing.assert_array_equal(client.infer("add_sub", _add_sub_inputs(b, b)).as_numpy("OUTPUT0"), 2 * b)
