"""Build the text model's vocabulary: word weights for a bag-of-words sentiment score.

    python examples/text/build.py [--repository DIR]

Writes DIR/sentiment/1/weights.json (DIR defaults to this example's model_repository); the
model itself is DIR/sentiment/1/model.py, a Triton Python backend model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
POSITIVE = ("good", "great", "excellent", "fast", "love", "happy", "clear", "easy")
NEGATIVE = ("bad", "slow", "awful", "hate", "broken", "sad", "confusing", "hard")


def weights() -> dict[str, float]:
    return {**{word: 1.0 for word in POSITIVE}, **{word: -1.0 for word in NEGATIVE}}


def build(repository: Path, name: str = "sentiment") -> Path:
    path = repository / name / "1" / "weights.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(weights(), indent=1))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=HERE / "model_repository")
    print("wrote", build(parser.parse_args().repository))
