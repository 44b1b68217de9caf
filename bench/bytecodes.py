"""Python bytecodes each request costs in an instance's executor, the broker's turn and the gateway: counted,
not timed, so that two builds can be compared on a machine whose timings move by tens of percent.

A change of a few microseconds per request is lost in this machine's noise (the same build's
``bench.instance_cpu`` rounds spread over 25-45 us); the bytecodes it runs are the same on every
run. Counted with ``sys.settrace`` opcode events over requests of add_sub (the Python model of
bench/serving_overhead.py) one at a time, as at concurrency 1: the instance's executor running
BATCH messages of ``--batch`` requests (as bench/instance_cpu.py), the broker's turns with
scripted peers keeping ``--window`` requests in flight (as bench/broker_cpu.py), and the gateway's
HTTP front end with ``--window`` clients a turn and its gRPC front end with ``--window`` rounded up to
a multiple of four (its four connections; as bench/gateway_cpu.py). What C code does
(numpy, msgspec, system calls) is not counted; the Python around it is where a build's own cost
per request grows. The instance's count is the same on every run; the broker's moves by a few tenths
of a percent (its peers' answers sometimes come a turn later). ``--save`` keeps a build's counts;
``--against`` compares with them, by function (run it in each build's checkout).

    python -m bench.bytecodes [--batch 1] [--window 1] [--top 15] [--save before.json] [--against before.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 100        # requests before counting: imports, first-use caches, Python's specialising
COUNTED = 200       # requests counted (the count per request is the same for any number)


class Counter:
    """Bytecodes and calls per function while ``tracing()`` is on."""

    def __init__(self) -> None:
        self.bytecodes: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def _trace(self, frame, event, _arg):
        code = frame.f_code
        where = f"{getattr(code, 'co_qualname', code.co_name)} ({Path(code.co_filename).name})"   # (3.10: no qualname)
        if event == "call":
            frame.f_trace_opcodes = True
            self.calls[where] += 1
        elif event == "opcode":
            self.bytecodes[where] += 1
        return self._trace

    def run(self, work, *args):
        sys.settrace(self._trace)
        try:
            return work(*args)
        finally:
            sys.settrace(None)

    def per_request(self, requests: int) -> dict:
        return {"bytecodes": {k: v / requests for k, v in self.bytecodes.items()},
                "calls": {k: v / requests for k, v in self.calls.items()}}


def count_instance(batch: int) -> dict:
    from bench.instance_cpu import batch_frames, executor_for
    from bench.serving_overhead import python_repository

    counter = Counter()
    with tempfile.TemporaryDirectory() as folder:
        executor = executor_for(python_repository(Path(folder) / "python"))
        frames = batch_frames(batch)
        for _ in range(WARMUP):
            executor.run(frames)
        for _ in range(COUNTED):
            counter.run(executor.run, frames)
    return counter.per_request(COUNTED * batch)


def count_broker(window: int) -> dict:
    from bench.broker_cpu import Bench, prepared_repository

    counter = Counter()
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as sockets:
        bench = Bench(prepared_repository(Path(folder)), Path(sockets), window)
        try:
            bench.ready()
            bench.peers.start("add_sub")
            while bench.peers.answered < WARMUP:
                bench.run_for(0.05)
            answered = bench.peers.answered
            while bench.peers.answered - answered < COUNTED:
                counter.run(bench.broker.turn, 1)
                bench.peers.turn(0)
            served = bench.peers.answered - answered
            bench.peers.stop()
            bench.run_for(0.2)
            assert bench.peers.errors == 0, f"{bench.peers.errors} requests failed"
        finally:
            bench.close()
    return counter.per_request(served)


def count_gateway(protocol: str, clients: int) -> dict:
    """Requests of ``clients`` clients per turn through the gateway in-process (as
    bench/gateway_cpu.py: parsing, checks, the INFER record, the answer's encoding and framing):
    HTTP, one connection each; gRPC, on four connections (``clients`` rounded up to a multiple)."""
    import asyncio

    import uvloop

    from bench.gateway_cpu import GRPC_CONNECTIONS, measure

    if protocol == "grpc":
        clients = -(-clients // GRPC_CONNECTIONS) * GRPC_CONNECTIONS
    counter = Counter()
    uvloop.install()
    turns = max(10, COUNTED // clients)   # traced, a turn of many clients takes long: the link's heartbeats
    asyncio.run(measure(protocol, turns, clients, counter._trace))
    return counter.per_request(turns * clients)


PARTS = ("instance", "broker", "gateway", "gateway-grpc")


def counts(batch: int, window: int) -> dict:
    return {"instance": count_instance(batch), "broker": count_broker(window), "gateway": count_gateway("http", window),
            "gateway-grpc": count_gateway("grpc", window)}


def report(part: str, figures: dict, before: dict | None, top: int) -> None:
    total = sum(figures["bytecodes"].values())
    calls = sum(figures["calls"].values())
    if before is None:
        print(f"{part}: {total:,.0f} bytecodes and {calls:.0f} calls per request")
        rows = sorted(figures["bytecodes"].items(), key=lambda item: -item[1])[:top]
        for where, value in rows:
            print(f"  {value:8.1f}  {where}")
        return
    was = sum(before["bytecodes"].values())
    print(f"{part}: {total:,.0f} bytecodes per request against {was:,.0f} ({total - was:+,.0f}); "
          f"calls {calls:.0f} against {sum(before['calls'].values()):.0f}")
    names = set(figures["bytecodes"]) | set(before["bytecodes"])
    changes = sorted(((figures["bytecodes"].get(n, 0) - before["bytecodes"].get(n, 0), n) for n in names),
                     key=lambda item: -abs(item[0]))
    for change, where in changes[:top]:
        if change:
            print(f"  {change:+8.1f}  {before['bytecodes'].get(where, 0):7.1f} -> "
                  f"{figures['bytecodes'].get(where, 0):7.1f}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1, help="requests per BATCH message given to the instance")
    parser.add_argument("--window", type=int, default=1, help="requests the broker's peers keep in flight")
    parser.add_argument("--top", type=int, default=15, help="functions listed per part")
    parser.add_argument("--save", type=Path, help="write the counts to this JSON file (to compare a later build with)")
    parser.add_argument("--against", type=Path, help="counts saved by --save (another build's), to compare with")
    args = parser.parse_args()
    started = time.monotonic()
    figures = counts(args.batch, args.window)
    if args.save:
        args.save.write_text(json.dumps(figures))
    before = json.loads(args.against.read_text()) if args.against else None
    if before is not None:   # saved by a build that counted fewer parts: those are shown alone
        before = {part: before.get(part) for part in PARTS}
    for part in PARTS:
        report(part, figures[part], before and before.get(part), args.top)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
