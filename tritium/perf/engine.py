"""The measuring loop: drive one load level, cut it into windows, stop when three agree.

Load keeps running across windows, so a window starts with requests already in flight,
as with perf_analyzer. A level's figures are the union of its last ``stable_windows``
windows; the server's breakdown is the statistics delta over the same span.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tritium.perf import inputs
from tritium.perf.client import Prepared, Session, server_message
from tritium.perf.errors import RequestsRejected, Unstable
from tritium.perf.settings import LoadLevel, PerfSettings


@dataclass(frozen=True)
class Window:
    latencies_ns: tuple[int, ...]
    elapsed_s: float
    stats_before: dict | None

    @property
    def throughput(self) -> float:
        return len(self.latencies_ns) / self.elapsed_s if self.elapsed_s else 0.0

    def latency_ns(self, percentile: int | None) -> float:
        if not self.latencies_ns:
            return 0.0
        if percentile is None:
            return float(np.mean(self.latencies_ns))
        return float(np.percentile(self.latencies_ns, percentile))


@dataclass(frozen=True)
class LevelOutcome:
    level: LoadLevel
    latencies_ns: tuple[int, ...]
    elapsed_s: float
    windows: int
    stable: bool
    stats_before: dict | None
    stats_after: dict | None


WindowCallback = Callable[[LoadLevel, int, Window], None]


@dataclass
class _Tally:
    """What the load tasks record while a window is open."""

    latencies_ns: list[int] = field(default_factory=list)
    failed: int = 0
    first_error: str = ""
    stop: bool = False

    def take(self) -> list[int]:
        taken, self.latencies_ns = self.latencies_ns, []
        return taken


@dataclass
class _Sequence:
    """One sequence in progress: its id, the stream it walks, and how far it got."""

    sequence_id: int
    stream: list[Prepared]
    length: int
    step: int = 0

    def next_request(self) -> tuple[Prepared, dict]:
        """The next request and its flags, and one step on."""
        flags = {"sequence_id": self.sequence_id, "start": self.step == 0, "end": self.step == self.length - 1}
        request = self.stream[self.step % len(self.stream)]
        self.step += 1
        return request, flags

    @property
    def done(self) -> bool:
        return self.step >= self.length


class _Sequences:
    """Sequence ids and lengths as perf_analyzer hands them out: each sequence walks one stream."""

    def __init__(self, settings: PerfSettings, streams: list[list[Prepared]]) -> None:
        self.streams = streams
        self.spec = settings.sequences
        self.ids = itertools.count(self.spec.id_start)
        self.stream_picker = itertools.cycle(range(len(streams)))
        self.rng = random.Random(0)

    def new(self) -> _Sequence:
        sequence_id = next(self.ids)
        if sequence_id > self.spec.id_end:
            self.ids = itertools.count(self.spec.id_start + 1)
            sequence_id = self.spec.id_start
        stream = self.streams[next(self.stream_picker)]
        return _Sequence(sequence_id, stream, len(stream) if len(stream) > 1 else self._length())

    def _length(self) -> int:
        spread = self.spec.length * self.spec.variation_percent / 100
        return max(1, round(self.spec.length + self.rng.uniform(-spread, spread)))

    def advance(self, slots: list[_Sequence], index: int) -> tuple[Prepared, dict]:
        """The next request of sequence slot ``index``; a finished sequence makes way for a new one."""
        request, flags = slots[index].next_request()
        if slots[index].done:
            slots[index] = self.new()
        return request, flags


class LoadDriver:
    """Sends one model's requests for one level, recording each latency into the tally."""

    def __init__(self, session: Session, settings: PerfSettings, streams: list[list[Prepared]]) -> None:
        self.session = session
        self.settings = settings
        self.next_request = itertools.cycle([request for stream in streams for request in stream])
        self.sequences = _Sequences(settings, streams) if session.info.is_sequence else None

    async def _one(self, tally: _Tally, request: Prepared, flags: dict) -> None:
        start = time.perf_counter_ns()
        try:
            await self.session.infer(request, **flags)
        except Exception as exc:
            tally.failed += 1
            tally.first_error = tally.first_error or server_message(exc)
            return
        tally.latencies_ns.append(time.perf_counter_ns() - start)

    async def closed_loop(self, tally: _Tally) -> None:
        sequences = self.sequences
        slots = [sequences.new()] if sequences else []
        while not tally.stop:
            request, flags = sequences.advance(slots, 0) if sequences else (next(self.next_request), {})
            await self._one(tally, request, flags)

    async def open_loop(self, tally: _Tally, rate: float) -> None:
        """Requests at ``rate`` per second, constant or Poisson, whether or not answers keep up."""
        rng = random.Random(0)
        sequences = self.sequences
        slots = [sequences.new() for _ in range(self.settings.sequences.count)] if sequences else []
        picker = itertools.cycle(range(len(slots)))
        in_flight: set[asyncio.Task] = set()
        due = time.monotonic()
        while not tally.stop:
            due += rng.expovariate(rate) if self.settings.distribution == "poisson" else 1 / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            request, flags = (sequences.advance(slots, next(picker)) if sequences and slots
                              else (next(self.next_request), {}))
            task = asyncio.ensure_future(self._one(tally, request, flags))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.settings.request_timeout_s)

    def start(self, level: LoadLevel, tally: _Tally) -> list[asyncio.Task]:
        if level.is_rate:
            return [asyncio.ensure_future(self.open_loop(tally, level.request_rate))]
        return [asyncio.ensure_future(self.closed_loop(tally)) for _ in range(level.concurrency)]


