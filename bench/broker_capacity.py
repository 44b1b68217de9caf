"""How far one broker goes: a real broker process with simulated peers at fleet size.

One process simulates 100 worker hosts (agents) with 4 instances each (400 instances) and
16 gateways, all as cheap ZeroMQ peers speaking tritium's protocol: agents register and
place what they are assigned, instances answer every BATCH at once, gateways keep a window
of requests outstanding, and everyone heartbeats every second. Two phases:

* idle: only heartbeats and membership, the broker's CPU share at this size;
* load: the broker's request rate and CPU per request; since the simulated peers do no
  work, the broker (or the simulator, on a 2-core machine) is the limit.

With ``--links ipc`` the peers reach the broker over Unix sockets, where the broker's ROUTERs
are tritium's own ZMTP sockets (as under ``tritium serve``); the default is TCP (libzmq).

    python -m bench.broker_capacity [--hosts 100] [--instances 4] [--gateways 16] [--window 16] [--links tcp|ipc]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from bench.harness import ROOT, cpu_seconds, free_port, save, table
from bench.simulated_peers import SimulatedPeers
from tritium.protocol import Infer, Response

CONFIG = """
backend: "python"
max_batch_size: 64
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: %d } ]
"""
MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def _request(rid: int, model: str) -> bytes:
    return Infer(rid, model, [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode([b"\0" * 16])


def _answer(rid: int) -> bytes:
    return Response(rid, [["Y", "FP32", [1, 4], 16, False]]).encode([b"\0" * 16])


def run_for(fleet: SimulatedPeers, seconds: float) -> None:
    end = time.monotonic() + seconds
    next_beat = 0.0
    while (now := time.monotonic()) < end:
        if now >= next_beat:
            fleet.heartbeat()
            next_beat = now + 1.0
        fleet.turn(50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--instances", type=int, default=4, help="per host")
    parser.add_argument("--gateways", type=int, default=16)
    parser.add_argument("--window", type=int, default=16, help="requests outstanding per gateway")
    parser.add_argument("--idle", type=float, default=6.0)
    parser.add_argument("--load", type=float, default=8.0)
    parser.add_argument("--links", choices=("tcp", "ipc"), default="tcp",
                        help="TCP (libzmq ROUTERs in the broker) or Unix sockets (its own ZMTP ROUTERs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as sockets:
        model = Path(folder) / "m"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text(MODEL_PY)
        (model / "config.pbtxt").write_text(CONFIG % args.instances)
        if args.links == "ipc":
            frontend, backend = f"ipc://{sockets}/frontend", f"ipc://{sockets}/backend"
        else:
            frontend, backend = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        broker = subprocess.Popen([sys.executable, "-m", "tritium.cli", "broker", "--model-repository", folder,
                                   "--frontend", frontend, "--backend", backend, "--allow-metrics", "false",
                                   "--heartbeat-interval-secs", "1"], cwd=ROOT, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            fleet = SimulatedPeers(zmq.Context(), frontend, backend, agents=args.hosts, instances=args.instances,
                                   gateways=args.gateways, window=args.window, request=_request, answer=_answer)
            time.sleep(1.0)
            fleet.hello()
            run_for(fleet, 4.0)   # everyone registered, the model placed and READY
            joined = len(fleet.instances)
            before = cpu_seconds(broker.pid)
            run_for(fleet, args.idle)
            idle_share = (cpu_seconds(broker.pid) - before) / args.idle
            fleet.start("m")
            run_for(fleet, 1.0)
            before, answered, started = cpu_seconds(broker.pid), fleet.answered, time.monotonic()
            run_for(fleet, args.load)
            elapsed = time.monotonic() - started
            used = cpu_seconds(broker.pid) - before
            served = fleet.answered - answered
        finally:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.wait()
    results = {"links": args.links, "hosts": args.hosts, "instances": joined, "gateways": args.gateways,
               "idle_broker_cpu_share": idle_share, "requests_per_s": served / elapsed,
               "broker_cpu_share_under_load": used / elapsed, "broker_cpu_us_per_request": used / max(1, served) * 1e6,
               "errors": fleet.errors}
    save("broker_capacity", results)
    print(table(["hosts", "instances", "gateways", "idle broker CPU", "req/s", "broker CPU under load",
                 "broker CPU us/request", "errors"],
                [[args.hosts, joined, args.gateways, f"{idle_share:.1%}", round(results["requests_per_s"]),
                  f"{results['broker_cpu_share_under_load']:.0%}", round(results["broker_cpu_us_per_request"], 1),
                  fleet.errors]]))


if __name__ == "__main__":
    main()
