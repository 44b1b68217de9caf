"""An ensemble of two Python models, served by tritium and by real Triton.

Two copies of the Python add_sub (``max_batch_size: 64``, ``dynamic_batching {}``, one CPU
instance each) chained by an ensemble ``pair``: the first step's two outputs are the second's
two inputs, the second's outputs the ensemble's. Both servers serve it from one repository;
perf_analyzer drives each over HTTP at concurrency 16 and 64, the servers alternating round by
round. Reported per scenario: each server's median throughput and p50 latency, and the first
step's average batch (its ``inference_count / execution_count`` over the round). Writes
``bench/out/ensemble_versus_triton.json`` and the plot (docs/ensemble_versus_triton.png).

    python -m bench.ensemble_versus_triton [--rounds 3] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from functools import partial
from pathlib import Path

from bench.harness import (
    ROOT,
    VERSUS_HEADERS,
    alternating_rounds,
    compared,
    save,
    table,
    tritium_and_triton,
    versus_plot,
    versus_row,
)
from bench.serving_overhead import PYTHON_ADD_SUB
from bench.versus_triton import perf_analyzer

MODEL = "pair"
CONCURRENCIES = (16, 64)
TENSORS = """
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
         { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
"""
STEP = 'backend: "python"\nmax_batch_size: 64\n' + TENSORS + \
    'dynamic_batching { }\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n'
ENSEMBLE = 'platform: "ensemble"\nmax_batch_size: 64\n' + TENSORS + """
ensemble_scheduling { step [
  { model_name: "first" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
    output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "difference" } },
  { model_name: "second" model_version: -1
    input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "difference" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
"""


def repository(root: Path) -> Path:
    for step in ("first", "second"):
        (root / step / "1").mkdir(parents=True)
        (root / step / "1" / "model.py").write_text(PYTHON_ADD_SUB)
        (root / step / "config.pbtxt").write_text(STEP)
    (root / MODEL / "1").mkdir(parents=True)   # an ensemble's version folder is empty
    (root / MODEL / "config.pbtxt").write_text(ENSEMBLE)
    return root


def first_step_counts(http_url: str) -> tuple[int, int]:
    """(executions, inferences) of the first step, from the statistics extension."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/first/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_count"])


def measured_round(http_url: str, concurrency: int, window_ms: int) -> dict:
    before = first_step_counts(http_url)
    figures = perf_analyzer(http_url, "http", concurrency, window_ms, model=MODEL)
    executions, inferences = (after - first for after, first in zip(first_step_counts(http_url), before))
    return {**figures, "first_step_batch": inferences / max(1, executions)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "ensemble_versus_triton.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = repository(Path(folder))
        with tritium_and_triton(repo) as servers:
            rounds = alternating_rounds(
                servers, {f"http c={c}": partial(lambda server, c: measured_round(server.url, c, args.window_ms), c=c)
                          for c in CONCURRENCIES}, args.rounds,
                lambda f: f"{f['throughput']:6.0f} infer/s, p50 {f['p50_us']:6.0f} us, "
                          f"first step's batch {f['first_step_batch']:.1f}")
    rows = [versus_row(scenario, ours, theirs) + [f"{theirs['first_step_batch']:.1f}",
                                                   f"{ours['first_step_batch']:.1f}"]
            for scenario, ours, theirs in compared(rounds, ("throughput", "p50_us", "first_step_batch"))]
    save("ensemble_versus_triton", {"rounds": rounds, "rows": rows})
    print(table(["scenario", *VERSUS_HEADERS, "Triton first step's batch", "tritium first step's batch"], rows))
    versus_plot(args.plot, rows, "ensemble pair")
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
