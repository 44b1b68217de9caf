"""Train a scikit-learn classifier on generated data and save it for the Python backend.

    pip install scikit-learn
    python examples/sklearn_python/build.py [--repository DIR]

Writes DIR/iris_classifier/1/model.pkl (DIR defaults to this example's model_repository):
a logistic regression over 4 features and 3 classes, trained on points drawn around three
centres (no data set is downloaded).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

HERE = Path(__file__).resolve().parent
CENTRES = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]], dtype=np.float32)


def training_data(seed: int = 0, per_class: int = 50) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = np.concatenate([centre + rng.normal(0, 0.3, (per_class, 4)) for centre in CENTRES])
    labels = np.repeat(np.arange(len(CENTRES)), per_class)
    return features.astype(np.float32), labels


def build(repository: Path, name: str = "iris_classifier") -> Path:
    model = LogisticRegression(max_iter=500).fit(*training_data())
    path = repository / name / "1" / "model.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(model))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=HERE / "model_repository")
    print("wrote", build(parser.parse_args().repository))
