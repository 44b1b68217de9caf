"""What the gateway's connections write in one event-loop turn, sent by one system call.

A turn of the event loop often answers many connections: a message from the broker carries the
answers of every request the last turns read. Each connection's bytes are held until the end
of the turn and then sent together through a ``SendRing`` (gateway/send_ring.py); where there
is no ring, or for a TLS connection (whose bytes its transport must encrypt), each write goes
to its transport at once as before. A connection writes only through here, so its bytes keep
their order: held bytes go to the transport before anything written to it otherwise
(``release``, before a large write or a close).

A send that could not take everything (the client is not reading) hands the rest to the
transport, which buffers it and applies its flow control as for any write.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable, Sequence

from tritium.gateway.send_ring import SendRing

log = logging.getLogger(__name__)

HELD_BYTES = 64 * 1024   # a write larger than this goes to the transport at once (copying it would cost more)


def ring_socket(transport: asyncio.BaseTransport) -> int | None:
    """The socket a ring may send a transport's bytes to: a plain stream's, not a TLS one's."""
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else sock.fileno()


class _Held:
    """One connection's bytes of this turn."""

    __slots__ = ("fd", "parts", "size")

    def __init__(self, fd: int, data: bytes) -> None:
        self.fd, self.parts, self.size = fd, [data], len(data)


class TurnSends:
    """The bytes held for each connection this turn, and the one call that sends them."""

    __slots__ = ("_loop", "_ring", "_more_coming", "_held", "_before", "_scheduled", "_gathering", "_kept",
                 "system_calls", "sends")

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: SendRing | None,
                 more_coming: Callable[[], bool] = lambda: True) -> None:
        self._loop = loop
        self._ring = ring
        # Whether more answers may come in this turn (requests are out at the broker): a lone
        # answer with none to come is written at once, as requests that come one at a time want.
        self._more_coming = more_coming
        self._held: dict[asyncio.Transport, _Held] = {}
        self._before: list[Callable[[], None]] = []   # what writes this turn's bytes just before they go
        self._scheduled = False
        self._gathering = False   # the turn's end: connections writing what they gathered, all of it held
        self._kept: list = []     # a broken ring and the buffers its unfinished sends may still read
        self.system_calls = 0   # the ring's calls (each one io_uring_enter; tests read them)
        self.sends = 0          # writes they carried

    @property
    def batching(self) -> bool:
        return self._ring is not None

    def write(self, transport: asyncio.Transport, fd: int | None, data: bytes | memoryview) -> None:
        """``data`` for ``transport``, whose socket is ``fd`` (None: never through the ring).
        What is held is copied if it is a view: its owner may reuse the memory after the call."""
        held = self._held.get(transport)
        if held is not None and held.size + len(data) <= HELD_BYTES:
            held.parts.append(data if type(data) is bytes else bytes(data))
            held.size += len(data)
        elif held is not None or self._ring is None or fd is None or len(data) > HELD_BYTES \
                or transport.get_write_buffer_size() or transport.is_closing() \
                or not (self._held or self._gathering or self._more_coming()):
            self.release(transport)
            transport.write(data)
        else:
            self._schedule()
            self._held[transport] = _Held(fd, data if type(data) is bytes else bytes(data))

    def writelines(self, transport: asyncio.Transport, fd: int | None, parts: Sequence[bytes | memoryview]) -> None:
        if self._ring is None or fd is None:
            self.release(transport)
            transport.writelines(parts)
        elif len(parts) == 1:
            self.write(transport, fd, parts[0])
        elif sum(map(len, parts)) <= HELD_BYTES:
            self.write(transport, fd, b"".join(parts))
        else:
            self.release(transport)
            transport.writelines(parts)

    def release(self, transport: asyncio.Transport) -> None:
        """What is held for ``transport`` goes to it now: before it is closed (by the connection,
        or by the loop when the client ends its side), or written to otherwise."""
        held = self._held.pop(transport, None)
        if held is not None and not transport.is_closing():
            transport.write(b"".join(held.parts))

    def close(self) -> None:
        """Held bytes to their transports, and the ring closed: every write goes straight on."""
        ring, self._ring = self._ring, None
        for transport in list(self._held):
            self.release(transport)
        if ring is not None and not self._kept:
            ring.close()

    def before_sending(self, write: Callable[[], None]) -> None:
        """Have ``write`` called at the end of this turn, just before the held bytes go out (a
        connection that gathers its bytes over the turn writes them then, into the same call)."""
        if self._ring is None:
            self._loop.call_soon(write)
        else:
            self._schedule()
            self._before.append(write)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._send)

    def _send(self) -> None:
        self._gathering = True
        try:
            while self._before:   # their writes join the held bytes (the send is scheduled already)
                before, self._before = self._before, []
                for position, write in enumerate(before):
                    try:
                        write()
                    except Exception:   # one connection's failure is its own; the others' bytes still go
                        log.exception("writing a connection's bytes failed")
                    except BaseException:
                        self._before[:0] = before[position + 1:]   # theirs go next turn
                        raise
            held, self._held = self._held, {}
        finally:
            self._scheduled = self._gathering = False
            if self._held or self._before:   # cut short: the rest next turn
                self._schedule()
        # a closed one's socket may be gone (and its number reused)
        outgoing = [(transport, kept) for transport, kept in held.items() if not transport.is_closing()]
        ring = self._ring
        if ring is None or len(outgoing) == 1:   # nothing to gather: the transport's own write costs less
            for transport, kept in outgoing:
                transport.write(kept.parts[0] if len(kept.parts) == 1 else b"".join(kept.parts))
            return
        for start in range(0, len(outgoing), ring.capacity):
            self._send_some(ring, outgoing[start:start + ring.capacity])
        if ring.broken:
            log.error("a call to io_uring_enter did not complete its sends; the gateway writes one system call "
                      "per answer from now on")
            self._ring = None
            if not self._kept:
                ring.close()

    def _send_some(self, ring: SendRing, outgoing: list[tuple[asyncio.Transport, _Held]]) -> None:
        # every part copied once, into the one buffer the kernel reads the call's sends from
        buffer = bytearray().join(part for _, kept in outgoing for part in kept.parts)
        address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer)) if buffer else 0
        sends, offset = [], 0
        for _, kept in outgoing:
            sends.append((kept.fd, address + offset, kept.size))
            offset += kept.size
        results = ring.send(sends)
        self.system_calls += 1
        self.sends += len(sends)
        if None in results:   # sends the kernel may still carry out: their memory and the ring stay
            self._kept.append((ring, buffer))
        offset = 0
        for (transport, kept), sent in zip(outgoing, results):
            if sent is None:   # what reached the client is unknown: the connection cannot go on
                log.error("an answer's send did not complete; closing its connection")
                transport.abort()
            elif sent < kept.size:   # no room (-EAGAIN, or part sent), or an error the transport meets itself
                transport.write(memoryview(buffer)[offset + max(sent, 0):offset + kept.size].tobytes())   # one copy
            offset += kept.size
