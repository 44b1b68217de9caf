"""Benchmark 1 and 3 and 4: serving overhead of a Python-free light model, against real Triton.

tritium serves an ONNX add_sub (FP32 [16] x2, max_batch_size 64, dynamic batching, two CPU
instances); real Triton 2.51 (../shared/anchors) serves the equivalent Python-backend
add_sub with the same config; and tritium also serves that same Python model, for a
comparison of the same model.py on both. Both are driven by the same load generator (tritium perf)
at concurrency 1, 8 and 64, in one run; both servers stay up and are measured in turn,
level by level, for several rounds, and each figure is the median over the rounds (the
machine is shared and noisy; ratios from one run are what to compare). Also reported:

* added latency: tritium's p50 at concurrency 1 minus onnxruntime's own p50 in-process;
* CPU per request of each process (gateway, broker, instances) at concurrency 64.

    python -m bench.serving_overhead [--duration 5] [--no-triton] [--python-only] [--levels 1,8,64]

``--python-only --no-triton --levels 64`` is the quick check of the Python model's CPU per
request of each process role (an instance's figure falls with the average batch, printed
with it).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import CpuMeter, TritonServer, TritiumServer, save, table
from examples import models
from tritium.perf.run import run
from tritium.perf.workload import build_workload

CONFIG = """
max_batch_size: 64
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
         { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 2 } ]
"""

PYTHON_ADD_SUB = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
'''

LEVELS = (1, 8, 64)


def onnx_repository(root: Path) -> Path:
    models.add_sub(root / "add_sub" / "1" / "model.onnx")
    (root / "add_sub" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n' + CONFIG)
    return root


def python_repository(root: Path) -> Path:
    (root / "add_sub" / "1").mkdir(parents=True)
    (root / "add_sub" / "1" / "model.py").write_text(PYTHON_ADD_SUB)
    (root / "add_sub" / "config.pbtxt").write_text('backend: "python"\n' + CONFIG)
    return root


def measure_level(url: str, root: int, concurrency: int, duration_s: float) -> dict:
    """``root``: the server's first process; only its processes are metered (others may share the machine)."""
    host, port = url.rsplit(":", 1)
    workload, _ = build_workload(host, int(port), "add_sub")
    meter = CpuMeter((root,))
    meter.start()
    (report,) = run(workload, "add_sub", [concurrency], duration_s=duration_s, warmup_s=1.0)
    cpu = meter.stop()
    served = report.server.requests or 1
    return {**report.as_dict(),
            "cpu_us_per_request": {role: round(seconds / served * 1e6, 1) for role, seconds in sorted(cpu.items())}}


def median_level(samples: list[dict]) -> dict:
    """The round whose throughput is the median, with every round's throughput kept."""
    ordered = sorted(samples, key=lambda s: s["throughput"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["rounds_throughput"] = [round(s["throughput"]) for s in samples]
    return chosen


def in_process_p50_us(model_path: Path, samples: int = 5000) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path))
    feeds = {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
    for _ in range(200):
        session.run(None, feeds)
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        times.append(time.perf_counter_ns() - start)
    return sorted(times)[len(times) // 2] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per level")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per level; the median is kept")
    parser.add_argument("--no-triton", action="store_true", help="skip the real Triton run")
    parser.add_argument("--python-only", action="store_true", help="skip tritium serving the ONNX model")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels, comma-separated")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        servers = {}
        if not args.python_only:
            repo = onnx_repository(Path(folder) / "onnx")
            results["in_process_p50_us"] = in_process_p50_us(repo / "add_sub" / "1" / "model.onnx")
            servers["tritium"] = TritiumServer(repo)
        python_repo = python_repository(Path(folder) / "python")
        servers["tritium python"] = TritiumServer(python_repo)
        try:
            if not args.no_triton:
                servers["triton"] = TritonServer(python_repo)
            samples = {name: {c: [] for c in levels} for name in servers}
            for _ in range(args.rounds):
                for concurrency in levels:
                    for name, server in servers.items():
                        level = measure_level(server.url, server.process.pid, concurrency, args.duration)
                        samples[name][concurrency].append(level)
            for name in servers:
                results[name] = [median_level(samples[name][c]) for c in levels]
        finally:
            for server in servers.values():
                server.stop()
    save("serving_overhead", results)
    print(report(results))


def report(results: dict) -> str:
    rows = []
    for server in ("tritium", "tritium python", "triton"):
        for level in results.get(server, []):
            cpu = ", ".join(f"{k} {v}" for k, v in level["cpu_us_per_request"].items() if v >= 1)
            rows.append([server, level["concurrency"], round(level["throughput"]),
                         "/".join(str(r) for r in level["rounds_throughput"]),
                         round(level["p50_us"] / 1000, 2), round(level["p99_us"] / 1000, 2),
                         round(level["server"]["average_batch"], 1), level["errors"], cpu])
    lines = [table(["server", "concurrency", "req/s (median)", "each round", "p50 ms", "p99 ms",
                    "avg batch", "errors", "CPU us/request"], rows)]
    if "triton" in results:
        for name in ("tritium", "tritium python"):
            for ours, theirs in zip(results.get(name, []), results["triton"]):
                lines.append(f"concurrency {ours['concurrency']}: {name} (ONNX model)/triton throughput = "
                             f"{ours['throughput'] / theirs['throughput']:.2f}".replace(
                                 "tritium python (ONNX model)", "tritium (same model.py)"))
    if "tritium" not in results or results["tritium"][0]["concurrency"] != 1:
        return "\n".join(lines)
    p50 = results["tritium"][0]["p50_us"]
    lines.append(f"added latency at concurrency 1: {(p50 - results['in_process_p50_us']) / 1000:.3f} ms "
                 f"(tritium p50 {p50 / 1000:.3f} ms, onnxruntime in-process p50 "
                 f"{results['in_process_p50_us'] / 1000:.3f} ms)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
