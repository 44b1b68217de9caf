"""What a perf run was asked to do, read from perf_analyzer's flags."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadLevel:
    """One point of a sweep: a fixed number of requests in flight, or a request rate."""

    concurrency: int = 0
    request_rate: float = 0.0

    @property
    def is_rate(self) -> bool:
        return self.request_rate > 0

    @property
    def value(self) -> float:
        return self.request_rate if self.is_rate else self.concurrency

    def __str__(self) -> str:
        return f"request rate {self.request_rate:g}/s" if self.is_rate else f"concurrency {self.concurrency}"


@dataclass(frozen=True)
class Measurement:
    """How each level is measured: windows until three in a row agree (perf_analyzer's rule)."""

    interval_ms: float = 5000.0          # time_windows: length of one window
    request_count: int = 50              # count_windows: requests in one window
    count_windows: bool = False
    stability_percent: float = 10.0
    max_trials: int = 10
    stable_windows: int = 3
    percentile: int | None = None        # None: stability on the average latency, as perf_analyzer
    warmup_s: float = 0.0
    require_stable: bool = True          # False: keep the last windows of an unstable level


@dataclass(frozen=True)
class Sequences:
    """Sequence models: ids, lengths and how many run at once in request-rate mode."""

    id_start: int = 1
    id_end: int = 2**32 - 1
    length: int = 20
    variation_percent: float = 20.0
    count: int = 4


@dataclass(frozen=True)
class PerfSettings:
    model: str
    url: str
    protocol: str = "http"               # http | grpc
    version: str = ""
    batch_size: int = 1
    levels: tuple[LoadLevel, ...] = (LoadLevel(concurrency=1),)
    distribution: str = "constant"       # request-rate mode: constant | poisson
    shared_memory: str = "none"          # none | system
    input_data: str = "random"           # random | zero | a JSON file
    shapes: dict[str, list[int]] = field(default_factory=dict)
    string_length: int = 128
    binary_tensors: bool = True
    measurement: Measurement = Measurement()
    sequences: Sequences = Sequences()
    server_stats: bool = True
    request_timeout_s: float = 60.0


def parse_int_range(text: str) -> list[int]:
    """``start:end:step`` (perf_analyzer; ``xN`` multiplies) or ``a,b,c`` (tritium's form)."""
    if "," in text or ":" not in text:
        return [int(v) for v in text.split(",") if v.strip()]
    parts = text.split(":")
    start = int(parts[0])
    end = int(parts[1]) if len(parts) > 1 and parts[1] else start
    step = parts[2] if len(parts) > 2 else "1"
    return [int(v) for v in _walk(start, end, step)]


def parse_float_range(text: str) -> list[float]:
    if "," in text or ":" not in text:
        return [float(v) for v in text.split(",") if v.strip()]
    parts = text.split(":")
    start = float(parts[0])
    end = float(parts[1]) if len(parts) > 1 and parts[1] else start
    return list(_walk(start, end, parts[2] if len(parts) > 2 else "1"))


def _walk(start, end, step: str):
    multiply = step.startswith("x")
    amount = float(step[1:]) if multiply else float(step)
    if amount <= (1 if multiply else 0) or start <= 0 or end < start:
        raise ValueError(f"'{start}:{end}:{step}' is not an increasing range of positive values")
    value = start
    while value <= end + 1e-9:
        yield value
        value = value * amount if multiply else value + amount
