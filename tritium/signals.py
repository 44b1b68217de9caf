"""Signals for processes whose main loop sleeps in ``zmq.Poller.poll``.

A Python signal handler only runs between bytecodes, so a poll that sleeps would not
notice SIGTERM until its timeout. ``SignalWaker`` gives the loop a socket that becomes
readable whenever a signal arrives (``signal.set_wakeup_fd``); the loop polls it with its
ZeroMQ sockets and calls ``clear()`` when it fires.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterable


class SignalWaker:
    def __init__(self, on_stop: Callable[[int, object], None],
                 also_wake_on: Iterable[int] = ()) -> None:
        self.read_end, self._write_end = socket.socketpair()
        self.read_end.setblocking(False)
        self._write_end.setblocking(False)
        signal.set_wakeup_fd(self._write_end.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_stop)
        for waking in also_wake_on:
            signal.signal(waking, lambda *_: None)

    @property
    def fd(self) -> int:
        return self.read_end.fileno()

    def clear(self) -> None:
        try:
            self.read_end.recv(512)
        except BlockingIOError:
            pass
