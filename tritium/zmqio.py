"""Multipart send and receive without pyzmq's convenience layer.

``Socket.send_multipart``/``recv_multipart`` convert flags through Python enums and ask
``getsockopt(RCVMORE)`` after every part; on the hot path that costs 4-5 times the
send itself (measured: 9.3 us vs 1.9 us to send three small parts). These two
functions call pyzmq's compiled socket methods directly with integer flags and use
``Frame.more``.
"""

from __future__ import annotations

import os
import time

import zmq
from zmq.backend import Socket as _BaseSocket

_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_send = _BaseSocket.send
_recv = _BaseSocket.recv
_getsockopt = _BaseSocket.get


def send_parts(sock: zmq.Socket, parts: list, flags: int = 0) -> None:
    """Send ``parts`` as one multipart message; small parts are copied, large ones are not.

    ``flags=zmq.NOBLOCK`` raises zmq.Again when the peer's queue is full (checked on the
    first part: ZeroMQ queues a multipart message whole or not at all).
    """
    last = len(parts) - 1
    for index, part in enumerate(parts):
        _send(sock, part, (_SNDMORE if index < last else 0) | flags, False, False)


def recv_parts(sock: zmq.Socket) -> list:
    """Receive one multipart message as Frames, without blocking (raises zmq.Again)."""
    frame = _recv(sock, _NOBLOCK, False, False)
    parts = [frame]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False, False)
        parts.append(frame)
    return parts


def has_message(sock: zmq.Socket) -> bool:
    """Whether a message is queued on ``sock`` (``EVENTS``, which also runs its pending commands).

    ZeroMQ's descriptor (``zmq.FD``) is edge-triggered and any call on the socket, a send
    included, can consume its edge: ask this before blocking on the descriptor, or a message
    that arrived meanwhile waits for the next one.
    """
    return bool(int(_getsockopt(sock, _EVENTS)) & _POLLIN)


# A yield that comes back later than this ran another thread: the CPU has other work.
_YIELDED_TO_ANOTHER_S = 20e-6

# Polling for answers pays only while this few requests are out: with more, the next message is
# usually queued before the process looks, and polling keeps other threads from the CPU (measured:
# 2-5% less throughput at concurrency 16 when the broker and gateway polled at any load, 1-4% while
# they polled with two requests out).
POLL_WHILE_AT_MOST = 1

# Polling pays when requests come one at a time: after this many requests in a row that were each
# the only one out from their send to their answer (in the broker: the only one running or queued).
# Under load the one request out is the last of a burst, and polling for its answer or for the next
# request after it costs CPU other threads need (measured at concurrency 16: 2-3% less throughput,
# 5-7% more CPU per request than without polling, when it polled whenever one request was out).
LONE_ANSWERS_BEFORE_POLLING = 2


def cpu_is_free() -> bool:
    """Yield the CPU; whether it came straight back, no other thread having wanted it.

    Polling is only worth it on a CPU nobody else needs: a poller that keeps a ready thread
    waiting costs more than the wake-up it saves, so polling stops at the first yield that ran
    another thread.
    """
    start = time.perf_counter()
    os.sched_yield()
    return time.perf_counter() - start < _YIELDED_TO_ANOTHER_S
