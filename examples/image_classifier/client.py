"""Ask the image classifier for the top 5 classes of an image, with Triton's classification extension.

    python examples/image_classifier/client.py [--url localhost:8000]

Each answer is Triton's "score:index:label" string, best first.
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.http as httpclient


def top5(url: str, image: np.ndarray) -> list[tuple[float, int, str]]:
    """(score, class index, label) of the 5 best classes of one 3x32x32 image."""
    client = httpclient.InferenceServerClient(url)
    try:
        batch = image[None].astype(np.float32)
        request = httpclient.InferInput("INPUT", list(batch.shape), "FP32")
        request.set_data_from_numpy(batch)
        wanted = httpclient.InferRequestedOutput("PROBABILITIES", class_count=5)
        result = client.infer("image_classifier", [request], outputs=[wanted])
        answers = []
        for item in result.as_numpy("PROBABILITIES")[0]:
            score, index, label = item.decode().split(":", 2)
            answers.append((float(score), int(index), label))
        return answers
    finally:
        client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8000")
    picture = np.random.default_rng(7).random((3, 32, 32), dtype=np.float32)
    for score, index, label in top5(parser.parse_args().url, picture):
        print(f"{score:.4f}  {index}  {label}")
