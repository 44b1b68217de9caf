"""Triton's latency summaries (``--metrics-config summary_latencies=true``).

Each summary has the count and sum of every observation, and quantiles of the observations of
about the last minute, as Triton's metrics library (prometheus-cpp) keeps them: a window of
``max_age`` seconds in ``age_buckets`` slices, the oldest slice dropped as time moves on.
prometheus-cpp estimates the quantiles within the error each one is given; here they are the
values observed at those ranks. A slice keeps at most ``SLICE_CAPACITY`` values, a uniform
sample of what it saw beyond that, so memory stays bounded at any request rate.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

# Triton's default summary quantiles, and its error for each (the error is not used here).
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
MAX_AGE_NS = 60 * 1_000_000_000   # prometheus-cpp's default window
AGE_BUCKETS = 5
SLICE_CAPACITY = 8_192


class _Slice:
    __slots__ = ("index", "values", "seen")

    def __init__(self, index: int) -> None:
        self.index = index          # which period of the clock it covers
        self.values = array("d")
        self.seen = 0               # observations in its period, kept or not


class WindowedQuantiles:
    """One summary: the count and sum of every observation, quantiles of the recent ones."""

    __slots__ = ("count", "total", "_slices", "_period_ns", "_ages")

    def __init__(self, max_age_ns: int = MAX_AGE_NS, age_buckets: int = AGE_BUCKETS) -> None:
        self.count = 0
        self.total = 0.0
        self._period_ns = max_age_ns // age_buckets
        self._ages = age_buckets
        self._slices: deque[_Slice] = deque(maxlen=age_buckets)

    def observe(self, value: float, now_ns: int) -> None:
        self.count += 1
        self.total += value
        index = now_ns // self._period_ns
        current = self._slices[-1] if self._slices else None
        if current is None or current.index != index:
            current = _Slice(index)
            self._slices.append(current)   # (the deque's bound drops the oldest slice)
        current.seen += 1
        if len(current.values) < SLICE_CAPACITY:
            current.values.append(value)
        else:   # a uniform sample of the period's observations
            place = random.randrange(current.seen)
            if place < SLICE_CAPACITY:
                current.values[place] = value

    def quantiles(self, ranks: tuple[float, ...], now_ns: int) -> list[float]:
        """The values at ``ranks`` among the observations of the window ending ``now_ns``; NaN
        when there are none, as prometheus-cpp writes an empty summary's quantiles."""
        oldest = now_ns // self._period_ns - self._ages + 1
        slices = [s for s in list(self._slices) if s.index >= oldest and len(s.values)]
        if not slices:
            return [float("nan")] * len(ranks)
        # Copies (tobytes), not views: a view would hold the array's buffer, and the broker's loop,
        # appending meanwhile on its own thread, may not grow an array whose buffer is held.
        copies = [(np.frombuffer(s.values.tobytes(), dtype=np.float64), s.seen) for s in slices]
        values = np.concatenate([kept for kept, _ in copies])
        # Each kept value stands for seen/kept observations of its slice: a busy slice's sample
        # weighs what the slice saw, not what it kept.
        weights = np.concatenate([np.full(len(kept), max(seen, len(kept)) / len(kept)) for kept, seen in copies])
        order = np.argsort(values, kind="stable")
        cumulative = np.cumsum(weights[order])
        places = np.searchsorted(cumulative, np.asarray(ranks) * cumulative[-1] * (1 - 1e-12), side="left")
        return [float(values[order[min(place, len(order) - 1)]]) for place in places]


@dataclass(slots=True)
class LatencySummaries:
    """A model version's summaries, each observed in whole microseconds as Triton observes them."""

    request: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    queue: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    compute_input: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    compute_infer: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    compute_output: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    cache_hit: WindowedQuantiles = field(default_factory=WindowedQuantiles)
    cache_miss: WindowedQuantiles = field(default_factory=WindowedQuantiles)

    def observe_success(self, total_ns: int, queue_ns: int, timings: tuple[int, int, int], now_ns: int) -> None:
        self.request.observe(total_ns // 1000, now_ns)
        self.queue.observe(queue_ns // 1000, now_ns)
        self.compute_input.observe(timings[0] // 1000, now_ns)
        self.compute_infer.observe(timings[1] // 1000, now_ns)
        self.compute_output.observe(timings[2] // 1000, now_ns)


def parse_quantiles(text: str) -> tuple[tuple[tuple[float, float], ...], list[str]]:
    """``summary_quantiles`` as Triton reads it: ``quantile:error`` pairs separated by commas; a
    pair that does not parse is skipped (and returned in the second list, for a warning)."""
    pairs, bad = [], []
    for item in text.split(","):
        pair = _quantile_pair(item)
        if pair is None:
            bad.append(item)
        else:
            pairs.append(pair)
    return tuple(pairs), bad


def _quantile_pair(text: str) -> tuple[float, float] | None:
    rank, colon, error = text.partition(":")
    try:
        pair = (float(rank), float(error))
    except ValueError:
        return None
    return pair if colon and 0 <= pair[0] <= 1 else None
