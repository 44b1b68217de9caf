"""Send raw 8-bit images to the ensemble and read back a label per image, through tritium.client.

    python examples/ensemble/client.py [--url localhost:8000]
"""

from __future__ import annotations

import argparse

import numpy as np

import tritium.client


def classify(url: str, images: np.ndarray) -> list[tuple[str, float]]:
    """(label, score) of each 32x32x3 uint8 image."""
    with tritium.client.connect(url) as client:
        out = client.infer("classify_image", IMAGE=images)
    return [(label.decode(), float(score)) for label, score in zip(out["LABEL"][:, 0], out["SCORE"][:, 0])]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8000")
    images = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    for label, score in classify(parser.parse_args().url, images):
        print(f"{label}  {score:.4f}")
