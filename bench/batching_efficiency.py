"""Benchmark 2: batching efficiency on a compute-bound model.

A ReLU MLP (FP32 1024 -> 4096 -> 4096 -> 1024, about 100 MB, generated here) is served
with max_batch_size 64 and dynamic batching, one instance, and loaded at concurrency 64
with one row per request. The figure of merit is served rows/s over the rows/s of
onnxruntime in-process at batch 64, measured in the same run: only real batching gets
close, since in-process batch 64 is several times batch 1.

    python bench/batching_efficiency.py [--duration 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import CpuMeter, TritiumServer, bar_charts, save, table
from examples import models
from tritium.perf.run import run
from tritium.perf.workload import build_workload

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


def in_process_rows_per_s(model: Path, batch: int, seconds: float = 5.0) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model))
    feeds = {"INPUT0": np.random.default_rng(0).standard_normal((batch, 1024)).astype(np.float32)}
    for _ in range(3):
        session.run(None, feeds)
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, feeds)
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--plot", type=Path,
                        default=Path(__file__).resolve().parent.parent / "docs" / "batching_efficiency.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        model = models.mlp(repo / "mlp" / "1" / "model.onnx")
        (repo / "mlp" / "config.pbtxt").write_text(CONFIG)
        results = {"in_process_rows_per_s": {b: in_process_rows_per_s(model, b) for b in (1, 8, 32, 64)}}
        with TritiumServer(repo, ready_timeout_s=180) as server:
            host, port = server.url.rsplit(":", 1)
            workload, _ = build_workload(host, int(port), "mlp")
            meter = CpuMeter()
            meter.start()
            (level,) = run(workload, "mlp", [64], duration_s=args.duration, warmup_s=2.0)
            results["cpu_s"] = meter.stop()
            results["served"] = level.as_dict()
    served = results["served"]["inferences_per_s"]
    in_process = results["in_process_rows_per_s"]
    results["ratio_to_in_process_batch64"] = served / in_process[64]
    save("batching_efficiency", results)
    print(table(["", "rows/s"], [
        ["onnxruntime in-process, batch 1", round(in_process[1])],
        ["onnxruntime in-process, batch 8", round(in_process[8])],
        ["onnxruntime in-process, batch 32", round(in_process[32])],
        ["onnxruntime in-process, batch 64", round(in_process[64])],
        [f"tritium served, concurrency 64 (avg batch {results['served']['server']['average_batch']:.1f})",
         round(served)],
    ]))
    print(f"served / in-process batch 64 = {results['ratio_to_in_process_batch64']:.2f}; "
          f"in-process batch 64 / batch 1 = {in_process[64] / in_process[1]:.1f}")
    average_batch = results["served"]["server"]["average_batch"]
    labels = [f"in-process\nbatch {size}" for size in (1, 8, 32, 64)] + [f"served, c=64\n(avg batch {average_batch:.0f})"]
    bar_charts(args.plot, [(labels, {"rows/s": [in_process[1], in_process[8], in_process[32], in_process[64], served]},
                            "rows/s", "Compute-bound MLP: served against onnxruntime in-process")])
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
