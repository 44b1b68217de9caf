"""System shared memory: regions registered over HTTP and gRPC, inputs read from and
outputs written to them, by any of the gateway processes, and clear errors."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model
from tests.servers import TritiumServer

A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 0.5, dtype=np.float32)
BYTES = A.nbytes  # 64


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo)
    # Two gateways share the ports: a region registered through one is used through the other.
    with TritiumServer(repo, "--allow-client-shm=true", http_workers=2) as running:
        yield running


class Regions:
    """Shared memory regions made for one test, destroyed after it."""

    def __init__(self) -> None:
        self.handles = []

    def make(self, size: int):
        key = f"/tritium-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key, key, size)
        self.handles.append(handle)
        return key, handle

    def close(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(server):
    made = Regions()
    yield made
    request(server.url, "POST", "/v2/systemsharedmemory/unregister")
    made.close()


def test_http_inputs_and_outputs_in_shared_memory(server, regions):
    client = httpclient.InferenceServerClient(server.url)
    in_key, in_handle = regions.make(2 * BYTES)
    out_key, out_handle = regions.make(2 * BYTES)
    shm.set_shared_memory_region(in_handle, [A, B])
    client.register_system_shared_memory("in", in_key, 2 * BYTES)
    client.register_system_shared_memory("out", out_key, 2 * BYTES)
    assert sorted(r["name"] for r in client.get_system_shared_memory_status()) == ["in", "out"]
    assert client.get_system_shared_memory_status("in") == [
        {"name": "in", "key": in_key, "offset": 0, "byte_size": 2 * BYTES}]

    for _ in range(6):  # new connections land on either gateway
        fresh = httpclient.InferenceServerClient(server.url)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory("in", BYTES)
        inputs[1].set_shared_memory("in", BYTES, offset=BYTES)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", BYTES)
        outputs[1].set_shared_memory("out", BYTES, offset=BYTES)
        result = fresh.infer("add_sub", inputs, outputs=outputs)
        assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 16]), A + B)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 16], offset=BYTES),
                                      A - B)
        fresh.close()

    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["out"]


def test_grpc_mixes_shared_memory_and_raw_tensors(server, regions):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    in_key, in_handle = regions.make(BYTES)
    out_key, out_handle = regions.make(BYTES)
    shm.set_shared_memory_region(in_handle, [B])
    client.register_system_shared_memory("g_in", in_key, BYTES)
    client.register_system_shared_memory("g_out", out_key, BYTES)
    status = client.get_system_shared_memory_status()
    assert status.regions["g_in"].key == in_key and status.regions["g_in"].byte_size == BYTES

    raw = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    raw.set_data_from_numpy(A)
    shared = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    shared.set_shared_memory("g_in", BYTES)
    out0 = grpcclient.InferRequestedOutput("OUTPUT0")
    out0.set_shared_memory("g_out", BYTES)
    out1 = grpcclient.InferRequestedOutput("OUTPUT1")
    result = client.infer("add_sub", [raw, shared], outputs=[out0, out1])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 16]), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)

    with pytest.raises(InferenceServerException) as failure:
        client.register_system_shared_memory("g_in", in_key, BYTES)
    assert "shared memory region 'g_in' already in manager" in failure.value.message()
    client.unregister_system_shared_memory()
    assert len(client.get_system_shared_memory_status().regions) == 0


def infer_body(input1_parameters: dict, output_parameters: dict | None = None) -> dict:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": A.ravel().tolist()},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "parameters": input1_parameters}]}
    if output_parameters is not None:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": output_parameters}]
    return body


def test_bad_regions_and_references_are_clear_errors(server, regions, tmp_path):
    key, handle = regions.make(BYTES)
    shm.set_shared_memory_region(handle, [B])
    register = "/v2/systemsharedmemory/region/{}/register"
    cases = [
        (register.format("x"), {"offset": 0, "byte_size": 8}, 400, "Shared memory register request has no 'key' field"),
        (register.format("x"), {"key": key}, 400, "Shared memory register request has no 'byte_size' field"),
        (register.format("x"), {"key": "/no-such-region", "byte_size": 8}, 400,
         "Unable to open shared memory region: '/no-such-region'"),
        (register.format("x"), {"key": key, "offset": 32, "byte_size": BYTES}, 400,
         "failed to register shared memory region 'x': invalid args"),   # (Triton's words)
        ("/v2/systemsharedmemory/register", {"key": key, "byte_size": 8}, 400,
         "'region name' is necessary to register system shared memory region"),
    ]
    # a link in /dev/shm is not followed (as shm_open opens), a FIFO not opened
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * BYTES)
    link, fifo = f"/tritium-test-link-{uuid.uuid4().hex[:8]}", f"/tritium-test-fifo-{uuid.uuid4().hex[:8]}"
    try:
        os.symlink(secret, f"/dev/shm{link}")
        os.mkfifo(f"/dev/shm{fifo}")
        for name in (link, fifo):
            cases.append((register.format("x"), {"key": name, "byte_size": 8}, 400,
                          f"Unable to open shared memory region: '{name}'"))
        for path, body, status, message in cases:
            got, _, data = request(server.url, "POST", path, body)
            assert (got, error_of(data)) == (status, message), path
    finally:
        for name in (link, fifo):
            if os.path.lexists(f"/dev/shm{name}"):
                os.unlink(f"/dev/shm{name}")
    assert request(server.url, "POST", register.format("r"), {"key": key, "byte_size": BYTES})[0] == 200
    assert request(server.url, "GET", register.format("r"))[0] == 405

    infer = "/v2/models/add_sub/infer"
    bad = [
        (infer_body({"shared_memory_region": "zz", "shared_memory_byte_size": BYTES}), 404,
         "Unable to find shared memory region: 'zz'"),
        (infer_body({"shared_memory_region": "r", "shared_memory_byte_size": BYTES, "shared_memory_offset": 8}), 400,
         "Invalid offset + byte size for shared memory region: 'r'"),
        (infer_body({"shared_memory_region": "r", "shared_memory_byte_size": 32}), 400,
         "input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 32"),
        (infer_body({"shared_memory_region": "r", "shared_memory_byte_size": BYTES},
                    {"shared_memory_region": "r", "shared_memory_byte_size": 16}), 400,
         "shared memory size specified with the request for output 'OUTPUT0' (16 bytes) should be at least 64 "
         "bytes to hold the results"),
    ]
    for body, status, message in bad:
        got, _, data = request(server.url, "POST", infer, body)
        assert got == status and message in error_of(data), (got, data)
    got, _, data = request(server.url, "POST", infer,
                           infer_body({"shared_memory_region": "r", "shared_memory_byte_size": BYTES}))
    assert got == 200
    assert request(server.url, "GET", "/v2/systemsharedmemory/region/nope/status")[0] == 404
    assert request(server.url, "GET", "/v2/cudasharedmemory/status")[2] == b"[]"
    status, _, data = request(server.url, "GET", "/v2/cudasharedmemory/region/x/status")   # none can exist
    assert (status, error_of(data)) == (404, "Unable to find cuda shared memory region: 'x'")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as missing:
        client.get_cuda_shared_memory_status("x")
    assert (missing.value.status(), missing.value.message()) == (
        "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'x'")
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.close()


def test_a_region_shrunk_by_its_client_is_refused_and_the_server_serves_on(server, regions):
    # Read or written through a mapping, the bytes past the object's new end would kill the
    # gateway (SIGBUS) and every client's requests with it.
    in_key, in_handle = regions.make(BYTES)
    out_key, _ = regions.make(BYTES)
    shm.set_shared_memory_region(in_handle, [B])
    for name, key in (("shrunk_in", in_key), ("shrunk_out", out_key)):
        assert request(server.url, "POST", f"/v2/systemsharedmemory/region/{name}/register",
                       {"key": key, "byte_size": BYTES})[0] == 200
    infer = "/v2/models/add_sub/infer"
    reading = infer_body({"shared_memory_region": "shrunk_in", "shared_memory_byte_size": BYTES})
    plain = {"datatype": "FP32", "shape": [1, 16], "data": A.ravel().tolist()}
    writing = {"inputs": [{"name": "INPUT0", **plain}, {"name": "INPUT1", **plain}],
               "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "shrunk_out",
                                                              "shared_memory_byte_size": BYTES}}]}
    assert request(server.url, "POST", infer, reading)[0] == 200
    for key in (in_key, out_key):
        os.truncate(f"/dev/shm/{key.lstrip('/')}", 16)
    for body, name, key in ((reading, "shrunk_in", in_key), (writing, "shrunk_out", out_key)):
        for _ in range(2):   # new connections: one gateway or the other
            got, _, data = request(server.url, "POST", infer, body)
            assert (got, error_of(data)) == (400, f"shared memory region '{name}' is smaller than when it was "
                                                  f"registered: its object '{key}' no longer holds {BYTES} bytes")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_model_ready("add_sub")
    raw = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor, array in zip(raw, (A, B)):
        tensor.set_data_from_numpy(array)
    np.testing.assert_array_equal(client.infer("add_sub", raw).as_numpy("OUTPUT0"), A + B)


def test_client_shared_memory_is_off_by_default(tmp_path_factory):
    # Checked on a server started without --allow-client-shm, as Triton since 2.69.
    repo = tmp_path_factory.mktemp("off")
    add_sub_model(repo)
    with TritiumServer(repo) as off:
        status, _, data = request(off.url, "POST", "/v2/systemsharedmemory/region/r/register",
                                  {"key": "/x", "byte_size": 8})
        assert (status, error_of(data)) == (
            501, "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.")
        assert request(off.url, "GET", "/v2/systemsharedmemory/status")[2] == b"[]"
