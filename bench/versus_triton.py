"""tritium against real Triton, both driven by Triton's own perf_analyzer, servers alternating.

Both serve the same Python-backend add_sub (FP32 [16] x2, ``max_batch_size: 64``,
``dynamic_batching {}``, two CPU instances) from the same repository. Each scenario (HTTP at
concurrency 16 and 64, gRPC at 16, HTTP at 1 for latency) is measured in rounds, tritium
then Triton then tritium then Triton..., so that the machine's drift falls on both; the
figures are each server's median round and the ratio of the medians. CPU per request of
each process role is measured over the HTTP concurrency-64 rounds (CPU seconds divided by
the requests the server counted). Writes ``bench/out/versus_triton.json`` and a plot.

    python -m bench.versus_triton [--rounds 3] [--window-ms 3000]
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
from pathlib import Path

from bench.harness import ANCHORS, OUT, CpuMeter, TritonServer, TritiumServer, save, table
from bench.serving_overhead import python_repository

SCENARIOS = (("http", 16), ("http", 64), ("grpc", 16), ("http", 1))


def perf_analyzer(url: str, protocol: str, concurrency: int, window_ms: int, extra: tuple = ()) -> dict:
    """One perf_analyzer run (``extra``: more of its flags); its CSV row (throughput, latency percentiles in us)."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as out:
        command = [str(ANCHORS / "perf_analyzer.sh"), "-m", "add_sub", "-u", url, "-i", protocol,
                   "--concurrency-range", str(concurrency), "-p", str(window_ms), "-f", out.name,
                   "-s", "100", *extra]  # a shared 2-core machine never holds 10%: rounds and medians do the averaging
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed on {url}: {run.stdout[-500:]} {run.stderr[-500:]}")
        row = next(csv.DictReader(io.StringIO(Path(out.name).read_text())))
    return {"throughput": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"])}


def served(http_url: str) -> int:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/add_sub/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def metered_run(http_url: str, url: str, protocol: str, concurrency: int, window_ms: int, root: int,
                extra: tuple = ()) -> tuple[dict, dict]:
    """One perf_analyzer run and the CPU of the server's own processes: (its figures, role ->
    CPU us per request the server counted)."""
    meter = CpuMeter((root,))
    before = served(http_url)
    meter.start()
    figures = perf_analyzer(url, protocol, concurrency, window_ms, extra)
    used = meter.stop()
    count = max(1, served(http_url) - before)
    return figures, {role: seconds / count * 1e6 for role, seconds in used.items()}


def measure(servers: dict, rounds: int, window_ms: int) -> dict:
    """``servers``: name -> (HTTP url, gRPC url, root pid)."""
    results: dict = {name: {f"{p} c={c}": [] for p, c in SCENARIOS} for name in servers}
    cpu: dict = {name: {} for name in servers}
    for protocol, concurrency in SCENARIOS:
        for round_number in range(rounds):
            for name, (http_url, grpc_url, root) in servers.items():
                url = http_url if protocol == "http" else grpc_url
                figures, cpu_us = metered_run(http_url, url, protocol, concurrency, window_ms, root)
                results[name][f"{protocol} c={concurrency}"].append(figures)
                print(f"round {round_number + 1} {name:8s} {protocol} c={concurrency}: "
                      f"{figures['throughput']:8.0f} infer/s, p50 {figures['p50_us']:6.0f} us", flush=True)
                if (protocol, concurrency) == ("http", 64):
                    for role, us in cpu_us.items():
                        cpu[name].setdefault(role, []).append(us)
    return {"rounds": results, "cpu_us_per_request": {n: {r: statistics.median(v) for r, v in roles.items()}
                                                       for n, roles in cpu.items()}}


def summary(results: dict) -> list[list]:
    rows = []
    for protocol, concurrency in SCENARIOS:
        key = f"{protocol} c={concurrency}"
        ours = statistics.median(r["throughput"] for r in results["rounds"]["tritium"][key])
        theirs = statistics.median(r["throughput"] for r in results["rounds"]["triton"][key])
        our_p50 = statistics.median(r["p50_us"] for r in results["rounds"]["tritium"][key])
        their_p50 = statistics.median(r["p50_us"] for r in results["rounds"]["triton"][key])
        rows.append([key, round(theirs), round(ours), f"{ours / theirs:.2f}", round(their_p50), round(our_p50),
                     f"{our_p50 / their_p50:.2f}"])
    return rows


def plot(rows: list[list], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [row[0] for row in rows]
    positions = range(len(rows))
    panels = ((1, 2, "infer/s (perf_analyzer)", "Throughput, same model and machine"),
              (4, 5, "p50 latency (us)", "Median latency"))
    for axis, (triton, ours, unit, title) in zip(axes, panels):
        axis.bar([p - 0.2 for p in positions], [row[triton] for row in rows], 0.4, label="Triton 2.51")
        axis.bar([p + 0.2 for p in positions], [row[ours] for row in rows], 0.4, label="tritium")
        axis.set_xticks(list(positions), labels)
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "versus_triton.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        repo = python_repository(Path(folder))
        tritium = TritiumServer(repo)
        triton = TritonServer(repo)
        try:
            results = measure({"tritium": (tritium.url, tritium.grpc_url, tritium.process.pid),
                               "triton": (triton.url, triton.grpc_url, triton.process.pid)},
                              args.rounds, args.window_ms)
        finally:
            tritium.stop()
            triton.stop()
    rows = summary(results)
    results["summary"] = rows
    save("versus_triton", results)
    print(table(["scenario", "Triton infer/s", "tritium infer/s", "ratio", "Triton p50 us", "tritium p50 us",
                 "p50 ratio"], rows))
    print("CPU us per request at HTTP c=64:", json.dumps(results["cpu_us_per_request"], indent=1))
    plot(rows, args.plot)
    print(f"plot: {args.plot}; data: {OUT / 'versus_triton.json'}")


if __name__ == "__main__":
    main()
