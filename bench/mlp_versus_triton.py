"""A compute-bound model served by tritium and by real Triton, against the same model in-process.

The batching-efficiency aim compares a served compute-bound MLP with the model run in-process
at batch 64. Real Triton here has only its Python backend, so this benchmark makes the MLP
(FP32 1024 -> 4096 -> 4096 -> 1024, ReLU, weights drawn from a fixed seed) a Python model doing
its matrix products in numpy, serves it from one repository with both servers (one CPU
instance, ``max_batch_size: 64``, ``max_queue_delay_microseconds: 20000`` so that every batch
is 64 rows), and drives each with perf_analyzer over HTTP at concurrency 64, the servers
alternating round by round. The in-process rate is the same numpy code at batch 64, measured
before and after the rounds. From each server's statistics: rows per batch and the model's
time per batch, so a cycle splits into the model's time and the rest (the 64 answers out and
the 64 next requests in). Writes ``bench/out/mlp_versus_triton.json``.

    python -m bench.mlp_versus_triton [--rounds 3] [--window-ms 5000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.harness import TritonServer, TritiumServer, save, table
from bench.versus_triton import perf_analyzer

MODEL = "mlp_numpy"
CONCURRENCY = 64

MODEL_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils

SIZES = (1024, 4096, 4096, 1024)


def weights():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)).astype(np.float32)
            for a, b in zip(SIZES, SIZES[1:])]


def forward(layers, x):
    for i, w in enumerate(layers):
        x = x @ w
        if i < len(layers) - 1:
            np.maximum(x, 0, out=x)
    return x


class TritonPythonModel:
    def initialize(self, args):
        self.layers = weights()

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        out = forward(self.layers, np.concatenate(inputs))
        responses, start = [], 0
        for x in inputs:
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out[start:start + len(x)])]))
            start += len(x)
        return responses
'''

CONFIG = '''\
backend: "python"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
'''


def repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    return root


def in_process_rows_per_s(batch: int = CONCURRENCY, seconds: float = 4.0) -> float:
    """The model's own code at ``batch`` rows, in this interpreter (the one tritium's instances use)."""
    namespace: dict = {}
    exec(MODEL_PY.split("class TritonPythonModel")[0].replace("import triton_python_backend_utils as pb_utils", ""),
         namespace)
    layers, forward = namespace["weights"](), namespace["forward"]
    x = np.ones((batch, 1024), np.float32)
    for _ in range(3):
        forward(layers, x)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        forward(layers, x)
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def model_counters(http_url: str) -> tuple[int, int, int]:
    """(executions, inferences, compute_infer ns summed over requests) from the statistics extension."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{MODEL}/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    return (int(stats["execution_count"]), int(stats["inference_count"]),
            int(stats["inference_stats"]["compute_infer"]["ns"]))


def served_round(http_url: str, window_ms: int) -> dict:
    before = model_counters(http_url)
    figures = perf_analyzer(http_url, "http", CONCURRENCY, window_ms, model=MODEL)
    executions, inferences, compute_ns = (after - first for after, first in zip(model_counters(http_url), before))
    # compute_infer is counted per request, each carrying its whole batch's time
    return {**figures, "rows_per_batch": inferences / max(1, executions),
            "model_ms_per_batch": compute_ns / max(1, inferences) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=5000)
    args = parser.parse_args()
    in_process = [in_process_rows_per_s()]
    rounds: dict[str, list[dict]] = {"tritium": [], "triton": []}
    with tempfile.TemporaryDirectory() as folder:
        repo = repository(Path(folder))
        servers = {"tritium": TritiumServer(repo), "triton": TritonServer(repo)}
        try:
            for number in range(args.rounds):
                for name, server in servers.items():
                    figures = served_round(server.url, args.window_ms)
                    rounds[name].append(figures)
                    print(f"round {number + 1} {name:8s}: {figures['throughput']:6.0f} rows/s, "
                          f"{figures['rows_per_batch']:.1f} rows per batch, model {figures['model_ms_per_batch']:.1f} ms "
                          f"per batch", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    in_process.append(in_process_rows_per_s())
    baseline = statistics.median(in_process)
    rows = []
    for name, figures in rounds.items():
        median = sorted(figures, key=lambda f: f["throughput"])[len(figures) // 2]
        cycle_ms = 1000 * median["rows_per_batch"] / median["throughput"]
        rows.append([name, " / ".join(f"{f['throughput']:.0f}" for f in figures), round(median["throughput"]),
                     f"{median['throughput'] / baseline:.2f}", f"{median['rows_per_batch']:.1f}",
                     f"{cycle_ms:.1f}", f"{median['model_ms_per_batch']:.1f}"])
    save("mlp_versus_triton", {"in_process_rows_per_s": in_process, "rounds": rounds, "rows": rows})
    print(f"in-process batch {CONCURRENCY}: " + " / ".join(f"{r:.0f}" for r in in_process) + " rows/s "
          f"({1000 * CONCURRENCY / baseline:.1f} ms per batch)")
    print(table(["server", "rounds rows/s", "median", "of in-process", "rows per batch", "cycle ms", "model ms"], rows))


if __name__ == "__main__":
    main()
