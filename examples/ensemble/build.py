"""Build the ensemble's ONNX step: the image classifier of examples/image_classifier.

    python examples/ensemble/build.py [--repository DIR]

Writes DIR/classifier/1/model.onnx (DIR defaults to this example's model_repository); the
pre- and post-processing steps are Python models and need no building.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _image_classifier_build():
    path = HERE.parent / "image_classifier" / "build.py"
    spec = importlib.util.spec_from_file_location("image_classifier_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(repository: Path) -> Path:
    return _image_classifier_build().build(repository, name="classifier")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=HERE / "model_repository")
    print("wrote", build(parser.parse_args().repository))
