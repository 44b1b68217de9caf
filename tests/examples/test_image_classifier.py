"""examples/image_classifier: top-5 through Triton's classification extension."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from tests.examples.conftest import EXAMPLES, example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("image_classifier", tmp_path_factory) as running:
        yield running


def test_top5_matches_the_model_run_locally(server):
    image = np.random.default_rng(3).random((3, 32, 32), dtype=np.float32)
    answers = example_module("image_classifier", "client").top5(server.url, image)

    model = example_module("image_classifier", "build").classifier_graph()
    probabilities = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"INPUT": image[None]})[0][0]
    labels = (EXAMPLES / "image_classifier" / "model_repository" / "image_classifier" / "labels.txt").read_text()
    labels = labels.split()
    expected = np.argsort(-probabilities)[:5]
    assert [index for _, index, _ in answers] == list(expected)
    assert [label for _, _, label in answers] == [labels[i] for i in expected]
    np.testing.assert_allclose([score for score, _, _ in answers], probabilities[expected], rtol=1e-4)
