"""gRPC: tritium's own server (the default) against grpc.aio (``--grpc-server=grpcio``) and
real Triton, all driven by Triton's perf_analyzer over gRPC, servers alternating.

The model and repository are bench/versus_triton.py's (Python add_sub, ``max_batch_size: 64``,
dynamic batching, two CPU instances). Each scenario (unary ModelInfer and ``--streaming`` at
concurrency 16) is measured in rounds, one server after the other, so that the machine's
drift falls on all three; the figures are each server's median round, its ratio to Triton,
and the CPU each process role spent per request (for tritium the gateway's is the one the
gRPC server decides). Writes ``bench/out/grpc_servers.json`` and the plot
(docs/grpc_servers.png).

    python -m bench.grpc_servers [--rounds 3] [--window-ms 3000] [--concurrency 16] [--plot PNG]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.harness import TritonServer, TritiumServer, bar_charts, save, table
from bench.serving_overhead import python_repository
from bench.versus_triton import metered_run

SCENARIOS = (("unary", ()), ("streaming", ("--streaming",)))


def measure(servers: dict, rounds: int, window_ms: int, concurrency: int) -> dict:
    """``servers``: name -> (HTTP url, gRPC url, root pid); per scenario and server, every round."""
    results: dict = {scenario: {name: [] for name in servers} for scenario, _ in SCENARIOS}
    for scenario, flags in SCENARIOS:
        for round_number in range(rounds):
            for name, (http_url, grpc_url, root) in servers.items():
                figures, cpu_us = metered_run(http_url, grpc_url, "grpc", concurrency, window_ms, root, flags)
                figures["cpu_us_per_request"] = {role: round(us, 1) for role, us in cpu_us.items()}
                results[scenario][name].append(figures)
                print(f"round {round_number + 1} {scenario:9s} {name:15s} {figures['throughput']:8.0f} infer/s  "
                      f"cpu us/request {figures['cpu_us_per_request']}", flush=True)
    return results


def summary(results: dict) -> list[list]:
    rows = []
    for scenario, by_server in results.items():
        triton = statistics.median(r["throughput"] for r in by_server["triton"])
        for name, rounds in by_server.items():
            throughput = statistics.median(r["throughput"] for r in rounds)
            roles = {role for r in rounds for role in r["cpu_us_per_request"]}
            cpu = {role: statistics.median(r["cpu_us_per_request"].get(role, 0) for r in rounds) for role in sorted(roles)}
            rows.append([scenario, name, round(throughput), f"{throughput / triton:.2f}",
                         ", ".join(f"{role} {value:.0f}" for role, value in cpu.items())])
    return rows


def plot(results: dict, path: Path) -> None:
    """Each server's median throughput per scenario, and its gateway's (Triton: its server's) CPU per request."""
    scenarios = list(results)
    servers = list(results[scenarios[0]])

    def median(scenario: str, server: str, figure) -> float:
        return statistics.median(figure(r) for r in results[scenario][server])

    def front_cpu(r: dict) -> float:
        cpu = r["cpu_us_per_request"]
        return cpu.get("gateway", cpu.get("triton", 0.0))

    throughput = {s: [median(c, s, lambda r: r["throughput"]) for c in scenarios] for s in servers}
    cpu = {s: [median(c, s, front_cpu) for c in scenarios] for s in servers}
    bar_charts(path, [(scenarios, throughput, "infer/s", "gRPC, concurrency 16"),
                      (scenarios, cpu, "CPU us per request", "gateway (Triton: its server)")], size=(10, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "grpc_servers.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = python_repository(Path(folder))
        started = {"tritium": TritiumServer(repo), "tritium-grpcio": TritiumServer(repo, "--grpc-server=grpcio"),
                   "triton": TritonServer(repo)}
        try:
            results = measure({name: (s.url, s.grpc_url, s.process.pid) for name, s in started.items()},
                              args.rounds, args.window_ms, args.concurrency)
        finally:
            for server in started.values():
                server.stop()
    rows = summary(results)
    save("grpc_servers", {"rounds": results, "summary": rows})
    plot(results, args.plot)
    print(table(["scenario", "server", "infer/s", "ratio to Triton", "CPU us per request"], rows))


if __name__ == "__main__":
    main()
