"""Triton's gRPC keepalive and connection-age settings, and the timers one connection runs for them.

The server pings a connection that has been silent for ``time_ms`` and closes it when nothing
at all (the PING's acknowledgement included) comes back within ``timeout_ms``: a client that
vanished without closing (a crashed host, a dropped NAT entry) stops holding its calls. A
connection older than ``max_age_ms`` (give or take 10%, so that a fleet's connections do not
all cycle at once) is told GOAWAY, which clients answer by opening a new connection, the way
a load balancer in front of many servers gets to spread them again; it closes when its calls
are done, or ``max_age_grace_ms`` after the GOAWAY. A client that pings more often than
``min_recv_ping_interval_ms`` while the server sends it nothing (every two hours at most when
it has no calls in flight, unless ``permit_without_calls``) gets a strike per ping; past
``max_ping_strikes`` it is told GOAWAY ENHANCE_YOUR_CALM ("too_many_pings") and dropped.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from tritium.gateway.grpc_http2 import Http2Connection

_JITTER = 0.1
_IDLE_PING_INTERVAL_S = 2 * 3600   # a connection without calls: TCP keepalive's pace


@dataclass(frozen=True, slots=True)
class GrpcKeepalive:
    """Triton's flags and defaults (``--grpc-keepalive-*``, ``--grpc-http2-*``,
    ``--grpc-max-connection-age*``), in milliseconds; 0 means off."""

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2     # pings the server sends with no data or headers between them (0: any)
    max_age_ms: int = 0
    max_age_grace_ms: int = 0           # 0: a connection past its age waits for its calls however long
    min_recv_ping_interval_ms: int = 300_000   # client pings sooner than this, with no data sent, are strikes
    max_ping_strikes: int = 2           # strikes tolerated (0: any number)


def too_many_pings(settings: GrpcKeepalive, http2: Http2Connection, now: float, has_calls: bool) -> bool:
    """Count the client's PING that just came (``http2`` holds the count since we last sent
    data); True once the client has pinged too soon more than ``max_ping_strikes`` times."""
    idle = not has_calls and not settings.permit_without_calls
    interval_s = _IDLE_PING_INTERVAL_S if idle else settings.min_recv_ping_interval_ms / 1000
    too_soon = now < http2.client_ping_at + interval_s
    http2.client_ping_at = now
    if not too_soon:
        return False
    http2.ping_strikes += 1
    return settings.max_ping_strikes != 0 and http2.ping_strikes > settings.max_ping_strikes


class KeepaliveTimers:
    """One connection's keepalive and age timers. The connection tells it when it reads
    (``heard``); it asks the connection to ``ping``, to ``go_away`` and to ``close``.

    One keepalive timer at a time: due at the last read plus ``time_ms``, it either finds the
    connection heard from since (and waits again), or sends a PING and waits ``timeout_ms``
    for any byte at all.
    """

    def __init__(self, settings: GrpcKeepalive, loop: asyncio.AbstractEventLoop, busy: Callable[[], bool],
                 ping: Callable[[], bool], go_away: Callable[[], None], close: Callable[[], None]) -> None:
        self.settings, self.loop = settings, loop
        self._busy, self._ping, self._go_away, self._close = busy, ping, go_away, close
        self.last_read = loop.time()
        self._pinged_at: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._age: asyncio.TimerHandle | None = None
        if settings.time_ms > 0:
            self._keepalive = loop.call_at(self.last_read + settings.time_ms / 1000, self._due)
        if settings.max_age_ms > 0:
            age_s = settings.max_age_ms / 1000 * random.uniform(1 - _JITTER, 1 + _JITTER)
            self._age = loop.call_later(age_s, self._too_old)

    def heard(self) -> None:
        """Something arrived from the client (called on every read: keep it one assignment)."""
        self.last_read = self.loop.time()

    def cancel(self) -> None:
        for timer in (self._keepalive, self._age):
            if timer is not None:
                timer.cancel()
        self._keepalive = self._age = None

    def _due(self) -> None:
        interval_s = self.settings.time_ms / 1000
        now = self.loop.time()
        if self._pinged_at is not None:          # the PING's wait is over
            if self.last_read < self._pinged_at:
                self._keepalive = None
                self._close()
                return
            self._pinged_at = None
        if now - self.last_read < interval_s:
            self._keepalive = self.loop.call_at(self.last_read + interval_s, self._due)
        elif (self._busy() or self.settings.permit_without_calls) and self._ping():
            self._pinged_at = now
            self._keepalive = self.loop.call_later(self.settings.timeout_ms / 1000, self._due)
        else:                                    # nothing to keep alive, or no ping allowed now
            self._keepalive = self.loop.call_later(interval_s, self._due)

    def _too_old(self) -> None:
        self._go_away()
        grace_ms = self.settings.max_age_grace_ms
        self._age = self.loop.call_later(grace_ms / 1000, self._close) if grace_ms > 0 else None
