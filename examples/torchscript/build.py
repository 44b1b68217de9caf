"""Build a TorchScript model: a two-layer perceptron, scripted and saved as model.pt.

    pip install "tritium[torch]"
    python examples/torchscript/build.py [--repository DIR]

Writes DIR/torch_mlp/1/model.pt (DIR defaults to this example's model_repository).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class Perceptron(torch.nn.Module):
    """8 features -> 16 hidden (ReLU) -> 4 scores."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def perceptron(seed: int = 0) -> torch.jit.ScriptModule:
    torch.manual_seed(seed)
    return torch.jit.script(Perceptron().eval())


def build(repository: Path, name: str = "torch_mlp") -> Path:
    path = repository / name / "1" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    perceptron().save(str(path))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=HERE / "model_repository")
    print("wrote", build(parser.parse_args().repository))
