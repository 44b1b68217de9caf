"""examples/sklearn_python: a scikit-learn model through the Python backend."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.examples.conftest import example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("sklearn_python", tmp_path_factory) as running:
        yield running


def test_served_probabilities_are_the_pickled_models(server):
    client = example_module("sklearn_python", "client")
    answer = client.classify(server.url, client.FLOWERS)
    model = pickle.loads((server.repository / "iris_classifier" / "1" / "model.pkl").read_bytes())
    np.testing.assert_allclose(answer["PROBABILITIES"], model.predict_proba(client.FLOWERS), rtol=1e-5)
    assert answer["LABEL"][:, 0].tolist() == [0, 1, 2]
