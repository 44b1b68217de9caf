"""Score the sentiment of a few sentences: strings in, strings out, through tritium.client.

    python examples/text/client.py [--url localhost:8000]
"""

from __future__ import annotations

import argparse

import numpy as np

import tritium.client

SENTENCES = ["The new release is great and fast", "Setup was slow and confusing", "It runs on Tuesdays"]


def sentiment(url: str, sentences: list[str]) -> list[tuple[str, float]]:
    """(label, score) of each sentence."""
    texts = np.array([[s.encode()] for s in sentences], dtype=object)  # BYTES: one string per row
    with tritium.client.connect(url) as client:
        out = client.infer("sentiment", TEXT=texts)
    return [(label.decode(), float(score)) for label, score in zip(out["LABEL"][:, 0], out["SCORE"][:, 0])]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8000")
    for sentence, (label, score) in zip(SENTENCES, sentiment(parser.parse_args().url, SENTENCES)):
        print(f"{label:>8}  {score:+.2f}  {sentence}")