def prepare_streams(session: Session, settings: PerfSettings) -> list[list[Prepared]]:
    specs = inputs.input_specs(session.info.metadata, session.info.batching, settings.shapes)
    if settings.input_data in ("random", "zero"):
        streams = inputs.generated_steps(specs, settings.input_data == "random", settings.string_length)
    else:
        streams = inputs.file_steps(settings.input_data, specs)
    counter = itertools.count()
    return [[session.prepare(inputs.batched(step, settings.batch_size, session.info.batching), next(counter))
             for step in stream] for stream in streams]


def is_stable(windows: list[Window], settings: PerfSettings) -> bool:
    rule = settings.measurement
    recent = windows[-rule.stable_windows:]
    if len(recent) < rule.stable_windows or any(not w.latencies_ns for w in recent):
        return False
    limit = rule.stability_percent / 100
    for values in ([w.throughput for w in recent], [w.latency_ns(rule.percentile) for w in recent]):
        mean = sum(values) / len(values)
        if mean and any(abs(v - mean) / mean > limit for v in values):
            return False
    return True


async def _window(session: Session, settings: PerfSettings, tally: _Tally) -> Window:
    rule = settings.measurement
    tally.take()   # windows follow each other without a gap; the snapshot is taken inside the window
    started = time.monotonic()
    before = await session.statistics() if settings.server_stats else None
    if rule.count_windows:
        while len(tally.latencies_ns) < rule.request_count and not tally.failed:
            await asyncio.sleep(0.005)
    else:
        end = started + rule.interval_ms / 1000
        while time.monotonic() < end and not tally.failed:
            await asyncio.sleep(min(0.02, max(0.0, end - time.monotonic())))
    return Window(tuple(tally.take()), time.monotonic() - started, before)


async def measure_level(session: Session, settings: PerfSettings, streams: list[list[Prepared]],
                        level: LoadLevel, on_window: WindowCallback | None = None) -> LevelOutcome:
    tally = _Tally()
    tasks = LoadDriver(session, settings, streams).start(level, tally)
    rule = settings.measurement
    windows: list[Window] = []
    try:
        if rule.warmup_s:
            await asyncio.sleep(rule.warmup_s)
        while len(windows) < max(rule.max_trials, rule.stable_windows):
            windows.append(await _window(session, settings, tally))
            if tally.failed:
                raise RequestsRejected(str(level), tally.failed, tally.first_error)
            if on_window:
                on_window(level, len(windows), windows[-1])
            if is_stable(windows, settings):
                break
        after = await session.statistics() if settings.server_stats else None
    finally:
        tally.stop = True
        await _finish(tasks, settings.request_timeout_s)
    stable = is_stable(windows, settings)
    if not stable and rule.require_stable:
        raise Unstable(str(level), len(windows))
    kept = windows[-rule.stable_windows:]
    return LevelOutcome(level, tuple(itertools.chain.from_iterable(w.latencies_ns for w in kept)),
                        sum(w.elapsed_s for w in kept), len(windows), stable, kept[0].stats_before, after)


async def _finish(tasks: list[asyncio.Task], timeout_s: float) -> None:
    done, pending = await asyncio.wait(tasks, timeout=timeout_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    for task in done:
        task.exception()  # retrieved, so asyncio does not warn about it
