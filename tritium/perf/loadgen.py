"""Closed-loop HTTP load at fixed concurrency, cheap enough to share two cores with a server.

Each of ``concurrency`` connections sends one pre-encoded request, waits for its
response, and sends the next: the same closed loop as perf_analyzer's concurrency
mode. Responses are parsed with httptools; nothing is decoded beyond the status.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httptools


@dataclass(frozen=True)
class Workload:
    host: str
    port: int
    request: bytes   # a complete HTTP/1.1 request, keep-alive


@dataclass
class LevelResult:
    concurrency: int
    latencies_ns: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    elapsed_s: float = 0.0

    @property
    def completed(self) -> int:
        return len(self.latencies_ns)

    @property
    def throughput(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_us(self, p: float) -> float:
        if not self.latencies_ns:
            return 0.0
        ordered = sorted(self.latencies_ns)
        index = min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered))) - 1))
        return ordered[index] / 1000

    @property
    def mean_us(self) -> float:
        return sum(self.latencies_ns) / len(self.latencies_ns) / 1000 if self.latencies_ns else 0.0


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.body = bytearray()
        self.lost: Exception | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(exc)

    def connection_lost(self, exc) -> None:
        self.lost = exc or ConnectionError("connection closed by the server")
        self._finish(self.lost)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self._finish(self.parser.get_status_code())

    def _finish(self, outcome) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if isinstance(outcome, Exception):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)

    async def send(self, request: bytes) -> int:
        self.body.clear()
        if self.transport is None:
            raise ConnectionError("send before the connection was made")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter


async def _worker(workload: Workload, result: LevelResult, stop_at: float, record_from: float,
                  budget: list[int]) -> None:
    loop = asyncio.get_running_loop()
    transport, connection = await loop.create_connection(_Connection, workload.host, workload.port)
    clock = time.perf_counter_ns
    try:
        while budget[0] != 0 and time.monotonic() < stop_at:
            budget[0] -= 1
            start = clock()
            status = await connection.send(workload.request)
            if time.monotonic() < record_from:
                continue
            if status == 200:
                result.latencies_ns.append(clock() - start)
            else:
                result.errors += 1
                if not result.first_error:
                    result.first_error = f"HTTP {status}: {bytes(connection.body[:300]).decode(errors='replace')}"
    finally:
        transport.close()


async def run_level(workload: Workload, concurrency: int, duration_s: float | None = None,
                    requests: int | None = None, warmup_s: float = 0.5) -> LevelResult:
    """Drive ``concurrency`` closed loops for ``duration_s`` (or ``requests`` in all)."""
    result = LevelResult(concurrency)
    now = time.monotonic()
    record_from = now + warmup_s
    stop_at = record_from + duration_s if duration_s else float("inf")
    budget = [requests + 0 if requests else -1]
    if requests:
        record_from = now  # a fixed request count records every request
    started = time.monotonic()
    await asyncio.gather(*(_worker(workload, result, stop_at, record_from, budget)
                           for _ in range(concurrency)))
    result.elapsed_s = time.monotonic() - max(started, record_from if not requests else started)
    return result
