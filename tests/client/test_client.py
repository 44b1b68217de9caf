"""tritium.client against a real server: HTTP and gRPC behind one API, asyncio, streams, errors."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

import tritium.client
from tests.servers import PROJECT_ROOT, TritiumServer
from tritium.client.tensors import Endpoint

A = np.arange(16, dtype=np.float32)[None]
B = np.full((1, 16), 3, dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("client") / "models"
    shutil.copytree(PROJECT_ROOT / "examples" / "model_repository", repository)
    shutil.copytree(PROJECT_ROOT / "examples" / "streaming" / "model_repository" / "word_stream",
                    repository / "word_stream")
    with TritiumServer(repository) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def url(request, server):
    return f"http://{server.url}" if request.param == "http" else f"grpc://{server.grpc_url}"


def test_infer_takes_keywords_or_a_mapping_and_returns_arrays(url):
    with tritium.client.connect(url) as client:
        out = client.infer("add_sub", INPUT0=A, INPUT1=B)
        again = client.infer("add_sub", {"INPUT0": A}, INPUT1=B, version="1")
    assert set(out) == {"OUTPUT0", "OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)
    np.testing.assert_array_equal(again["OUTPUT0"], A + B)


def test_inputs_take_the_models_datatype(url):
    with tritium.client.connect(url) as client:
        out = client.infer("add_sub", INPUT0=A.astype(np.float64).tolist(), INPUT1=B.astype(np.int64))
    assert out["OUTPUT0"].dtype == np.float32
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)


def test_protocol_argument_chooses_grpc(server):
    with tritium.client.connect(server.grpc_url, protocol="grpc") as client:
        assert client.protocol == "grpc" and client.is_ready("add_sub")


def test_server_errors_carry_message_and_status(url):
    with tritium.client.connect(url) as client:
        with pytest.raises(tritium.client.InferenceError) as shape_error:
            client.infer("add_sub", INPUT0=A[:, :3], INPUT1=B[:, :3])
        with pytest.raises(tritium.client.InferenceError) as missing_model:
            client.infer("no_such_model", INPUT0=A)
    assert "unexpected shape for input 'INPUT1' for model 'add_sub'" in shape_error.value.message   # the last given, as Triton
    assert shape_error.value.status in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "no_such_model" in missing_model.value.message and missing_model.value.status


def test_an_unknown_input_name_is_named(url):
    with tritium.client.connect(url) as client, pytest.raises(tritium.client.InferenceError) as error:
        client.infer("add_sub", INPUT0=A, INPUT9=B)
    assert error.value.message == "model 'add_sub' has no input 'INPUT9'; its inputs: INPUT0, INPUT1"


def test_asyncio_client(url):
    async def run():
        async with tritium.client.connect_async(url) as client:
            return await asyncio.gather(*(client.infer("add_sub", INPUT0=A * i, INPUT1=B) for i in range(4)))

    for i, out in enumerate(asyncio.run(run())):
        np.testing.assert_array_equal(out["OUTPUT0"], A * i + B)


def test_streams_end_with_the_final_response(server):
    text = np.array([b"one two three"], dtype=object)
    with tritium.client.connect(f"grpc://{server.grpc_url}") as client:
        words = [out["WORD"][0] for out in client.stream("word_stream", TEXT=text)]
        single = list(client.stream("add_sub", INPUT0=A, INPUT1=B))
    assert words == [b"one", b"two", b"three"]
    assert len(single) == 1
    np.testing.assert_array_equal(single[0]["OUTPUT1"], A - B)


def test_async_stream_and_its_errors(server):
    async def run():
        async with tritium.client.connect_async(f"grpc://{server.grpc_url}") as client:
            words = [out["INDEX"][0] async for out in client.stream("word_stream", TEXT=np.array([b"a b c d"], object))]
            with pytest.raises(tritium.client.InferenceError) as error:
                async for _ in client.stream("add_sub", INPUT0=A[:, :2], INPUT1=B[:, :2]):
                    pass
            return words, error.value

    words, error = asyncio.run(run())
    assert words == [0, 1, 2, 3]
    assert "unexpected shape" in error.message


def test_streaming_needs_grpc(server):
    with tritium.client.connect(server.url) as client, pytest.raises(ValueError, match="streaming needs gRPC"):
        next(client.stream("word_stream", TEXT=np.array([b"x"], dtype=object)))


@pytest.mark.parametrize("url, protocol, expected", [
    ("localhost:8000", None, Endpoint("http", "localhost:8000")),
    ("http://h:1", None, Endpoint("http", "h:1")),
    ("grpc://h:8001", None, Endpoint("grpc", "h:8001")),
    ("h:8001", "grpc", Endpoint("grpc", "h:8001")),
])
def test_urls(url, protocol, expected):
    assert Endpoint.parse(url, protocol) == expected


@pytest.mark.parametrize("url, protocol", [("https://h:1", None), ("grpc://h:1", "http")])
def test_bad_urls(url, protocol):
    with pytest.raises(ValueError):
        Endpoint.parse(url, protocol)
