"""Triton's gRPC keepalive and connection-age settings, and the timers one connection runs for them.

The server pings a connection that has been silent for ``time_ms`` and closes it when nothing
at all (the PING's acknowledgement included) comes back within ``timeout_ms``: a client that
vanished without closing (a crashed host, a dropped NAT entry) stops holding its calls. A
connection older than ``max_age_ms`` (give or take 10%, so that a fleet's connections do not
all cycle at once) is told GOAWAY, which clients answer by opening a new connection, the way
a load balancer in front of many servers gets to spread them again; it closes when its calls
are done, or ``max_age_grace_ms`` after the GOAWAY.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class GrpcKeepalive:
    """Triton's flags and defaults (``--grpc-keepalive-*``, ``--grpc-http2-max-pings-without-data``,
    ``--grpc-max-connection-age*``), in milliseconds; 0 means off."""

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2     # pings the server sends with no data or headers between them (0: any)
    max_age_ms: int = 0
    max_age_grace_ms: int = 0           # 0: a connection past its age waits for its calls however long


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
