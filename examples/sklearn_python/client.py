"""Classify three flowers with the scikit-learn model, through tritium.client.

    python examples/sklearn_python/client.py [--url localhost:8000]
"""

from __future__ import annotations

import argparse

import numpy as np

import tritium.client

FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.0, 2.9, 4.5, 1.5], [6.9, 3.1, 5.4, 2.1]], dtype=np.float32)


def classify(url: str, features: np.ndarray) -> dict[str, np.ndarray]:
    with tritium.client.connect(url) as client:
        return client.infer("iris_classifier", FEATURES=features)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8000")
    answer = classify(parser.parse_args().url, FLOWERS)
    for label, probabilities in zip(answer["LABEL"][:, 0], answer["PROBABILITIES"]):
        print(f"class {label}  probabilities {np.round(probabilities, 3)}")
