"""CPU per request of an instance's own work, without a server around it.

Builds the instance of the Python add_sub model (FP32 [16] x2, max_batch_size 64, the same
model.py as bench/serving_overhead.py) in this process, and runs BATCH messages of
``--batch`` requests, each as the broker sends it, through the executor that the instance
process runs. Prints the CPU microseconds each request costs (decoding, pb_utils objects,
the model's execute, output conversion, encoding of the responses). Socket work and the
poll loop are not in it; the whole instance process under load is measured by
bench/serving_overhead.py (CPU us/request per role).

    python bench/instance_cpu.py [--batch 32] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from google.protobuf import json_format, text_format

from bench.serving_overhead import python_repository
from tritium.protocol import Batch, Infer, pack_tensors
from tritium.repo import ModelConfig
from tritium.workers.instance import build_executor


def executor_for(repository: Path):
    config = text_format.Parse((repository / "add_sub" / "config.pbtxt").read_text(), ModelConfig())
    config.name = "add_sub"
    spec = {"config": json_format.MessageToDict(config), "model": "add_sub", "version": 1,
            "model_dir": str(repository / "add_sub"), "name": "add_sub_0", "kind": "KIND_CPU", "device_id": 0}
    executor, _ = build_executor(spec)
    return executor


def batch_frames(batch: int) -> list:
    """A BATCH of ``batch`` requests of batch size 1, each naming its outputs, as perf_analyzer sends them."""
    frames: list = [Batch(1, batch).encode()]
    rng = np.random.default_rng(0)
    for rid in range(batch):
        descriptors, inline, external = pack_tensors(
            (name, "FP32", [1, 16], rng.random(16, dtype=np.float32).tobytes()) for name in ("INPUT0", "INPUT1"))
        request = Infer(rid, "add_sub", descriptors, version=1, batch_size=1, outputs=["OUTPUT0", "OUTPUT1"],
                        external=len(external))
        frames += [request.encode(inline), *external]
    return frames


def cpu_us_per_request(executor, frames: list, batch: int, seconds: float) -> float:
    runs, start, cpu_start = 0, time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        executor.run(frames)
        runs += 1
    return (time.process_time() - cpu_start) / (runs * batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="requests per BATCH message")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the lowest figure is kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        executor = executor_for(python_repository(Path(folder) / "python"))
        frames = batch_frames(args.batch)
        executor.run(frames)
        figures = [cpu_us_per_request(executor, frames, args.batch, args.seconds) for _ in range(args.rounds)]
    print(f"instance CPU per request (batch {args.batch}): {min(figures):.1f} us "
          f"(rounds: {', '.join(f'{f:.1f}' for f in figures)})")


if __name__ == "__main__":
    main()
