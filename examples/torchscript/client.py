"""Score a batch of two rows with the TorchScript model, over gRPC, through tritium.client.

    python examples/torchscript/client.py [--url grpc://localhost:8001]
"""

from __future__ import annotations

import argparse

import numpy as np

import tritium.client


def score(url: str, rows: np.ndarray) -> np.ndarray:
    with tritium.client.connect(url) as client:
        return client.infer("torch_mlp", INPUT__0=rows)["OUTPUT__0"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="grpc://localhost:8001")
    rows = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    print(score(parser.parse_args().url, rows))
