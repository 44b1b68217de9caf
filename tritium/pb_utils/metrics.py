"""Custom metrics of a Python model: ``pb_utils.MetricFamily`` and its ``Metric`` objects.

A model creates families (counter, gauge, histogram) and metrics in them, each metric a set of
labels, and updates them as it serves; the broker shows them on ``/metrics`` beside Triton's
own families. Every instance keeps what it did to each series in this process (``SERIES``),
and its heartbeat carries the whole of it to the broker, which adds up what the instances of
every model did to the same series (broker/custom_metrics.py): the same family name and labels
are one series on the server, as in Triton, where every instance updates one shared metric.
A ``/metrics`` scrape asks every instance for its latest figures first (the heartbeat thread
answers at once), so that it shows each change made before it, as Triton's does.

The checks and their error texts are Triton's, including the instance named in them.
"""

from __future__ import annotations

import enum
import os
import re
import threading
import weakref
from collections import deque
from numbers import Real

from tritium.pb_utils.types import PYBIND_CAST, TritonModelException, refused_by_server

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class _Series:
    """What this instance did to one series: a counter's increments, a gauge's last ``set`` and
    the increments since, a histogram's bucket counts and sum."""

    __slots__ = ("key", "refs", "kind", "total", "sets", "last_set", "bounds", "counts", "sum")

    def __init__(self, key: tuple, kind: MetricKind, bounds: list[float] | None) -> None:
        self.key = key            # (family name, labels)
        self.refs = 0             # the MetricFamily objects that made it: the series goes with the last
        self.kind = kind
        self.total = 0.0          # counter: the sum of increments; gauge: the increments since the last set
        self.sets = 0             # gauge: how many times it was set (the broker orders sets by it)
        self.last_set: float | None = None
        self.bounds = bounds or []
        self.counts = [0] * (len(self.bounds) + 1)   # histogram: per bucket, the last one +Inf
        self.sum = 0.0

    def wire(self) -> list:
        if self.kind is MetricKind.COUNTER:
            return [self.total]
        if self.kind is MetricKind.GAUGE:
            return [self.sets, self.last_set, self.total]
        return [self.bounds, list(self.counts), self.sum]


