"""One perf run: for each concurrency level, load, measure, and read the server's statistics."""

from __future__ import annotations


import uvloop

from tritium.perf.loadgen import Workload, run_level
from tritium.perf.report import LevelReport, ServerBreakdown
from tritium.perf.workload import get_json


def model_stats(workload: Workload, model: str) -> dict | None:
    try:
        stats = get_json(workload.host, workload.port, f"/v2/models/{model}/stats")
    except RuntimeError:
        return None
    entries = stats.get("model_stats", [])
    return entries[0] if entries else None


def run(workload: Workload, model: str, concurrencies: list[int], batch_size: int = 1,
        duration_s: float | None = 5.0, requests: int | None = None, warmup_s: float = 1.0,
        server_stats: bool = True) -> list[LevelReport]:
    reports = []
    for concurrency in concurrencies:
        before = model_stats(workload, model) if server_stats else None
        result = uvloop.run(run_level(workload, concurrency, duration_s=duration_s,
                                      requests=requests, warmup_s=warmup_s))
        after = model_stats(workload, model) if server_stats else None
        reports.append(LevelReport.of(result, batch_size, ServerBreakdown.between(before, after)))
    return reports
