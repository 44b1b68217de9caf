"""Build the image classifier: a small convolutional network written as an ONNX graph.

    python examples/image_classifier/build.py [--repository DIR]

Writes DIR/image_classifier/1/model.onnx (DIR defaults to this example's model_repository).
The weights are random but fixed (seeded): the point is the serving, not the accuracy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
CLASSES = 10
SIZE = 32  # images are 3 x SIZE x SIZE, values in [0, 1]


def classifier_graph(seed: int = 0) -> onnx.ModelProto:
    """conv 3->8 (3x3) -> relu -> conv 8->16 (3x3, stride 2) -> relu -> global average pool -> linear -> softmax."""
    rng = np.random.default_rng(seed)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)

    initializers = [weight("w1", 8, 3, 3, 3), weight("b1", 8), weight("w2", 16, 8, 3, 3), weight("b2", 16),
                    weight("w3", 16, CLASSES), weight("b3", CLASSES)]
    nodes = [
        helper.make_node("Conv", ["INPUT", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"]),
        helper.make_node("Gemm", ["features", "w3", "b3"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "image_classifier",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, ["batch", CLASSES])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build(repository: Path, name: str = "image_classifier") -> Path:
    path = repository / name / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(classifier_graph(), str(path))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=HERE / "model_repository")
    print("wrote", build(parser.parse_args().repository))
