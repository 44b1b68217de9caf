"""What a perf run reports: client throughput and latency, and the server's own breakdown.

The server-side figures are deltas of the statistics extension between the start and
the end of a level, exactly as perf_analyzer computes them.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass

from tritium.perf.loadgen import LevelResult

CSV_HEADER = ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
              "Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output",
              "Client Recv", "p50 latency", "p90 latency", "p95 latency", "p99 latency"]


@dataclass(frozen=True)
class ServerBreakdown:
    requests: int = 0
    executions: int = 0
    inferences: int = 0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    request_us: float = 0.0

    @property
    def average_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @classmethod
    def between(cls, before: dict | None, after: dict | None) -> "ServerBreakdown":
        if not before or not after:
            return cls()
        count = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]

        def per_request(key: str) -> float:
            delta = after["inference_stats"][key]["ns"] - before["inference_stats"][key]["ns"]
            return delta / count / 1000 if count else 0.0

        return cls(requests=count,
                   executions=after["execution_count"] - before["execution_count"],
                   inferences=after["inference_count"] - before["inference_count"],
                   queue_us=per_request("queue"), compute_input_us=per_request("compute_input"),
                   compute_infer_us=per_request("compute_infer"),
                   compute_output_us=per_request("compute_output"), request_us=per_request("success"))


@dataclass(frozen=True)
class LevelReport:
    concurrency: int
    throughput: float          # requests per second
    inferences_per_s: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    mean_us: float
    errors: int
    first_error: str
    server: ServerBreakdown

    @classmethod
    def of(cls, result: LevelResult, batch_size: int, server: ServerBreakdown) -> "LevelReport":
        return cls(result.concurrency, result.throughput, result.throughput * batch_size,
                   result.percentile_us(50), result.percentile_us(90), result.percentile_us(95),
                   result.percentile_us(99), result.mean_us, result.errors, result.first_error, server)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["server"]["average_batch"] = self.server.average_batch
        return data


def render(reports: list[LevelReport]) -> str:
    lines = [f"{'concurrency':>11} {'req/s':>9} {'infer/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
             f"{'errors':>6} {'avg batch':>9} {'queue us':>9} {'infer us':>9} {'server us':>9}"]
    for r in reports:
        lines.append(f"{r.concurrency:>11} {r.throughput:>9.0f} {r.inferences_per_s:>9.0f} "
                     f"{r.p50_us / 1000:>8.2f} {r.p90_us / 1000:>8.2f} {r.p99_us / 1000:>8.2f} "
                     f"{r.errors:>6} {r.server.average_batch:>9.1f} {r.server.queue_us:>9.0f} "
                     f"{r.server.compute_infer_us:>9.0f} {r.server.request_us:>9.0f}")
    for r in reports:
        if r.first_error:
            lines.append(f"first error at concurrency {r.concurrency}: {r.first_error}")
    return "\n".join(lines)


def write_csv(path: str, reports: list[LevelReport]) -> None:
    """perf_analyzer's CSV layout (times in microseconds), rows sorted by throughput."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_HEADER)
        for r in sorted(reports, key=lambda r: r.inferences_per_s):
            s = r.server
            server_side = s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us
            writer.writerow([r.concurrency, round(r.inferences_per_s, 1), 0,
                             round(max(0.0, r.mean_us - server_side)), round(s.queue_us),
                             round(s.compute_input_us), round(s.compute_infer_us),
                             round(s.compute_output_us), 0, round(r.p50_us), round(r.p90_us),
                             round(r.p95_us), round(r.p99_us)])
