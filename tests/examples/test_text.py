"""examples/text: strings in and out (BYTES) through the Python backend."""

from __future__ import annotations

import pytest

from tests.examples.conftest import example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("text", tmp_path_factory) as running:
        yield running


def test_each_sentence_gets_its_label_and_score(server):
    client = example_module("text", "client")
    answers = client.sentiment(server.url, client.SENTENCES + ["héllo wörld"])
    assert answers == [("positive", pytest.approx(2 / 7)), ("negative", pytest.approx(-2 / 5)),
                       ("neutral", 0.0), ("neutral", 0.0)]
