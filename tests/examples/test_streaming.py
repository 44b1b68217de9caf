"""examples/streaming: a decoupled model's responses over a gRPC stream, sync and asyncio."""

from __future__ import annotations

import asyncio

import pytest

from tests.examples.conftest import example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("streaming", tmp_path_factory) as running:
        yield running


def test_one_response_per_word(server):
    client = example_module("streaming", "client")
    assert client.words(f"grpc://{server.grpc_url}", client.TEXT) == client.TEXT.split()
    assert asyncio.run(client.words_async(f"grpc://{server.grpc_url}", "a b")) == ["a", "b"]
