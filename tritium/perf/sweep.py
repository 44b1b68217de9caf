"""A whole perf run: open a session, measure each level in turn, report each as it ends.

``run_sweep`` is the entry point for the command and for ``tritium analyze``.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import numpy as np

from tritium.perf.client import Session
from tritium.perf.engine import LevelOutcome, WindowCallback, measure_level, prepare_streams
from tritium.perf.errors import PerfError
from tritium.perf.report import LevelReport, ServerBreakdown

LevelCallback = Callable[[LevelReport], None]


def level_report(outcome: LevelOutcome, batch_size: int) -> LevelReport:
    latencies_us = np.asarray(outcome.latencies_ns, dtype=np.float64) / 1000
    throughput = len(latencies_us) / outcome.elapsed_s if outcome.elapsed_s else 0.0

    def percentile(p: float) -> float:
        return float(np.percentile(latencies_us, p)) if len(latencies_us) else 0.0

    return LevelReport(
        concurrency=outcome.level.concurrency, throughput=throughput, inferences_per_s=throughput * batch_size,
        p50_us=percentile(50), p90_us=percentile(90), p95_us=percentile(95), p99_us=percentile(99),
        mean_us=float(latencies_us.mean()) if len(latencies_us) else 0.0, errors=0, first_error="",
        server=ServerBreakdown.between(outcome.stats_before, outcome.stats_after),
        request_rate=outcome.level.request_rate, requests=len(latencies_us), stable=outcome.stable,
        windows=outcome.windows, latencies_us=tuple(latencies_us.tolist()))


async def sweep(settings, on_window: WindowCallback | None = None,
                on_level: LevelCallback | None = None) -> list[LevelReport]:
    # request-rate mode keeps as many requests in flight as the server lets pile up
    widest = max(max(level.concurrency for level in settings.levels), 256 if settings.levels[0].is_rate else 1)
    session = await Session.open(settings, connections=widest)
    try:
        if session.info.is_decoupled:
            raise PerfError(f"model '{settings.model}' is decoupled; tritium perf measures "
                            f"request/response models only")
        streams = prepare_streams(session, settings)
        await session.register_regions()
        reports = []
        for level in settings.levels:
            outcome = await measure_level(session, settings, streams, level, on_window)
            reports.append(level_report(outcome, settings.batch_size))
            if on_level:
                on_level(reports[-1])
        return reports
    finally:
        await session.close()


def run_sweep(settings, on_window: WindowCallback | None = None,
              on_level: LevelCallback | None = None) -> list[LevelReport]:
    return asyncio.run(sweep(settings, on_window, on_level))
