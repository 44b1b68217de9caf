"""The broker's own CPU per inference request, plain and through an ensemble, in-process.

A broker (``Broker``, as ``tritium broker`` runs it, its ROUTERs tritium's own ZMTP sockets on
Unix sockets) is turned in this thread; scripted peers speak to it over ``ipc://`` from the
same thread: a host agent that places every model, one instance per model that answers each
BATCH at once (each output is a copy of an input), and gateways keeping sixteen requests in
flight (add_sub's FP32 [1,16] x2 inline, both outputs named, as perf_analyzer sends them).
Two scenarios on one repository: ``add_sub`` (one model) and ``pair`` (an ensemble of two
add_sub copies, the first step's outputs the second's inputs, as bench/ensemble_versus_triton.py
serves). What is measured is this thread's CPU time inside ``Broker.turn`` per request
answered: receiving, scheduling, batching, dispatching, routing the answers and, for the
ensemble, its steps' bookkeeping, with the broker's system calls; the peers' work is outside
it. The deterministic figure to compare builds with (the broker under real load:
``bench.ensemble_versus_triton``, ``bench.serving_overhead``).

    python -m bench.broker_cpu [--seconds 3] [--rounds 3] [--window 16] [--profile pair]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import zmq

from bench.ensemble_versus_triton import repository
from bench.harness import save, table
from bench.serving_overhead import python_repository
from bench.simulated_peers import SimulatedPeers
from tritium.broker.server import Broker, BrokerSettings
from tritium.protocol import Infer, Response

WINDOW = 16                     # requests in flight, as perf_analyzer's concurrency 16
TENSOR = bytes(range(64))       # FP32 [1,16]
INPUTS = [["INPUT0", "FP32", [1, 16], 64, False], ["INPUT1", "FP32", [1, 16], 64, False]]
OUTPUTS = [["OUTPUT0", "FP32", [1, 16], 64, False], ["OUTPUT1", "FP32", [1, 16], 64, False]]
SCENARIOS = ("add_sub", "pair")


def _request(rid: int, model: str) -> bytes:
    return Infer(rid, model, INPUTS, version=-1, batch_size=1, outputs=["OUTPUT0", "OUTPUT1"]).encode([TENSOR, TENSOR])


def _answer(rid: int) -> bytes:
    return Response(rid, OUTPUTS).encode([TENSOR, TENSOR])


class Bench:
    """The broker and its peers, driven turn by turn from this thread."""

    def __init__(self, repo: Path, sockets: Path, window: int = WINDOW) -> None:
        self.context = zmq.Context()
        frontend, backend = f"ipc://{sockets}/frontend", f"ipc://{sockets}/backend"
        self.broker = Broker(BrokerSettings(model_repositories=(str(repo),), frontend=frontend, backend=backend,
                                            metrics=None, heartbeat_interval_s=1.0), self.context)
        self.broker.load_repository()
        self.peers = SimulatedPeers(self.context, frontend, backend, agents=1, instances=1, gateways=1,
                                    window=window, request=_request, answer=_answer)
        self.turn_cpu = 0.0

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_beat = 0.0
        while (now := time.monotonic()) < end:
            if now >= next_beat:
                self.peers.heartbeat()
                next_beat = now + 0.5
            before = time.thread_time()
            self.broker.turn(1)
            self.turn_cpu += time.thread_time() - before
            self.peers.turn(0)

    def ready(self) -> None:
        self.peers.hello()
        deadline = time.monotonic() + 20
        while not all(v.state.value == "READY" for v in self.broker.registry.versions.values()):
            assert time.monotonic() < deadline, "the models did not become ready"
            self.run_for(0.2)

    def measure(self, model: str, seconds: float) -> float:
        """Broker CPU microseconds per request answered over ``seconds`` of load."""
        self.peers.start(model)
        self.run_for(0.5)
        cpu, answered = self.turn_cpu, self.peers.answered
        self.run_for(seconds)
        served = self.peers.answered - answered
        self.peers.stop()
        self.run_for(0.2)   # the window drains
        assert self.peers.errors == 0, f"{self.peers.errors} requests failed"
        return (self.turn_cpu - cpu) / max(1, served) * 1e6

    def close(self) -> None:
        self.broker.close()
        self.context.destroy(0)


def prepared_repository(root: Path) -> Path:
    """The ensemble ``pair``, its two steps and ``add_sub``."""
    python_repository(repository(root))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=WINDOW, help="requests kept in flight (perf_analyzer's concurrency)")
    parser.add_argument("--profile", choices=SCENARIOS, help="print a cProfile of the broker under this load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as sockets:
        bench = Bench(prepared_repository(Path(folder)), Path(sockets), args.window)
        try:
            bench.ready()
            if args.profile:
                profile(bench, args.profile, args.seconds)
                return
            figures = {model: [bench.measure(model, args.seconds) for _ in range(args.rounds)] for model in SCENARIOS}
        finally:
            bench.close()
    best = {model: min(values) for model, values in figures.items()}
    save("broker_cpu", {"rounds": figures, "best_us_per_request": best})
    print(table(["scenario", "broker CPU us/request (best)", "rounds"],
                [[model, round(best[model], 1), ", ".join(f"{v:.1f}" for v in figures[model])] for model in SCENARIOS]))


def profile(bench: Bench, model: str, seconds: float) -> None:
    profiler = cProfile.Profile()
    original = bench.broker.turn

    def profiled(timeout_ms=None):
        return profiler.runcall(original, timeout_ms)

    bench.broker.turn = profiled
    bench.measure(model, seconds)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