class _Store:
    """The families and series of this process; a lock, since a decoupled model updates its
    metrics from threads of its own while the heartbeat thread reads them.

    A series lives while a ``MetricFamily`` object that made it does: in Triton 2.51 a metric
    stays on the server when its ``Metric`` objects are gone (a ``Metric`` made and used in each
    ``execute`` keeps counting) and leaves with its family. A family collected only queues its
    series' release (a collection may run anywhere, even while this lock is held), applied under
    the lock next time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, tuple[MetricKind, str]] = {}
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        self.released: deque[_Series] = deque()

    def family(self, name: str, description: str, kind: MetricKind) -> None:
        with self.lock:
            known = self.families.setdefault(name, (kind, description))
        if known[0] is not kind:   # (Triton's server aborts here)
            raise refused_by_server("Error when creating MetricFamily", "Family name already exists with different type")

    def add(self, name: str, labels: tuple[tuple[str, str], ...], kind: MetricKind,
            bounds: list[float] | None, holder: set[_Series]) -> _Series:
        """The series of these labels, an existing one shared, as Triton's are; held by ``holder``
        (its family's series) until the family lets its series go."""
        with self.lock:
            self._release()
            series = self.series.get((name, labels))
            if series is None:
                series = self.series[(name, labels)] = _Series((name, labels), kind, bounds)
            if series not in holder:
                series.refs += 1
                holder.add(series)
            return series

    def wire(self) -> list | None:
        """Every family with its series, for the heartbeat: [name, description, kind, [[labels, state]]];
        None before the model made a family."""
        with self.lock:
            self._release()
            if not self.series:   # none ever made, or none left (the broker forgets what it held)
                return [] if self.families else None
            families: dict[str, list] = {}
            for (name, labels), series in self.series.items():
                kind, description = self.families[name]
                families.setdefault(name, [name, description, int(kind), []])[3].append(
                    [[list(pair) for pair in labels], series.wire()])
            return list(families.values())

    def _release(self) -> None:
        while self.released:
            series = self.released.popleft()
            series.refs -= 1
            if series.refs == 0 and self.series.get(series.key) is series:
                del self.series[series.key]


SERIES = _Store()
# A process the model forks gets a free lock: the heartbeat thread may hold it at the fork.
os.register_at_fork(after_in_child=lambda: setattr(SERIES, "lock", threading.Lock()))


class Metric:
    """One series of a family: the labels it was created with."""

    __slots__ = ("_series", "_cleared", "__weakref__")

    def __init__(self, series: _Series) -> None:
        self._series = series
        self._cleared = False   # its family was deleted first: it is gone from the server

    def increment(self, value: float) -> None:
        value = _number("increment", value)
        series = self._supporting("Failed to increment metric value", "Increment", MetricKind.COUNTER, MetricKind.GAUGE)
        if series.kind is MetricKind.COUNTER and value < 0:
            raise refused_by_server("Failed to increment metric value", "TRITONSERVER_METRIC_KIND_COUNTER can only be "
                                                               "incremented monotonically by non-negative values.")
        with SERIES.lock:
            series.total += value

    def set(self, value: float) -> None:
        value = _number("set", value)
        series = self._supporting("Failed to set metric value", "Set", MetricKind.GAUGE)
        with SERIES.lock:
            series.sets += 1
            series.last_set, series.total = value, 0.0

    def observe(self, value: float) -> None:
        value = _number("observe", value)
        series = self._supporting("Failed to observe metric value", "Observe", MetricKind.HISTOGRAM)
        bucket = next((i for i, bound in enumerate(series.bounds) if value <= bound), len(series.bounds))
        with SERIES.lock:
            series.counts[bucket] += 1
            series.sum += value

    def value(self) -> float:
        """The series' value as this instance made it (the server adds up every instance's)."""
        series = self._supporting("Failed to get metric value", "Value", MetricKind.COUNTER, MetricKind.GAUGE)
        with SERIES.lock:
            return series.total + (series.last_set or 0.0)

    def _supporting(self, failed: str, operation: str, *kinds: MetricKind) -> _Series:
        """The series, if its kind supports ``operation`` (Triton's server refuses it otherwise)."""
        if self._cleared:
            raise TritonModelException(f"{failed}: Invalid metric operation as the corresponding 'MetricFamily' has "
                                       "been deleted. The 'MetricFamily' object should be deleted AFTER its "
                                       "corresponding 'Metric' objects have been deleted.")
        if self._series.kind not in kinds:
            raise refused_by_server(failed, f"TRITONSERVER_METRIC_KIND_{self._series.kind.name} does not support {operation}")
        return self._series


class MetricFamily:
    """A named family of one kind; ``Metric(labels, buckets)`` makes or finds its series."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str) or not isinstance(kind, MetricKind):
            raise TypeError("__init__(): incompatible constructor arguments. The following argument types are "
                            "supported:\n    1. c_python_backend_utils.MetricFamily(name: str, description: str, "
                            f"kind: c_python_backend_utils.MetricKind)\n\nInvoked with: {name!r}, {description!r}, "
                            f"{kind!r}")
        if not _NAME.fullmatch(name):
            raise refused_by_server("Error when creating MetricFamily", "Invalid metric name")
        name, description = str(name), str(description)   # (a subclass of str would not reach the broker)
        SERIES.family(name, description, kind)
        self._name, self._kind = name, kind
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        self._series: set[_Series] = set()

    def __del__(self) -> None:
        """As in Triton, deleting a family deletes the metrics made from it: they leave the
        server, and using one that is still held raises."""
        for metric in list(getattr(self, "_metrics", ())):
            metric._cleared = True
        SERIES.released.extend(getattr(self, "_series", ()))

    def Metric(self, labels: dict | None = None, buckets: list | None = None) -> Metric:  # noqa: N802 (Triton's name)
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        bounds = None
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind is not MetricKind.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            if not all(isinstance(bound, Real) for bound in buckets):
                raise RuntimeError(PYBIND_CAST)
            bounds = [float(bound) for bound in buckets]
        elif self._kind is MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        pairs = _label_pairs(labels or {})
        if bounds is not None and any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise refused_by_server("Error when creating Metric", "Bucket Boundaries must be strictly sorted")
        metric = Metric(SERIES.add(self._name, pairs, self._kind, bounds, self._series))
        self._metrics.add(metric)
        return metric


def _label_pairs(labels: dict) -> tuple[tuple[str, str], ...]:
    """The labels sorted by name (Triton's order on /metrics), checked as Triton's server checks them."""
    pairs = []
    for name, value in labels.items():
        if not isinstance(value, str):
            raise refused_by_server("Error when creating Metric", "attempt to access JSON non-string as string")
        name = str(name)   # (keys reach Triton's server through JSON, which makes them strings)
        if not _LABEL.fullmatch(name) or name.startswith("__"):   # (Triton's server aborts here)
            raise refused_by_server("Error when creating Metric", f"Invalid label name '{name}'")
        pairs.append((name, str(value)))   # a str, not a subclass of it: what reaches the broker
    return tuple(sorted(pairs))


def _number(method: str, value) -> float:
    if not isinstance(value, Real):
        raise TypeError(f"{method}(): incompatible function arguments. The following argument types are "
                        f"supported:\n    1. (self: c_python_backend_utils.Metric, arg0: float) -> None\n\n"
                        f"Invoked with: {value!r}")
    return float(value)
