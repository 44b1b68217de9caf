"""The custom metrics Python models make (``pb_utils.MetricFamily``), added up over their instances.

Each instance's heartbeat carries everything it did to each series (tritium/pb_utils/metrics.py);
a series (a family name and a set of labels) is one on the server, as in Triton, where every
instance updates the same metric: counters and histograms are the sum over the instances, and
what an instance that is gone had counted stays counted while another instance still holds the
series; a gauge is the latest ``set`` heard of plus the increments every instance made since.
A series goes away with the last instance that holds it, a family with its last series.

Written by the broker's loop (``report``, ``forget``), read by the metrics server's thread
(``families``): a lock between them. A scrape first has the loop ask every instance of a
Python model for its latest figures and waits for their answers (``asked``, ``heard``), so
that it shows every change a model made before it, as Triton's ``/metrics`` does.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from tritium.broker.exposition import number_text

log = logging.getLogger(__name__)

KINDS = ("counter", "gauge", "histogram")
Labels = tuple[tuple[str, str], ...]


class _Series:
    """One series on the server: the last state each instance holding it reported, and what
    the instances gone left in it."""

    def __init__(self, kind: str, bounds: list[float] | None = None) -> None:
        self.kind = kind
        self.held: dict[bytes, list] = {}      # instance -> its last reported state
        self.bounds = bounds or []             # histogram: the first reporter's buckets
        self.left = 0.0                        # counter: totals, gauge: increments, of instances gone
        self.left_counts = [0] * (len(self.bounds) + 1)
        self.left_sum = 0.0
        self.base: float | None = None         # gauge: the latest set heard of
        self.offsets: dict[bytes, float] = {}  # gauge: each instance's increments made before that set

    def update(self, iid: bytes, state: list) -> None:
        before = self.held.get(iid)
        self.held[iid] = state
        if self.kind != "gauge":
            return
        sets, last_set, increments = state
        if sets and (before is None or sets > before[0]):   # a set newer than any heard of
            self.base, self.left = last_set, 0.0
            self.offsets = {other: held[2] for other, held in self.held.items() if other != iid}
        self.offsets.setdefault(iid, 0.0)

    def forget(self, iid: bytes) -> None:
        state = self.held.pop(iid)
        if self.kind == "counter":
            self.left += state[0]
        elif self.kind == "gauge":
            self.left += state[2] - self.offsets.pop(iid, 0.0)
        else:
            for bucket, count in enumerate(self._counts(state)):
                self.left_counts[bucket] += count
            self.left_sum += state[2]

    def value(self) -> float:
        if self.kind == "counter":
            return self.left + sum(state[0] for state in self.held.values())
        return (self.base or 0.0) + self.left + sum(state[2] - self.offsets.get(iid, 0.0)
                                                    for iid, state in self.held.items())

    def histogram(self) -> tuple[list[int], float]:
        """(count per bucket, the last +Inf; sum) over the instances."""
        counts = list(self.left_counts)
        total = self.left_sum
        for state in self.held.values():
            for bucket, count in enumerate(self._counts(state)):
                counts[bucket] += count
            total += state[2]
        return counts, total

    def _counts(self, state: list) -> list[int]:
        """An instance's bucket counts in this series' buckets (an instance that made the series
        with other buckets has each of its counts placed in the first bucket that holds it)."""
        bounds, counts = state[0], state[1]
        if bounds == self.bounds:
            return counts
        placed = [0] * (len(self.bounds) + 1)
        for upper, count in zip([*bounds, math.inf], counts):
            placed[next((i for i, bound in enumerate(self.bounds) if upper <= bound), len(self.bounds))] += count
        return placed


@dataclass
class _Family:
    name: str
    description: str      # the first instance's, as Triton keeps the first description
    kind: str
    series: dict[Labels, _Series] = field(default_factory=dict)


class CustomMetrics:
    """Every model's custom metric families, by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._refused: set[tuple[str, str]] = set()   # (family, kind) conflicts already logged
        # The ask out (the broker loop's alone): its number, the instances yet to answer, and the
        # scrapes waiting for it (one that comes meanwhile waits for it too rather than asking again).
        self._ask: tuple[int, set[bytes], list[threading.Event]] | None = None

    def waiting(self, done: threading.Event) -> bool:
        """Whether an ask is out; if so, ``done`` is set with it (the loop's side)."""
        if self._ask is None:
            return False
        self._ask[2].append(done)
        return True

    def asked(self, number: int, iids: set[bytes], done: threading.Event) -> None:
        """METRICS_ASK ``number`` went to these instances; ``done`` is set once each answered it."""
        if iids:
            self._ask = (number, iids, [done])
        else:
            done.set()

    def heard(self, iid: bytes, answered: int | None = None) -> None:
        """Instance ``iid``'s heartbeat came, the answer to METRICS_ASK ``answered`` (None: a
        periodic one, which may have been made before the ask and does not count)."""
        ask = self._ask
        if ask is None or answered is None or answered < ask[0]:
            return
        self._discard(iid)

    def _discard(self, iid: bytes) -> None:
        ask = self._ask
        if ask is None:
            return
        ask[1].discard(iid)
        if not ask[1] or all(done.is_set() for done in ask[2]):   # answered, or every scrape stopped waiting
            for done in ask[2]:
                done.set()
            self._ask = None

    def report(self, iid: bytes, families: list) -> None:
        """An instance's heartbeat: the state of every series it holds. A series it held before and
        reports no more (its ``Metric`` objects deleted) is forgotten for it."""
        held: set[tuple[str, Labels]] = set()
        with self._lock:
            for reported in families:
                try:
                    held.update(self._report_family(iid, *_checked_family(reported)))
                except (TypeError, ValueError):
                    log.warning("instance %s reported a custom metric family that cannot be read: %.200r",
                                iid.decode(errors="replace"), reported)
            self._forget(iid, keep=held)

    def _report_family(self, iid: bytes, name: str, description: str, kind: str,
                       series: list[tuple[Labels, list]]) -> list[tuple[str, Labels]]:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, description, kind)
        elif family.kind != kind:
            if (name, kind) not in self._refused:
                self._refused.add((name, kind))
                log.warning("custom metric family %s is a %s; instance %s made it a %s: its series are left out",
                            name, family.kind, iid.decode(errors="replace"), kind)
            return []
        for labels, state in series:
            shared = family.series.get(labels)
            if shared is None:
                shared = family.series[labels] = _Series(kind, state[0] if kind == "histogram" else None)
            shared.update(iid, state)
        return [(name, labels) for labels, _ in series]

    def forget(self, iid: bytes) -> None:
        """The instance is gone: what it counted stays in the series other instances hold."""
        with self._lock:
            self._forget(iid)
        self._discard(iid)   # it will not answer

    def _forget(self, iid: bytes, keep: AbstractSet[tuple[str, Labels]] = frozenset()) -> None:
        for name, family in list(self._families.items()):
            for labels, series in list(family.series.items()):
                if iid in series.held and (name, labels) not in keep:
                    series.forget(iid)
                    if not series.held:
                        del family.series[labels]
            if not family.series:
                del self._families[name]

    def families(self, taken: set[str]) -> list[Metric]:
        """The families as Prometheus metrics, Triton's order of samples; a family named as one of
        ``taken`` (the server's own) is left out, with a warning the first time."""
        with self._lock:
            kept = []
            for name, family in self._families.items():
                if name in taken or name.removesuffix("_total") in taken:
                    if (name, "taken") not in self._refused:
                        self._refused.add((name, "taken"))
                        log.warning("custom metric family %s is named as one of the server's own: left out", name)
                    continue
                kept.append(_metric(family))
            return kept


