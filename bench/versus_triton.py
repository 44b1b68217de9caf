"""tritium against real Triton, both driven by Triton's own perf_analyzer, servers alternating.

Both serve the same Python-backend add_sub (FP32 [16] x2, ``max_batch_size: 64``,
``dynamic_batching {}``, two CPU instances) from the same repository. Each scenario (HTTP at
concurrency 16 and 64, gRPC at 16, HTTP at 1 for latency) is measured in rounds, tritium
then Triton then tritium then Triton..., so that the machine's drift falls on both; the
figures are each server's median round and the ratio of the medians. CPU per request of
each process role (CPU seconds divided by the requests the server counted) and the share of
the machine's CPU time left idle are measured in every scenario. Writes ``bench/out/versus_triton.json`` and a plot.
``--pinned`` adds a third server: tritium with its gateways on one half of the CPUs and its
broker and instances on the other; ``--variant NAME=FLAGS`` adds tritium started with FLAGS (``VARIABLE=value`` words
among them go to its environment, e.g. ``--variant libzmq=TRITIUM_LIBZMQ_LINKS=1``; an earlier build from
another checkout: ``--variant previous=TRITIUM_ROOT=/path/to/that/checkout``).

    python -m bench.versus_triton [--rounds 3] [--window-ms 3000] [--pinned] [--variant NAME=FLAGS]
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import tempfile
import urllib.request
import json
import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.harness import (ANCHORS, OUT, ROOT, VERSUS_HEADERS, CpuMeter, TritonServer, TritiumServer,
                           alternating_rounds, bar_charts, compared, save, system_cpu_times, table,
                           tritium_and_triton, versus_plot, versus_row)
from bench.serving_overhead import python_repository

SCENARIOS = (("http", 16), ("http", 64), ("grpc", 16), ("http", 1))
_ENVIRONMENT = re.compile(r"[A-Z_][A-Z0-9_]*=")   # a variant's word that sets a variable
SLICES = "slices per request"


def perf_analyzer(url: str, protocol: str, concurrency: int, window_ms: int, extra: tuple = (),
                  model: str = "add_sub") -> dict:
    """One perf_analyzer run (``extra``: more of its flags); its CSV row (throughput, latency percentiles in us)."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as out:
        command = [str(ANCHORS / "perf_analyzer.sh"), "-m", model, "-u", url, "-i", protocol,
                   "--concurrency-range", str(concurrency), "-p", str(window_ms), "-f", out.name,
                   "-s", "100", *extra]  # a shared 2-core machine never holds 10%: rounds and medians do the averaging
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed on {url}: {run.stdout[-500:]} {run.stderr[-500:]}")
        row = next(csv.DictReader(io.StringIO(Path(out.name).read_text())))
    figures = {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
               "p99_us": float(row["p99 latency"])}
    if row.get("Response Throughput"):   # a decoupled model's: its answers per second
        figures["responses_per_s"] = float(row["Response Throughput"])
    return figures


