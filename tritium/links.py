"""The sockets of the broker's links: its ROUTERs, and the DEALER of each gateway and instance.

On a local link without CURVE (``ipc://``, what ``tritium serve`` runs) they are
``ZmtpRouter`` and ``ZmtpDealer``: ZeroMQ's wire protocol written and read by the owning
thread, without libzmq's I/O thread and the two wake-ups per message it costs
(tritium/zmtp.py). Over TCP, or with CURVE, they are libzmq sockets. Both kinds have the
same few calls and speak the same protocol, so either end of a link can be of either kind
(agents and the instances' heartbeats keep libzmq DEALERs).
``TRITIUM_LIBZMQ_LINKS=1`` in the environment makes every one of them a libzmq socket
(for comparison, or should a local link misbehave).
"""

from __future__ import annotations

import os
from typing import Protocol

import zmq

from tritium.protocol import RECONNECT_IVL_MAX_MS, RECONNECT_IVL_MS
from tritium.security import CurveKeys, broker_refusals, client_refusals, secure_client, secure_server
from tritium.zmqio import has_message, recv_parts, send_parts
from tritium.zmtp import PoolUse, ZmtpDealer, ZmtpRouter


class LinkSocket(Protocol):
    edge_triggered: bool   # its descriptor: libzmq's signals an arrival once (see has_message)

    def fileno(self) -> int: ...

    def send_parts(self, parts: list, flags: int = 0) -> None: ...

    def recv_parts(self) -> list: ...

    def has_message(self) -> bool: ...

    def has_message_read(self) -> bool: ...

    def close(self, linger_s: float = 0.0) -> None: ...


class LibzmqSocket:
    """A libzmq socket behind the same calls. Its descriptor is edge-triggered: ask
    ``has_message`` before blocking on it (tritium/zmqio.py). A ROUTER's messages start
    with the sender's identity as bytes, as a ZmtpRouter's do."""

    edge_triggered = True

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self._router = sock.type == zmq.ROUTER

    def fileno(self) -> int:
        return int(self.sock.getsockopt(zmq.FD))

    def send_parts(self, parts: list, flags: int = 0) -> None:
        send_parts(self.sock, parts, flags)

    def recv_parts(self) -> list:
        parts = recv_parts(self.sock)
        if self._router:
            parts[0] = parts[0].bytes
        return parts

    def has_message(self) -> bool:
        return has_message(self.sock)

    def has_message_read(self) -> bool:
        return has_message(self.sock)   # (its descriptor would not signal what already arrived)

    def close(self, linger_s: float = 0.0) -> None:
        self.sock.close(int(linger_s * 1000))


def _direct(address: str, curve: CurveKeys | None) -> bool:
    return address.startswith("ipc://") and curve is None and os.environ.get("TRITIUM_LIBZMQ_LINKS") != "1"


def connect_dealer(address: str, identity: str, curve: CurveKeys | None, who: str, hwm: int = 100_000,
                   context: zmq.Context | None = None, pools: PoolUse | None = None) -> LinkSocket:
    """A DEALER connected to the broker at ``address``; ``who`` names this process in log lines.
    ``pools``: on a local link, the broker may send large tensors as references into shared
    pools, read as this says (tritium/shared_pool.py)."""
    if _direct(address, curve):
        return ZmtpDealer(address[len("ipc://"):], identity.encode(), hwm,
                          RECONNECT_IVL_MS / 1000, RECONNECT_IVL_MAX_MS / 1000, broker_refusals(who),
                          pools=pools)
    sock = (context or zmq.Context.instance()).socket(zmq.DEALER)
    secure_client(sock, curve, who)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    sock.connect(address)
    return LibzmqSocket(sock)


def bind_router(address: str, curve: CurveKeys | None, hwm: int, context: zmq.Context) -> LinkSocket:
    """The broker's ROUTER at ``address``: sending to a peer it does not have raises EHOSTUNREACH,
    and to one whose queue is full zmq.Again."""
    if _direct(address, curve):   # pooled frames from gateways are kept as views and passed on as references
        return ZmtpRouter(address[len("ipc://"):], hwm, client_refusals(address), pools=PoolUse.FORWARD)
    sock = context.socket(zmq.ROUTER)
    secure_server(sock, curve, address)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises instead of dropping silently
    sock.bind(address)
    return LibzmqSocket(sock)