def _checked_family(reported) -> tuple[str, str, str, list[tuple[Labels, list]]]:
    """(name, description, kind, [(labels, state)]) of a reported family; ValueError or TypeError
    for anything else, before any of it is kept."""
    name, description, kind, series = reported
    if not isinstance(name, str) or not isinstance(description, str) or type(kind) is not int \
            or not 0 <= kind < len(KINDS) or not isinstance(series, list):
        raise ValueError("not a family")
    return name, description, KINDS[kind], [_checked_series(KINDS[kind], *entry) for entry in series]


def _checked_series(kind: str, labels: list, state: list) -> tuple[Labels, list]:
    pairs = tuple((label, value) for label, value in labels)
    if not all(isinstance(text, str) for pair in pairs for text in pair):
        raise ValueError("labels are not strings")
    if kind == "counter":
        (total,) = state
        return pairs, [_real(total)]
    if kind == "gauge":
        sets, last_set, increments = state
        if type(sets) is not int:
            raise ValueError("not a count of sets")
        return pairs, [sets, None if last_set is None else _real(last_set), _real(increments)]
    bounds, counts, total = state
    if len(counts) != len(bounds) + 1 or not all(type(count) is int for count in counts):
        raise ValueError("not a histogram's counts")
    return pairs, [[_real(bound) for bound in bounds], list(counts), _real(total)]


def _real(value) -> float:
    if type(value) not in (int, float):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _metric(family: _Family) -> Metric:
    metric = Metric(family.name, family.description, family.kind)
    metric.name = family.name   # as the model named it (Metric drops a counter's "_total")
    for labels, series in family.series.items():
        sample_labels = dict(labels)
        if family.kind != "histogram":
            metric.add_sample(family.name, sample_labels, series.value())
            continue
        counts, total = series.histogram()
        metric.add_sample(f"{family.name}_count", sample_labels, sum(counts))
        metric.add_sample(f"{family.name}_sum", sample_labels, total)
        cumulative = 0
        for bound, count in zip([*series.bounds, math.inf], counts):
            cumulative += count
            metric.add_sample(f"{family.name}_bucket", {**sample_labels, "le": number_text(bound)}, cumulative)
    return metric