def models_versus_triton(name: str, doc: str, repository: Callable[[Path], Path], models: tuple[str, ...],
                         protocols: tuple[str, ...], concurrency: int, title: str) -> None:
    """The command of a script that has perf_analyzer drive each of ``models`` over each of
    ``protocols`` on both servers, the servers alternating round by round: its table,
    ``bench/out/NAME.json`` and ``docs/NAME.png``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / f"{name}.png")
    args = parser.parse_args()

    def measure(server, model: str, protocol: str) -> dict:
        url = server.url if protocol == "http" else server.grpc_url
        return perf_analyzer(url, protocol, concurrency, args.window_ms, model=model)

    scenarios = {model if len(protocols) == 1 else f"{model} {protocol}": partial(measure, model=model, protocol=protocol)
                 for model in models for protocol in protocols}
    with tempfile.TemporaryDirectory() as folder:
        with tritium_and_triton(repository(Path(folder))) as servers:
            rounds = alternating_rounds(servers, scenarios, args.rounds,
                                        lambda f: f"{f['throughput']:6.0f} infer/s, p50 {f['p50_us']:6.0f} us")
    rows = [versus_row(scenario, ours, theirs) for scenario, ours, theirs in compared(rounds, ("throughput", "p50_us"))]
    save(name, {"rounds": rounds, "rows": rows})
    print(table([f"model ({', '.join(protocols)}, concurrency {concurrency})", *VERSUS_HEADERS], rows))
    versus_plot(args.plot, rows, title)
    print(f"plot: {args.plot}")


def served(http_url: str) -> int:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/add_sub/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def metered_run(http_url: str, url: str, protocol: str, concurrency: int, window_ms: int, root: int,
                extra: tuple = ()) -> tuple[dict, dict]:
    """One perf_analyzer run and the CPU of the server's own processes: (its figures, role ->
    CPU us per request the server counted, plus ``idle %``: the machine's CPU time nobody used,
    and the server's threads' time slices per request, each a wake-up or a preemption)."""
    meter = CpuMeter((root,))
    before = served(http_url)
    idle_before, all_before = system_cpu_times()
    meter.start()
    figures = perf_analyzer(url, protocol, concurrency, window_ms, extra)
    used = meter.stop()
    idle_after, all_after = system_cpu_times()
    count = max(1, served(http_url) - before)
    cpu = {role: seconds / count * 1e6 for role, seconds in used.items()}
    cpu["idle %"] = 100 * (idle_after - idle_before) / max(1, all_after - all_before)
    cpu[SLICES] = meter.slices / count
    return figures, cpu


def measure(servers: dict, rounds: int, window_ms: int) -> dict:
    """``servers``: name -> (HTTP url, gRPC url, root pid)."""
    results: dict = {name: {f"{p} c={c}": [] for p, c in SCENARIOS} for name in servers}
    cpu: dict = {name: {f"{p} c={c}": {} for p, c in SCENARIOS} for name in servers}
    for protocol, concurrency in SCENARIOS:
        scenario = f"{protocol} c={concurrency}"
        for round_number in range(rounds):
            for name, (http_url, grpc_url, root) in servers.items():
                url = http_url if protocol == "http" else grpc_url
                figures, cpu_us = metered_run(http_url, url, protocol, concurrency, window_ms, root)
                results[name][scenario].append(figures)
                print(f"round {round_number + 1} {name:8s} {scenario}: "
                      f"{figures['throughput']:8.0f} infer/s, p50 {figures['p50_us']:6.0f} us", flush=True)
                for role, us in cpu_us.items():
                    cpu[name][scenario].setdefault(role, []).append(us)
    return {"rounds": results,
            "cpu_us_per_request": {name: {scenario: {role: statistics.median(values) for role, values in roles.items()}
                                          for scenario, roles in scenarios.items()}
                                   for name, scenarios in cpu.items()}}


def cpu_table(results: dict) -> list[list]:
    """Per scenario and server: each role's CPU us per request, their sum, the time slices per
    request of all its threads, and the idle share."""
    rows = []
    for protocol, concurrency in SCENARIOS:
        scenario = f"{protocol} c={concurrency}"
        for name, scenarios in results["cpu_us_per_request"].items():
            roles = scenarios[scenario]
            spent = {role: us for role, us in roles.items() if role not in ("idle %", SLICES)}
            rows.append([scenario, name, ", ".join(f"{role} {us:.0f}" for role, us in sorted(spent.items())),
                         round(sum(spent.values())), f"{roles.get(SLICES, 0):.1f}", f"{roles.get('idle %', 0):.0f}"])
    return rows


def summary(results: dict, name: str = "tritium") -> list[list]:
    """Per scenario: Triton's and ``name``'s median throughput and p50, and their ratios."""
    rows = []
    for protocol, concurrency in SCENARIOS:
        key = f"{protocol} c={concurrency}"
        ours = statistics.median(r["throughput"] for r in results["rounds"][name][key])
        theirs = statistics.median(r["throughput"] for r in results["rounds"]["triton"][key])
        our_p50 = statistics.median(r["p50_us"] for r in results["rounds"][name][key])
        their_p50 = statistics.median(r["p50_us"] for r in results["rounds"]["triton"][key])
        rows.append([key, round(theirs), round(ours), f"{ours / theirs:.2f}", round(their_p50), round(our_p50),
                     f"{our_p50 / their_p50:.2f}"])
    return rows


def pinned_cpus() -> tuple[str, str]:
    """``--pinned``: the gateways on the first half of this process's CPUs, the broker and the
    instances on the rest (on two CPUs: 0 and 1)."""
    cpus = sorted(os.sched_getaffinity(0))
    half = max(1, len(cpus) // 2)
    front, back = cpus[:half], cpus[half:] or cpus[:half]
    return ",".join(map(str, front)), ",".join(map(str, back))


def plot(tables: dict[str, list[list]], path: Path) -> None:
    """``tables``: each tritium variant's summary rows (Triton's figures are in every one)."""
    first = next(iter(tables.values()))
    labels = [row[0] for row in first]
    panels = []
    for triton, ours, unit, title in ((1, 2, "infer/s (perf_analyzer)", "Throughput, same model and machine"),
                                      (4, 5, "p50 latency (us)", "Median latency")):
        series = {"Triton 2.51": [row[triton] for row in first]}
        series.update({name: [row[ours] for row in rows] for name, rows in tables.items()})
        panels.append((labels, series, unit, title))
    bar_charts(path, panels, size=(10, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "versus_triton.png")
    parser.add_argument("--pinned", action="store_true",
                        help="also measure tritium with its gateways on one half of the CPUs and the broker and "
                             "instances on the other (--gateway-cpus, --broker-cpus, --worker-cpus: --cpu-layout "
                             "split with the instances confined too; the gateways then send a turn's requests a "
                             "few at a time)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="also measure tritium started with these flags (and VARIABLE=value words as its "
                             "environment), named NAME (repeatable), e.g. "
                             "--variant 'no polling=--broker-spin-us=0 --gateway-spin-us=0'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = python_repository(Path(folder))
        servers = {"tritium": TritiumServer(repo), "triton": TritonServer(repo)}
        if args.pinned:
            front, back = pinned_cpus()
            servers["tritium pinned"] = TritiumServer(repo, "--gateway-cpus", front, "--broker-cpus", back,
                                                      "--worker-cpus", back)
        for variant in args.variant:
            name, _, flags = variant.partition("=")
            words = flags.split()
            env = dict(word.split("=", 1) for word in words if _ENVIRONMENT.match(word))
            servers[f"tritium {name}"] = TritiumServer(repo, *[w for w in words if not _ENVIRONMENT.match(w)], env=env)
        try:
            results = measure({name: (server.url, server.grpc_url, server.process.pid)
                               for name, server in servers.items()}, args.rounds, args.window_ms)
        finally:
            for server in servers.values():
                server.stop()
    tables = {name: summary(results, name) for name in servers if name != "triton"}
    results["summary"] = tables
    save("versus_triton", results)
    for name, rows in tables.items():
        print(f"{name} against Triton:")
        print(table(["scenario", "Triton infer/s", f"{name} infer/s", "ratio", "Triton p50 us", f"{name} p50 us",
                     "p50 ratio"], rows))
    print("CPU us per request of each process role, time slices per request, and the CPU time left idle:")
    print(table(["scenario", "server", "us per request", "all", "slices per request", "idle %"], cpu_table(results)))
    plot(tables, args.plot)
    print(f"plot: {args.plot}; data: {OUT / 'versus_triton.json'}")


if __name__ == "__main__":
    main()
