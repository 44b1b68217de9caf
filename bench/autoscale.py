"""Benchmark: cold starts, and a burst served by an autoscaled model against a fixed instance.

Broker, one worker host and a gateway run as separate processes (tests/cluster.py).

1. Cold start: models with ``tritium.autoscale`` ``min=0`` (an ONNX MLP of about 1 MB and
   a Python model) have no instance until a request comes; the time from that request to
   its response is measured ``--cold-starts`` times, waiting for the model to scale back
   to zero between two.
2. Burst: ``--clients`` closed-loop clients for ``--burst-s`` seconds against a Python
   model that takes 50 ms per request and runs one request per execution: once with a
   fixed single instance, once with ``min=1,max=4``. Reported: requests per second of each
   and their ratio, measured in the same run.

    python -m bench.autoscale
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from bench.harness import ROOT, save, table
from examples import models
from tests import cluster
from tests.cluster import Load, instance_pids

WHOAMI = (ROOT / "tests" / "e2e" / "cluster_repo" / "whoami" / "1" / "model.py").read_text()
PY_CONFIG = """backend: "python"
max_batch_size: 1
input [ { name: "DELAY_MS", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "PID", data_type: TYPE_INT64, dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""
ONNX_CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 256 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 256 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


def autoscale(setting: str) -> str:
    return f'parameters {{ key: "tritium.autoscale" value: {{ string_value: "{setting}" }} }}\n'


def build_repository(root: Path) -> Path:
    for name, config in (("py_cold", PY_CONFIG + autoscale("min=0,max=1,idle_s=1")),
                         ("py_fixed", PY_CONFIG),
                         ("py_scaled", PY_CONFIG + autoscale("min=1,max=4,idle_s=60,target_queue_ms=20"))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(WHOAMI)
    (root / "onnx_cold" / "1").mkdir(parents=True)
    (root / "onnx_cold" / "config.pbtxt").write_text(ONNX_CONFIG + autoscale("min=0,max=1,idle_s=1"))
    models.mlp(root / "onnx_cold" / "1" / "model.onnx", sizes=(256, 512, 256))
    return root


def request(client, model: str) -> None:
    if model.startswith("onnx"):
        tensor = httpclient.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 256), dtype=np.float32))
    else:
        tensor = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    client.infer(model, [tensor])


def cold_starts_ms(client, worker, model: str, times: int) -> list[float]:
    found = []
    for _ in range(times):
        cluster.wait_until(lambda: not instance_pids(worker, model), timeout_s=30, what=f"{model} at zero")
        started = time.perf_counter()
        request(client, model)
        found.append((time.perf_counter() - started) * 1000)
    return found


def burst_rate(url: str, model: str, clients: int, seconds: float) -> float:
    with Load(url, threads=clients, delay_ms=50, model=model) as load:
        time.sleep(seconds)
    assert all(o.pid is not None for o in load.outcomes), "a request failed during the burst"
    return len(load.outcomes) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-starts", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--burst-s", type=float, default=15)
    args = parser.parse_args()
    repo = build_repository(Path(tempfile.mkdtemp(prefix="tritium-autoscale-bench-")))
    beat = ("--heartbeat-interval-secs", "0.25")
    broker = cluster.broker(repo, *beat)
    broker.wait_ready()
    worker = cluster.worker(broker.backend, repo, *beat, "--max-cpu-instances", "8")
    gateway = cluster.gateway(broker.frontend, *beat)
    try:
        worker.wait_ready()
        gateway.wait_ready()
        client = httpclient.InferenceServerClient(gateway.url, network_timeout=120)
        cluster.wait_until(lambda: client.is_model_ready("py_scaled"), what="models ready")
        cold = {model: cold_starts_ms(client, worker, model, args.cold_starts) for model in ("py_cold", "onnx_cold")}
        fixed = burst_rate(gateway.url, "py_fixed", args.clients, args.burst_s)
        scaled = burst_rate(gateway.url, "py_scaled", args.clients, args.burst_s)
        peak = len(instance_pids(worker, "py_scaled"))
    finally:
        for part in (gateway, worker, broker):
            part.stop()
    result = {"cold_start_ms": {m: [round(v, 1) for v in values] for m, values in cold.items()},
              "burst": {"clients": args.clients, "seconds": args.burst_s, "fixed_single_instance_rps": round(fixed, 1),
                        "autoscaled_rps": round(scaled, 1), "ratio": round(scaled / fixed, 2),
                        "autoscaled_instances_at_end": peak}}
    save("autoscale", result)
    print(table(["model", "cold starts (ms)"], [[m, ", ".join(f"{v:.0f}" for v in values)]
                                                for m, values in cold.items()]))
    print(f"burst of {args.clients} clients, 50 ms per request: fixed single instance {fixed:.1f} req/s, "
          f"autoscaled {scaled:.1f} req/s ({scaled / fixed:.2f}x, {peak} instances at the end)")


if __name__ == "__main__":
    main()
