"""Per model-version statistics, with the meaning Triton's statistics extension gives them.

Counts in ``inference_stats`` are per request (a request of batch 8 counts once);
``inference_count`` counts inferences (that request counts 8); ``execution_count`` and
``batch_stats`` count model executions. Every ns value is cumulative, so clients such
as perf_analyzer can take deltas between two reads.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from tritium.broker.latency_summary import LatencySummaries


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchSizeStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelVersionStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)    # lookups answered from the response cache
    cache_miss: Duration = field(default_factory=Duration)   # lookups that missed, plus the insert after
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchSizeStats] = field(default_factory=dict)
    # Failed requests by Triton's metric reason: REJECTED, CANCELED, BACKEND, OTHER.
    failures: dict[str, int] = field(default_factory=dict)
    # Optional latency histogram (--metrics-config histogram_latencies=true): bucket bounds in ms.
    histogram_bounds_ms: tuple[float, ...] = ()
    histogram_counts: list[int] = field(default_factory=list)
    histogram_sum_ms: int = 0
    # Optional latency summaries (--metrics-config summary_latencies=true).
    summaries: LatencySummaries | None = None

    def record_execution(self, batch_size: int, timings: tuple[int, int, int]) -> None:
        compute_input, compute_infer, compute_output = timings
        self.execution_count += 1
        per_size = self.batches.get(batch_size)
        if per_size is None:
            per_size = self.batches[batch_size] = BatchSizeStats()
        per_size.compute_input.add(compute_input)
        per_size.compute_infer.add(compute_infer)
        per_size.compute_output.add(compute_output)

    def enable_histogram(self, bounds_ms: tuple[float, ...]) -> None:
        self.histogram_bounds_ms = tuple(sorted(bounds_ms))
        self.histogram_counts = [0] * (len(self.histogram_bounds_ms) + 1)

    def observe_first_response(self, since_arrival_ns: int) -> None:
        """A request's first response left (a decoupled model's first of many, or the one answer):
        the first-response histogram counts it in whole milliseconds, as Triton does."""
        if self.histogram_counts:
            milliseconds = since_arrival_ns // 1_000_000
            self.histogram_counts[bisect.bisect_left(self.histogram_bounds_ms, milliseconds)] += 1
            self.histogram_sum_ms += milliseconds

    def record_success(self, total_ns: int, queue_ns: int, batch_size: int,
                       timings: tuple[int, int, int]) -> None:
        self.record_successes(1, total_ns, queue_ns, batch_size, timings)
        if self.summaries is not None:
            self.summaries.observe_success(total_ns, queue_ns, timings, time.monotonic_ns())

    def record_successes(self, count: int, total_ns: int, queue_ns: int, inferences: int,
                         timings: tuple[int, int, int]) -> None:
        """``count`` successes of one batch at once: their summed durations, their batch's timings."""
        self.success.add(total_ns, count)
        self.queue.add(queue_ns, count)
        self.compute_input.add(timings[0] * count, count)
        self.compute_infer.add(timings[1] * count, count)
        self.compute_output.add(timings[2] * count, count)
        self.inference_count += inferences
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_hit(self, total_ns: int) -> None:
        """A request answered from the response cache: a success without queue or compute."""
        self.observe_first_response(total_ns)
        self.success.add(total_ns)
        self.queue.add(0)
        self.cache_hit.add(total_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000
        if self.summaries is not None:
            now = time.monotonic_ns()
            self.summaries.queue.observe(0, now)
            self.summaries.cache_hit.observe(total_ns // 1000, now)

    def record_cache_miss(self, lookup_ns: int) -> None:
        """A lookup that found nothing (the insert after it adds to ``cache_miss.ns`` alone)."""
        self.cache_miss.add(lookup_ns)
        if self.summaries is not None:
            self.summaries.cache_miss.observe(lookup_ns // 1000, time.monotonic_ns())

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        self.fail.add(total_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def as_dict(self, name: str, version: int) -> dict:
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size,
                 "compute_input": s.compute_input.as_dict(),
                 "compute_infer": s.compute_infer.as_dict(),
                 "compute_output": s.compute_output.as_dict()}
                for size, s in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
