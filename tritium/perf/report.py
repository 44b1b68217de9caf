"""What a perf run reports: client throughput and latency, and the server's own breakdown.

The server-side figures are deltas of the statistics extension between the start and
the end of a level, exactly as perf_analyzer computes them.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, field

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

        def delta(key: str, unit: str) -> int:
            # gRPC's JSON form leaves out zero counters, hence the defaults
            return (int(after.get("inference_stats", {}).get(key, {}).get(unit, 0))
                    - int(before.get("inference_stats", {}).get(key, {}).get(unit, 0)))

        count = delta("success", "count")

        def per_request(key: str) -> float:
            return delta(key, "ns") / count / 1000 if count else 0.0

        return cls(requests=count,
                   executions=int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)),
                   inferences=int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)),
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
    request_rate: float = 0.0     # request-rate mode: the rate asked for (concurrency is then 0)
    requests: int = 0             # requests completed in the measured windows
    stable: bool = True
    windows: int = 0
    latencies_us: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @property
    def level_value(self) -> float:
        return self.request_rate if self.request_rate else self.concurrency

    @property
    def level_name(self) -> str:
        return f"{self.request_rate:g}/s" if self.request_rate else str(self.concurrency)

    @classmethod
    def of(cls, result: LevelResult, batch_size: int, server: ServerBreakdown) -> "LevelReport":
        return cls(result.concurrency, result.throughput, result.throughput * batch_size,
                   result.percentile_us(50), result.percentile_us(90), result.percentile_us(95),
                   result.percentile_us(99), result.mean_us, result.errors, result.first_error, server)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("latencies_us")
        data["server"]["average_batch"] = self.server.average_batch
        return data


def render(reports: list[LevelReport]) -> str:
    """The table perf_analyzer users read: client latency percentiles, then the server's split."""
    first = "request/s" if any(r.request_rate for r in reports) else "concurrency"
    lines = [f"{first:>11} {'infer/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
             f"{'avg batch':>9} {'queue us':>9} {'input us':>9} {'infer us':>9} {'output us':>9} {'errors':>6}"]
    for r in reports:
        s = r.server
        lines.append(f"{r.level_name:>11} {r.inferences_per_s:>9.1f} {r.p50_us / 1000:>8.2f} "
                     f"{r.p90_us / 1000:>8.2f} {r.p95_us / 1000:>8.2f} {r.p99_us / 1000:>8.2f} "
                     f"{s.average_batch:>9.1f} {s.queue_us:>9.0f} {s.compute_input_us:>9.0f} "
                     f"{s.compute_infer_us:>9.0f} {s.compute_output_us:>9.0f} {r.errors:>6}")
    for r in reports:
        if r.first_error:
            lines.append(f"first error at {first} {r.level_name}: {r.first_error}")
    return "\n".join(lines)


def write_csv(path: str, reports: list[LevelReport]) -> None:
    """perf_analyzer's CSV layout (times in microseconds), rows sorted by throughput."""
    rate_mode = any(r.request_rate for r in reports)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow((["Request Rate"] if rate_mode else ["Concurrency"]) + CSV_HEADER[1:])
        for r in sorted(reports, key=lambda r: r.inferences_per_s):
            s = r.server
            server_side = s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us
            writer.writerow([f"{r.request_rate:g}" if rate_mode else r.concurrency,
                             round(r.inferences_per_s, 2), 0,
                             round(max(0.0, r.mean_us - server_side)), round(s.queue_us),
                             round(s.compute_input_us), round(s.compute_infer_us),
                             round(s.compute_output_us), 0, round(r.p50_us), round(r.p90_us),
                             round(r.p95_us), round(r.p99_us)])
