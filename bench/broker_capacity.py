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
from tritium.protocol import (
    PROTOCOL_VERSION,
    Assign,
    Batch,
    BatchDone,
    Heartbeat,
    Hello,
    Infer,
    Placed,
    Response,
    Role,
    read_record,
)
from tritium.zmqio import recv_parts, send_parts

CONFIG = """
backend: "python"
max_batch_size: 64
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU, count: %d } ]
"""
MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


class Fleet:
    """Every simulated peer, polled together."""

    def __init__(self, frontend: str, backend: str, hosts: int, instances: int, gateways: int, window: int) -> None:
        self.context = zmq.Context()
        self.backend = backend
        self.poller = zmq.Poller()
        self.agents = [self._socket(backend, f"agent-{i}") for i in range(hosts)]
        self.instances_per_host = instances
        self.instances: dict[zmq.Socket, str] = {}
        self.gateways = [self._socket(frontend, f"gw-{i}") for i in range(gateways)]
        self.window = window
        self.boot = None
        self.answered = 0
        self.errors = 0
        self.sending = False
        self._rid = 0
        self._record = None

    def _socket(self, address: str, identity: str) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def hello(self) -> None:
        for index, agent in enumerate(self.agents):
            send_parts(agent, [Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=1.0, host=f"host-{index}", gpus=[]).encode()])
        for gateway in self.gateways:
            send_parts(gateway, [Hello(Role.GATEWAY, PROTOCOL_VERSION, heartbeat_s=1.0).encode()])

    def heartbeat(self) -> None:
        for agent in self.agents:
            send_parts(agent, [Heartbeat(heartbeat_s=1.0, role=Role.AGENT).encode()])
        for sock, iid in self.instances.items():
            send_parts(sock, [Heartbeat(heartbeat_s=1.0, iid=iid, joined=True).encode()])
        for gateway in self.gateways:
            send_parts(gateway, [Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION).encode()])

    def start_load(self) -> None:
        self.sending = True
        for gateway in self.gateways:
            send_parts(gateway, [self._infer() for _ in range(self.window)])

    def _infer(self) -> bytes:
        self._rid += 1
        return Infer(self._rid, "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode([b"\0" * 16])

    def turn(self, timeout_ms: int) -> None:
        for sock, _ in self.poller.poll(timeout_ms):
            while True:
                try:
                    parts = recv_parts(sock)
                except zmq.Again:
                    break
                self._handle(sock, parts)

    def _handle(self, sock: zmq.Socket, parts: list) -> None:
        message = read_record(parts[0])[0]
        if isinstance(message, Heartbeat) and self.boot is None:
            self.boot = message.boot
        elif isinstance(message, Assign):
            self._place(sock, message.models)
        elif isinstance(message, Batch):
            self._execute(sock, message, parts[1:])
        elif isinstance(message, Response):
            self._answered(sock, parts)

    def _place(self, agent: zmq.Socket, models: tuple) -> None:
        agent_id = agent.getsockopt(zmq.IDENTITY).decode()
        for model in models:
            names = [f"{model.model}_0_{j}" for j in range(self.instances_per_host)]
            send_parts(agent, [Placed(model.model, model.version, model.epoch, self.boot, instances=names).encode()])
            for name in names:
                iid = f"{agent_id}/{name}"
                sock = self._socket(self.backend, iid)
                self.instances[sock] = iid
                send_parts(sock, [Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=1.0, agent=agent_id,
                                        model=model.model, version=model.version, epoch=model.epoch, name=name,
                                        boot=self.boot, credit=2, instance_kind="CPU").encode()])

    def _execute(self, instance: zmq.Socket, batch: Batch, records: list) -> None:
        responses = [Response(read_record(r)[0].rid, [["Y", "FP32", [1, 4], 16, False]]).encode([b"\0" * 16])
                     for r in records]
        done = BatchDone(batch.number, [True] * len(responses), [0] * len(responses), [0, 1000, 0])
        send_parts(instance, [done.encode(), *responses])

    def _answered(self, gateway: zmq.Socket, parts: list) -> None:
        again = []
        for part in parts:
            message = read_record(part)[0]
            if not isinstance(message, Response):
                continue
            if message.error is not None:
                self.errors += 1
            else:
                self.answered += 1
            if self.sending:
                again.append(self._infer())
        if again:
            send_parts(gateway, again)

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_beat = 0.0
        while (now := time.monotonic()) < end:
            if now >= next_beat:
                self.heartbeat()
                next_beat = now + 1.0
            self.turn(50)


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
            fleet = Fleet(frontend, backend, args.hosts, args.instances, args.gateways, args.window)
            time.sleep(1.0)
            fleet.hello()
            fleet.run_for(4.0)   # everyone registered, the model placed and READY
            joined = len(fleet.instances)
            before = cpu_seconds(broker.pid)
            fleet.run_for(args.idle)
            idle_share = (cpu_seconds(broker.pid) - before) / args.idle
            fleet.start_load()
            fleet.run_for(1.0)
            before, answered, started = cpu_seconds(broker.pid), fleet.answered, time.monotonic()
            fleet.run_for(args.load)
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
