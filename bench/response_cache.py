"""Benchmark: requests answered from the response cache against requests that run the model.

The model (tests/e2e/scheduling_repo/cached) takes DELAY_MS milliseconds per execution and
enables ``response_cache``; the server runs with ``--cache-config local,size=16MiB``. One
client sends ``--requests`` requests whose input never repeats (every one a miss, it runs
the model), then as many of one input (every one but the first a hit). Reported: mean and
p99 latency of each, their ratio, and the server's cache statistics for the run.

    python -m bench.response_cache [--requests 500] [--delay-ms 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tritonclient.http as httpclient

from bench.harness import ROOT, TritiumServer, save, table

REPO = ROOT / "tests" / "e2e" / "scheduling_repo"


def latencies_ms(client, values) -> list[float]:
    found = []
    for value in values:
        tensor = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        started = time.perf_counter()
        client.infer("cached", [tensor])
        found.append((time.perf_counter() - started) * 1000)
    return found


def summary(name: str, values: list[float]) -> dict:
    ordered = sorted(values)
    return {"requests": name, "mean_ms": round(sum(values) / len(values), 3),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    args = parser.parse_args()
    with TritiumServer(REPO, "--cache-config", f"local,size={16 * 1024 * 1024}") as server:
        client = httpclient.InferenceServerClient(server.url)
        latencies_ms(client, [args.delay_ms] * 20)   # warm up the connection and the model
        # Misses: a delay a hair above the nominal one, different every time (never repeats).
        misses = latencies_ms(client, [args.delay_ms + (i + 1) * 1e-4 for i in range(args.requests)])
        hits = latencies_ms(client, [args.delay_ms] * args.requests)
        stats = client.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
    rows = [summary("misses (model runs)", misses), summary("hits (from the cache)", hits)]
    result = {"delay_ms": args.delay_ms, "requests": args.requests, "rows": rows,
              "hit_latency_over_miss": round(rows[1]["mean_ms"] / rows[0]["mean_ms"], 3),
              "server_cache_hits": stats["cache_hit"]["count"], "server_cache_misses": stats["cache_miss"]["count"]}
    save("response_cache", result)
    print(table(["requests", "mean ms", "p99 ms"], [[r["requests"], r["mean_ms"], r["p99_ms"]] for r in rows]))
    print(f"hit latency / miss latency: {result['hit_latency_over_miss']}  "
          f"(server: {result['server_cache_hits']} hits, {result['server_cache_misses']} misses)")


if __name__ == "__main__":
    main()
