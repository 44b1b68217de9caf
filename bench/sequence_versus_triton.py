"""Stateful Python models under Triton's sequence batcher, served by tritium and by real Triton.

Two models of the test suite's sequence repository (tests/e2e/sequence_repo): ``py_accumulator``
(the direct strategy, ``max_batch_size: 8``, START/END/READY/CORRID control inputs, a running
sum per sequence kept by the model) and ``py_state`` (the oldest strategy, ``max_batch_size: 4``,
implicit state carried by the server from one request of a sequence to the next). perf_analyzer
drives each over gRPC at concurrency 8 (eight sequences at a time, 20 requests each, as it makes
them for a model with sequence batching), the servers alternating round by round. Writes
``bench/out/sequence_versus_triton.json`` and the plot (docs/sequence_versus_triton.png).

    python -m bench.sequence_versus_triton [--rounds 3] [--window-ms 3000]
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.harness import ROOT
from bench.versus_triton import models_versus_triton

MODELS = ("py_accumulator", "py_state")
CONCURRENCY = 8
SOURCE = ROOT / "tests" / "e2e" / "sequence_repo"


def repository(root: Path) -> Path:
    for model in MODELS:
        shutil.copytree(SOURCE / model, root / model)
    return root


def main() -> None:
    models_versus_triton("sequence_versus_triton", __doc__, repository, MODELS, ("grpc",), CONCURRENCY, "sequences")


if __name__ == "__main__":
    main()
