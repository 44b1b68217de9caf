"""Benchmark 2: batching efficiency on a compute-bound model.

A ReLU MLP (FP32 1024 -> 4096 -> 4096 -> 1024, about 100 MB, generated here) is served
with max_batch_size 64 and dynamic batching, one instance, and loaded at concurrency 64
with one row per request. The figure of merit is served rows/s over the rows/s of
onnxruntime in-process at batch 64, measured in the same run: only real batching gets
close, since in-process batch 64 is several times batch 1.

The model is served twice, in turn round by round: with ``dynamic_batching { }``, where a
batch leaves as soon as the instance is free (in a closed loop two groups of clients then
alternate, about 32 rows a batch), and with a queue delay longer than one batch, where a
batch waits for the clients still on their way and leaves at 64 rows.

    python bench/batching_efficiency.py [--duration 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
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

# The served models: name -> dynamic_batching block.
BATCHING = {
    "mlp": "dynamic_batching { }",
    "mlp_queue_delay": "dynamic_batching { max_queue_delay_microseconds: 20000 }",
}


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


def write_repository(repo: Path) -> Path:
    """Both served models, one ONNX file; returns its path."""
    model = models.mlp(repo / "mlp" / "1" / "model.onnx")
    for name, batching in BATCHING.items():
        version = repo / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        if not (version / "model.onnx").exists():
            (version / "model.onnx").symlink_to(model)
        (repo / name / "config.pbtxt").write_text(CONFIG.replace("dynamic_batching { }", batching))
    return model


def serve_in_turn(repo: Path, rounds: int, duration_s: float) -> dict:
    """Each model at concurrency 64, alternating, ``rounds`` times; the runs and the servers' CPU."""
    runs: dict[str, list[dict]] = {name: [] for name in BATCHING}
    with TritiumServer(repo, ready_timeout_s=300) as server:
        host, port = server.url.rsplit(":", 1)
        meter = CpuMeter()
        meter.start()
        for round_ in range(rounds):
            order = list(BATCHING) if round_ % 2 == 0 else list(reversed(BATCHING))
            for name in order:
                workload, _ = build_workload(host, int(port), name)
                (level,) = run(workload, name, [64], duration_s=duration_s, warmup_s=2.0)
                runs[name].append(level.as_dict())
                served = level.as_dict()
                print(f"round {round_ + 1} {name}: {served['inferences_per_s']:.0f} rows/s, "
                      f"average batch {served['server']['average_batch']:.1f}", flush=True)
        return {"runs": runs, "cpu_s": meter.stop()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--plot", type=Path,
                        default=Path(__file__).resolve().parent.parent / "docs" / "batching_efficiency.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = Path(folder)
        model = write_repository(repo)
        sizes = (1, 8, 32, 64)
        in_process = {b: in_process_rows_per_s(model, b) for b in sizes}
        results = {"in_process_rows_per_s": in_process, **serve_in_turn(repo, args.rounds, args.duration)}
    served = {name: statistics.median(r["inferences_per_s"] for r in runs) for name, runs in results["runs"].items()}
    batch = {name: statistics.median(r["server"]["average_batch"] for r in runs) for name, runs in results["runs"].items()}
    results["served_rows_per_s"] = served
    results["ratio_to_in_process_batch64"] = {name: rate / in_process[64] for name, rate in served.items()}
    save("batching_efficiency", results)
    print(table(["", "rows/s"], [
        *([f"onnxruntime in-process, batch {size}", round(in_process[size])] for size in sizes),
        *([f"tritium served, concurrency 64, `{BATCHING[name]}` (average batch {batch[name]:.1f}, "
           f"median of {args.rounds})", round(served[name])] for name in BATCHING),
    ]))
    for name in BATCHING:
        print(f"{name}: served / in-process batch 64 = {results['ratio_to_in_process_batch64'][name]:.2f}")
    print(f"in-process batch 64 / batch 1 = {in_process[64] / in_process[1]:.1f}")
    labels = [f"in-process\nbatch {size}" for size in sizes] + [
        f"served, c=64\n{'no delay' if name == 'mlp' else 'queue delay'}\n(avg batch {batch[name]:.0f})" for name in BATCHING]
    bar_charts(args.plot, [(labels, {"rows/s": [*(in_process[size] for size in sizes), *served.values()]},
                            "rows/s", "Compute-bound MLP: served against onnxruntime in-process")], size=(8, 4))
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
