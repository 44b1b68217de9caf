"""Readiness notification in systemd's ``sd_notify`` protocol, without a dependency.

systemd (``Type=notify``) and ``tritium serve`` both give their children a
``NOTIFY_SOCKET``; a process sends ``READY=1`` when it can really do its job,
``WATCHDOG=1`` while its loop keeps turning (``WatchdogSec=``) and ``STOPPING=1``
when it begins to shut down.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping


def send(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        # A reader that stopped reading must not stall a serving loop: a full queue drops the message.
        sock.setblocking(False)
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def ready(status: str = "") -> bool:
    return send("READY=1\n" + (f"STATUS={status}\n" if status else "") + f"MAINPID={os.getpid()}\n")


def stopping() -> bool:
    return send("STOPPING=1\n")


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """The interval systemd expects pings within, or None when this process is not watched.

    systemd sets WATCHDOG_USEC (and WATCHDOG_PID, the process it watches) for the unit's
    main process; children inherit both, so a WATCHDOG_PID naming another process means
    the pings are not ours to send. An absent WATCHDOG_PID means this process, as in
    ``sd_watchdog_enabled``.
    """
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
        watched = int(environ.get("WATCHDOG_PID") or pid)
    except ValueError:
        return None
    if usec <= 0 or watched != pid:
        return None
    return usec / 1_000_000


class Watchdog:
    """``tick()`` from a loop that wakes often; it pings at most once every half interval.

    Pinging from the serving loop itself (not from a thread of its own) is the point:
    a loop that hangs stops the pings, and systemd restarts the process.
    """

    __slots__ = ("interval_s", "_clock", "_last_ping")

    def __init__(self, interval_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last_ping: float | None = None

    @classmethod
    def from_environment(cls) -> Watchdog:
        return cls(watchdog_interval_s(os.environ, os.getpid()))

    def tick(self) -> bool:
        """Send WATCHDOG=1 when half the interval has passed since the last ping; True if sent."""
        if self.interval_s is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < self.interval_s / 2:
            return False
        self._last_ping = now
        send("WATCHDOG=1\n")
        return True
