"""examples/ensemble: Python pre-processing, an ONNX model and Python post-processing in one request."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from tests.examples.conftest import EXAMPLES, example_module, serve_example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve_example("ensemble", tmp_path_factory) as running:
        yield running


def test_label_and_score_match_the_steps_run_locally(server):
    images = np.random.default_rng(11).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    answers = example_module("ensemble", "client").classify(server.url, images)

    model = example_module("image_classifier", "build").classifier_graph()
    pixels = (images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2)
    probabilities = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"INPUT": pixels})[0]
    labels = (EXAMPLES / "ensemble" / "model_repository" / "postprocess" / "labels.txt").read_text().split()
    assert [label for label, _ in answers] == [labels[i] for i in probabilities.argmax(axis=1)]
    np.testing.assert_allclose([score for _, score in answers], probabilities.max(axis=1), rtol=1e-4)
