"""DEALER and ROUTER sockets that speak ZeroMQ's wire protocol themselves, on local (``ipc://``) links.

libzmq moves every message through an I/O thread of its own: a send wakes the sender's
I/O thread, which writes the socket; the receiver's I/O thread reads it and wakes the
receiving thread. On a machine where a wake-up costs tens of microseconds, those two
extra wake-ups per hop are most of a hop's cost (docs/performance.md, "One ZeroMQ hop").
``ZmtpDealer`` and ``ZmtpRouter`` write and read their Unix sockets from the calling
thread instead, speaking ZMTP 3.0 with the NULL mechanism, so a libzmq peer sees an
ordinary DEALER or ROUTER. They are used on the local links of a broker and its gateways
and instances without CURVE (``tritium serve``); links over TCP, and CURVE links, keep
libzmq.

Like libzmq sockets they belong to one thread and never block the caller on a slow
reader: what a socket cannot take now waits and leaves when it drains (up to ``hwm``
messages, then zmq.Again). The DEALER reconnects by itself (backing off from
``reconnect_ivl_s`` to ``reconnect_ivl_max_s``) and keeps the messages sent while
disconnected until it connects; the ROUTER routes by the identity a peer gives in its
READY (one a live peer holds is refused, as libzmq does; it passes on once that connection
has ended) and, like a libzmq ROUTER with ROUTER_MANDATORY, raises EHOSTUNREACH for a peer
it does not have. A peer's last messages are read even after writing to it failed. A connection
whose handshake is not over within ``handshake_s`` is dropped (libzmq's HANDSHAKE_IVL). Their descriptor
(``fileno``) is level-triggered: readable while a message can be read, queued output can be
written, a peer is connecting, a reconnection or a handshake's deadline is due; the owner then calls
``has_message``/``recv_parts``, which do that work first.
"""

from __future__ import annotations

import array
import collections
import ctypes
import enum
import errno
import itertools
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
import weakref
from typing import Callable

import zmq

from tritium.shared_pool import MappedPool, hand_on, hold, locate, map_pool, release_slot, unmap

log = logging.getLogger(__name__)

_GREETING_SIZE = 64
_NULL_GREETING = (b"\xff" + bytes(8) + b"\x7f"   # signature
                  + b"\x03\x00"                  # version 3.0
                  + b"NULL".ljust(20, b"\0")     # mechanism
                  + b"\x00" + bytes(31))         # as-server, filler
_MORE, _LONG, _COMMAND = 1, 2, 4
_POOLED = 8                  # a reference into a shared pool (a reserved bit: only to a peer whose READY offers pools)
_SPECIAL = _COMMAND | _POOLED
_REFERENCE = struct.Struct("<IQQ")   # a pooled frame's body: pool number, offset, size
_POOL_COMMAND = struct.Struct("<IQB")  # X-POOL: pool number, size, released by its reader (its descriptor passed with it)
_POOL_ENDED = struct.Struct("<I")      # X-POOL-END: the pool number
_OFFERS_POOLS = b"X-Pools"   # READY property: this end reads pooled frames
_ANCILLARY = socket.CMSG_SPACE(16 * 4)   # room for the descriptors one read may bring
_SMALL_PART = 64 * 1024      # parts below this are copied into one buffer; larger ones are sent in place
_CHUNK = 64 * 1024           # bytes read at a time: a larger buffer is a fresh mmap per read (measured: 11 us against 1)
_IOV_MAX = 512               # buffers per sendmsg (the kernel allows 1024)
_SEND_BUFFER = 4 * 1024 * 1024
_LARGEST_FRAME = 1 << 40     # more is no tensor: a peer that is not ours
_HANDSHAKE_S = 30.0          # a connection that has not finished its handshake by then is dropped (libzmq's HANDSHAKE_IVL)
_ACCEPT_PAUSE_S = 0.1         # out of descriptors, the router tries accepting again after this


def _command(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    return _command_frame(name, b"".join(bytes([len(key)]) + key + len(value).to_bytes(4, "big") + value
                                         for key, value in properties.items()))


def _command_frame(name: bytes, body: bytes) -> bytes:
    data = bytes([len(name)]) + name + body
    return _frame_header(_COMMAND, len(data)) + data


def _frame_header(flags: int, size: int) -> bytes:
    if size < 256:
        return bytes((flags, size))
    return bytes((flags | _LONG,)) + size.to_bytes(8, "big")


def _nbytes(part) -> memoryview | bytes:
    """The part as something ``len`` measures in bytes."""
    if type(part) is bytes:
        return part
    view = part if type(part) is memoryview else memoryview(part)   # the same view: a held one is known by it
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def encode(parts: list) -> list:
    """One multipart message as ZMTP frames: small parts joined with their headers into one
    buffer, large ones sent in place; a large part lying in a shared pool is left as a
    ``_Pooled``, written when the message leaves as a reference or as its bytes (the message
    is then a ``_PooledMessage``)."""
    segments: list = []
    pieces: list = []
    pooled = False
    last = len(parts) - 1
    for index, part in enumerate(parts):
        if type(part) is not bytes:
            part = _nbytes(part)
        size = len(part)
        more = index < last
        if size < _SMALL_PART:
            pieces.append(_SHORT_HEADERS[more][size] if size < 256 else _frame_header(more, size))
            pieces.append(part)
            continue
        located = locate(part) if type(part) is memoryview else None
        if located is None:
            pieces.append(_frame_header(more, size))
            segments.append(b"".join(pieces))
            segments.append(part)
        else:
            if pieces:
                segments.append(b"".join(pieces))
            segments.append(_Pooled(part, located[0], located[1], more))
            pooled = True
        pieces = []
    if pieces:
        segments.append(b"".join(pieces))
    return _PooledMessage(segments) if pooled else segments


class _Pooled:
    """A large part that is a view of a shared pool, in a message not yet written."""

    __slots__ = ("view", "pool", "offset", "more")

    def __init__(self, view: memoryview, pool: MappedPool, offset: int, more: bool) -> None:
        self.view, self.pool, self.offset, self.more = view, pool, offset, more


class _PooledMessage(list):
    """A message holding ``_Pooled`` parts: how each is written depends on the connection."""


class _Expanded(list):
    """A ``_PooledMessage`` as written on one connection (``original``: for another connection;
    ``handed``: the holds of answer-pool slots it sends as references, let go once it is written whole)."""

    original: _PooledMessage
    handed: list


class _PassedDescriptor:
    """A command sent with a descriptor (SCM_RIGHTS): X-POOL, before the first reference to its pool."""

    __slots__ = ("data", "fd")

    def __init__(self, data: bytes, fd: int) -> None:
        self.data, self.fd = data, fd

    def __len__(self) -> int:
        return len(self.data)


class PoolUse(enum.Enum):
    """What a socket does with the pooled frames it reads."""

    FORWARD = "forward"   # keeps them as views of the pool and sends them on as references (the broker)
    COPY = "copy"         # copies each out as it reads it, so nothing it hands on holds pool memory (an instance)
    VIEW = "view"         # answers: read-only views, each slot released when the last view of it goes (a gateway,
                          # which writes them to its clients without a copy); anything else copied


# Every short frame's header, by MORE flag and size (building them was half of encode's time).
_SHORT_HEADERS = [[bytes((flags, size)) for size in range(256)] for flags in (0, _MORE)]


class NothingToRead(zmq.Again):
    """zmq.Again without pyzmq's constructor, which looks the message up in libzmq: raised at
    the end of every drain, that lookup was 4% of the broker's time."""

    errno = errno.EAGAIN
    strerror = "Resource temporarily unavailable"

    def __init__(self) -> None:
        pass


class ZmtpError(Exception):
    """The peer does not speak ZMTP 3 with the NULL mechanism (a CURVE broker, or not ZeroMQ at all)."""

    def __init__(self, why: str, mechanism: str = "") -> None:
        super().__init__(why)
        self.mechanism = mechanism   # the one the peer asked for, when that was the trouble


class _Reader:
    """Parses the peer's greeting, commands and frames from the bytes read; whole messages out."""

    def __init__(self, pools: PoolUse | None = None) -> None:
        self.greeted = False
        self.ready = False
        self.properties: dict[bytes, bytes] = {}   # the peer's READY metadata (Socket-Type, Identity)
        self.messages: collections.deque[list] = collections.deque()
        self.pool_use = pools
        self.pools: dict[int, MappedPool] = {}          # by the peer's number for it
        self.descriptors: collections.deque[int] = collections.deque()   # passed with the bytes read, in order
        self._parts: list = []
        self._releases: list = []   # (pool, offset, view or exporter) of the answer-pool slots in the message being read
        self._tail = b""                     # the start of a frame not yet read whole
        self._big: bytearray | None = None   # a large frame being read in place
        self._big_filled = 0
        self._big_flags = 0

    def big_room(self) -> memoryview | None:
        """Where the next bytes of a large frame go, read straight into it."""
        return None if self._big is None else memoryview(self._big)[self._big_filled:]

    def big_read(self, count: int) -> None:
        self._big_filled += count
        if self._big is not None and self._big_filled == len(self._big):
            big, self._big = self._big, None
            self._frame(self._big_flags, big)

    def feed(self, data: bytes) -> None:
        try:
            self._feed(data)
        except ZmtpError:
            raise
        except (IndexError, ValueError, MemoryError, OverflowError, struct.error) as exc:   # a peer that is not ours
            raise ZmtpError(f"malformed ZMTP from the peer ({type(exc).__name__}: {exc})") from None

    def _feed(self, data: bytes) -> None:
        if self._tail:
            data, self._tail = self._tail + data, b""
        position = 0
        if not self.greeted:
            if len(data) < _GREETING_SIZE:
                self._tail = data
                return
            _check_greeting(data[:_GREETING_SIZE])
            self.greeted = True
            position = _GREETING_SIZE
        view = memoryview(data)
        end_of_data = len(data)
        parts, messages, releases = self._parts, self.messages, self._releases   # the loop runs once per frame: locals
        while position < end_of_data:
            flags = data[position]
            if flags & _LONG:
                if position + 9 > end_of_data:
                    break
                size = int.from_bytes(data[position + 1:position + 9], "big")
                start = position + 9
                if size > _LARGEST_FRAME:
                    raise ZmtpError(f"a frame of {size} bytes")
            else:
                if position + 2 > end_of_data:
                    break
                size = data[position + 1]
                start = position + 2
            end = start + size
            if end > end_of_data:
                if size >= _SMALL_PART:   # read the rest straight into the frame's own buffer
                    self._big = bytearray(size)
                    self._big[:end_of_data - start] = view[start:]
                    self._big_filled, self._big_flags = end_of_data - start, flags
                    position = end_of_data
                break
            position = end
            if flags & _SPECIAL:
                self._frame(flags, view[start:end])
                parts = self._parts
            elif flags & _MORE:
                parts.append(view[start:end])
            else:
                parts.append(view[start:end])
                messages.append(parts)
                parts = self._parts = []
                if releases:
                    self._release()
        if position < end_of_data:
            self._tail = bytes(view[position:])

    def _frame(self, flags: int, body) -> None:
        """A frame read whole in place (a large one), a command or a pooled frame."""
        if flags & _COMMAND:
            self._command(body)
            return
        if flags & _POOLED:
            body = self._from_pool(body)
        self._parts.append(body)
        if not flags & _MORE:
            self.messages.append(self._parts)
            self._parts = []
            if self._releases:
                self._release()

    def _release(self) -> None:
        """The message is whole, so its answer-pool slots are this reader's (the sender let go of them
        when it wrote the message whole; a message cut short is theirs to release): free now when
        copied out, when the last view goes when read as views, held when passed on."""
        forwarding = self.pool_use is PoolUse.FORWARD
        for pool, offset, kept in self._releases:
            if forwarding:
                hold(pool, kept, offset)
            elif kept is None:
                release_slot(pool, offset)
            else:
                weakref.finalize(kept, release_slot, pool, offset).atexit = False
        self._releases.clear()

    def _command(self, body) -> None:
        if not body or len(body) < 1 + body[0]:
            raise ZmtpError("a malformed command")
        name = bytes(body[1:1 + body[0]])
        if name == b"READY":
            self.properties = _properties(bytes(body[1 + body[0]:]))
            self.ready = True
        elif name == b"ERROR":
            reason = bytes(body[2 + body[0]:]).decode(errors="replace")
            raise ZmtpError(f"the peer closed the connection: {reason}")
        elif name == b"X-POOL" and self.pool_use is not None:
            number, size, released_by_reader = _POOL_COMMAND.unpack(body[1 + body[0]:])
            if not self.descriptors:
                raise ZmtpError("a pool without its descriptor")
            self._forget_pool(number)
            try:
                self.pools[number] = map_pool(self.descriptors.popleft(), size, self.pool_use is PoolUse.FORWARD,
                                              bool(released_by_reader))
            except OSError as exc:   # out of address space or mappings: the peer's references cannot be read
                raise ZmtpError(f"could not map the peer's pool {number} of {size} bytes: {exc}") from None
        elif name == b"X-POOL-END" and self.pool_use is not None:
            self._forget_pool(_POOL_ENDED.unpack(body[1 + body[0]:])[0])
        # PING and the like: these sockets ask for no heartbeats, and any other command is advisory

    def _from_pool(self, body) -> memoryview | bytearray:
        if len(body) != _REFERENCE.size:
            raise ZmtpError("a malformed pooled frame")
        number, offset, size = _REFERENCE.unpack(body)
        pool = self.pools.get(number)
        if pool is None or self.pool_use is None:
            raise ZmtpError(f"a pooled frame of pool {number}, which this connection was not given")
        if offset + size > pool.size:
            raise ZmtpError(f"a pooled frame past the end of pool {number}")
        view = pool.view[offset:offset + size]
        if self.pool_use is PoolUse.FORWARD:
            if pool.released_by_reader:
                self._releases.append((pool, offset, view))
            return view
        if not pool.released_by_reader:
            return bytearray(view)
        if self.pool_use is PoolUse.VIEW:
            # Its own exporter: every view made from the one returned keeps it, and so the slot, alive.
            exporter = (ctypes.c_char * size).from_buffer(pool.mapping, offset)
            self._releases.append((pool, offset, exporter))
            return memoryview(exporter).cast("B").toreadonly()
        self._releases.append((pool, offset, None))
        return bytearray(view)

    def _forget_pool(self, number: int) -> None:
        pool = self.pools.pop(number, None)
        if pool is None:
            return
        if self.pool_use is PoolUse.FORWARD:
            pool.retire()
            for holder in list(pool.holders):   # those this process passed it to: they forget it too
                holder.pool_ended(pool)
        else:
            unmap(pool)

    def close(self) -> None:
        self._releases.clear()   # a message cut short: its sender releases its slots
        for number in list(self.pools):
            self._forget_pool(number)
        while self.descriptors:
            os.close(self.descriptors.popleft())


def _properties(data: bytes) -> dict[bytes, bytes]:
    found, position = {}, 0
    while position < len(data):
        end = position + 1 + data[position]
        size = int.from_bytes(data[end:end + 4], "big")
        if end + 4 + size > len(data):
            raise ZmtpError("a malformed READY")
        found[data[position + 1:end]] = data[end + 4:end + 4 + size]
        position = end + 4 + size
    return found


def _check_greeting(greeting: bytes) -> None:
    if greeting[0] != 0xFF or greeting[9] & 1 != 1:
        raise ZmtpError("the peer is not a ZeroMQ socket")
    if greeting[10] < 3:
        raise ZmtpError(f"the peer speaks ZMTP {greeting[10]}, not 3")
    mechanism = greeting[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        name = mechanism.decode(errors="replace")
        raise ZmtpError(f"the peer requires the {name} mechanism", name)


class _Connection:
    """One Unix socket's ZMTP traffic: the greeting and READY sent first, then whole messages
    from ``out``, written as far as the socket takes them; what is read parsed by a _Reader."""

    def __init__(self, sock: socket.socket, poller: select.epoll, socket_type: bytes, identity: bytes = b"",
                 pools: PoolUse | None = None) -> None:
        sock.setblocking(False)
        self.sock, self.poller = sock, poller
        self.fd = sock.fileno()
        self.reader = _Reader(pools)
        self.shared: dict[int, MappedPool] = {}   # the pools passed to the peer, by number
        properties = {b"Socket-Type": socket_type}
        if identity:
            properties[b"Identity"] = identity
        if pools is not None:
            properties[_OFFERS_POOLS] = b"1"
        self.greeting = [_NULL_GREETING + _command(b"READY", properties)]
        self.out: collections.deque[list] = collections.deque([self.greeting])   # each a message's buffers
        self.head_started = False   # out[0] is partly written
        self.writing = False        # EPOLLOUT is asked for
        self.write_failed = False   # the peer closed its end: what it sent before is still read
        self.broken = False
        poller.register(self.fd, select.EPOLLIN)

    def queue(self, segments: list) -> None:
        self.out.append(segments)
        if len(self.out) == 1 and not self.writing and self.reader.ready:
            self.write()

    def write(self) -> None:
        out = self.out
        while out and not self.write_failed:
            buffers = out[0]
            if type(buffers) is _PooledMessage:
                buffers = out[0] = self._expand(buffers)
            if type(buffers[0]) is _PassedDescriptor and not self._pass_descriptors(buffers):
                return
            try:
                sent = self.sock.sendmsg(buffers[:_IOV_MAX])
            except BlockingIOError:
                sent = 0
            except OSError:   # as libzmq, read on: the peer's last messages may still be there
                self.write_failed = True
                self._want_write(False)
                return
            if sent:
                self.head_started = True
            while sent and buffers:
                size = len(buffers[0])
                if sent >= size:
                    sent -= size
                    buffers.pop(0)
                else:
                    buffers[0] = memoryview(buffers[0])[sent:]
                    sent = 0
            if buffers:   # the socket is full: wait until it drains
                self._want_write(True)
                return
            if type(buffers) is _Expanded and buffers.handed:
                for handed in buffers.handed:   # the peer holds them now
                    handed.detach()
            out.popleft()
            self.head_started = False
            if not self.reader.ready:
                break   # messages wait for the peer's READY (libzmq takes none before it has answered)
        self._want_write(False)

    def _expand(self, message: _PooledMessage) -> _Expanded:
        """The message as this connection writes it: each pooled part as a reference when the peer
        reads them (its pool passed first, once), else as its bytes."""
        peer_reads_pools = self.reader.properties.get(_OFFERS_POOLS) == b"1"
        expanded = _Expanded()
        expanded.original = message
        expanded.handed = []
        passed: list[_PassedDescriptor] = []
        for segment in message:
            if type(segment) is not _Pooled:
                expanded.append(segment)
                continue
            pool, size = segment.pool, len(segment.view)
            if peer_reads_pools and pool.fd is not None and (pool.number in self.shared or self._share(pool, passed)) \
                    and self._may_refer(segment, expanded.handed):
                expanded.append(bytes((segment.more | _POOLED, _REFERENCE.size))
                                + _REFERENCE.pack(pool.number, segment.offset, size))
            else:
                expanded.append(_frame_header(segment.more, size))
                expanded.append(segment.view)
        expanded[:0] = passed
        return expanded

    @staticmethod
    def _may_refer(segment: _Pooled, handed: list) -> bool:
        """Whether the segment may go as a reference: always for a gateway's pool (its owner frees
        its slots); for an answer pool, only a view this process holds and hands on whole."""
        if not segment.pool.released_by_reader:
            return True
        claim = hand_on(segment.pool, segment.view)
        if claim is None:
            return False
        handed.append(claim)
        return True

    def _share(self, pool: MappedPool, passed: list) -> bool:
        """Pass ``pool`` to the peer before this message (False when no descriptor is left for it:
        its frames then go as bytes)."""
        if pool.fd is None:
            return False
        try:
            descriptor = os.dup(pool.fd)
        except OSError:
            return False
        passed.append(_PassedDescriptor(_command_frame(b"X-POOL", _POOL_COMMAND.pack(
            pool.number, pool.size, pool.released_by_reader)), descriptor))
        self.shared[pool.number] = pool
        pool.holders.append(self)
        return True

    def _pass_descriptors(self, buffers: list) -> bool:
        """Send the commands at the head of ``buffers``, each with its descriptor (closed here once
        in flight); False when the socket took not all of them (then it is waited on, or failed)."""
        while type(buffers[0]) is _PassedDescriptor:
            passed = buffers[0]
            ancillary = [] if passed.fd < 0 else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [passed.fd]))]
            try:
                sent = self.sock.sendmsg([passed.data], ancillary)
            except BlockingIOError:
                self._want_write(True)
                return False
            except OSError:
                self.write_failed = True
                self._want_write(False)
                return False
            if passed.fd >= 0:
                os.close(passed.fd)
            if sent < len(passed.data):
                self.head_started = True   # a command partly written: this message cannot move to another connection
                buffers[0] = _PassedDescriptor(passed.data[sent:], -1)   # the rest, its descriptor gone with the first byte
                self._want_write(True)
                return False
            buffers.pop(0)
        return True

    def pool_ended(self, pool: MappedPool) -> None:
        """A pool passed to the peer is no longer passed on: the peer may unmap it."""
        if self.shared.pop(pool.number, None) is not None:
            pool.holders.remove(self)
            if not self.broken and not self.write_failed:
                self.queue([_command_frame(b"X-POOL-END", _POOL_ENDED.pack(pool.number))])

    def read(self) -> None:
        """Read what has arrived (``broken`` when the peer closed); ZmtpError for a peer that is not ours."""
        sock, reader = self.sock, self.reader
        was_ready = reader.ready
        with_descriptors = reader.pool_use is not None   # recv would close any descriptor passed
        while True:
            try:
                room = reader.big_room()
                if room is not None:
                    if with_descriptors:
                        count, ancillary, _, _ = sock.recvmsg_into([room], _ANCILLARY)
                        self._take_descriptors(ancillary)
                    else:
                        count = sock.recv_into(room)
                    if count:
                        reader.big_read(count)
                        continue
                else:
                    if with_descriptors:
                        data, ancillary, _, _ = sock.recvmsg(_CHUNK, _ANCILLARY)
                        self._take_descriptors(ancillary)
                    else:
                        data = sock.recv(_CHUNK)
                    count = len(data)
                    if count:
                        reader.feed(data)
                        if count < _CHUNK:
                            break
                        continue
            except BlockingIOError:
                break
            except OSError:
                pass
            self.broken = True   # the peer closed the connection (or it broke)
            return
        if not was_ready and reader.ready and len(self.out) and not self.writing:
            self.write()   # what waited for the handshake

    def _take_descriptors(self, ancillary: list) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                descriptors = array.array("i")
                descriptors.frombytes(data[:len(data) - len(data) % descriptors.itemsize])
                self.reader.descriptors.extend(descriptors)

    def unsent(self) -> list[list]:
        """The messages not yet begun, for a new connection (as they were before this one wrote any)."""
        return [_unexpanded(m) for index, m in enumerate(self.out)
                if m is not self.greeting and not (index == 0 and self.head_started)]

    def close(self) -> None:
        try:
            self.poller.unregister(self.fd)
        except (OSError, ValueError):
            pass
        self.sock.close()
        self.reader.close()
        for pool in self.shared.values():
            pool.holders.remove(self)
        self.shared.clear()
        for message in self.out:   # descriptors never passed
            for segment in message:
                if type(segment) is _PassedDescriptor and segment.fd >= 0:
                    os.close(segment.fd)

    def _want_write(self, writing: bool) -> None:
        if writing != self.writing:
            self.writing = writing
            self.poller.modify(self.fd, select.EPOLLIN | (select.EPOLLOUT if writing else 0))


def _unexpanded(message: list) -> list:
    return message.original if type(message) is _Expanded else message


def _flush_before_closing(connections: list[_Connection], linger_s: float) -> None:
    """Try for ``linger_s`` to write what waits (and read what the handshakes need)."""
    deadline = time.monotonic() + linger_s
    while time.monotonic() < deadline:
        waiting = [c for c in connections if c.out and not c.broken and not c.write_failed]
        if not waiting:
            return
        for connection in waiting:
            try:
                connection.read()
            except ZmtpError:
                connection.broken = True
            if connection.reader.ready and not connection.broken:
                connection.write()
        waiter = select.poll()   # not select(): descriptors past 1023
        for connection in waiting:
            waiter.register(connection.fd, select.POLLIN | (select.POLLOUT if connection.writing else 0))
        waiter.poll(max(0.0, min(0.05, deadline - time.monotonic())) * 1000)


class _Alarm:
    """A descriptor in a socket's poller that turns readable when a timer fires: how a socket that
    its owner only polls gets called in at a given time. Watched only while needed: a timer that
    fires late must not leave the poller readable for good, the owner's loop spinning on it."""

    def __init__(self, poller: select.epoll) -> None:
        self._poller = poller
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._watched = False
        self._timer: threading.Timer | None = None
        # A timer that has already woken can no longer be cancelled: it rings only if it is still
        # the latest one set, checked under the lock that cancelling takes.
        self._lock = threading.Lock()
        self._setting = 0

    def watch(self, watched: bool) -> None:
        if watched != self._watched:
            self._watched = watched
            if watched:
                self._poller.register(self._read.fileno(), select.EPOLLIN)
            else:
                self._poller.unregister(self._read.fileno())

    def ring_in(self, delay_s: float) -> None:
        """Turn readable after ``delay_s`` (one timer at a time: this replaces the last)."""
        self.cancel()
        self._timer = threading.Timer(delay_s, self._ring, (self._setting,))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """No ring from a timer set before, not even one already on its way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            with self._lock:
                self._setting += 1
                self._read_off()

    def stop(self) -> None:
        """No longer needed: cancelled, read off and unwatched."""
        self.cancel()
        self.rang()
        self.watch(False)

    def rang(self) -> bool:
        """Whether it rang since last asked (read off, so that it is no longer readable)."""
        return self._read_off()

    def close(self) -> None:
        self.cancel()
        self._read.close()
        self._write.close()

    def _read_off(self) -> bool:
        rang = False
        try:
            while self._read.recv(64):
                rang = True
        except OSError:   # BlockingIOError: nothing more
            pass
        return rang

    def _ring(self, setting: int) -> None:
        with self._lock:
            if setting != self._setting:
                return   # cancelled after its timer woke
            try:
                self._write.send(b"\0")
            except OSError:
                pass   # closed meanwhile


class ZmtpDealer:
    edge_triggered = False

    def __init__(self, path: str, identity: bytes = b"", hwm: int = 100_000,
                 reconnect_ivl_s: float = 0.1, reconnect_ivl_max_s: float = 1.0,
                 on_refused: Callable[[str, ZmtpError], None] | None = None, handshake_s: float = _HANDSHAKE_S,
                 pools: PoolUse | None = None) -> None:
        self.path = path
        self.identity = identity
        self.pools = pools   # what it does with pooled frames from the peer (None: it offers none)
        self.hwm = hwm
        self.reconnect_ivl_s, self.reconnect_ivl_max_s = reconnect_ivl_s, reconnect_ivl_max_s
        self.handshake_s = handshake_s
        # Told (endpoint, error) of a peer that is not a NULL ZMTP ROUTER; the DEALER retries.
        self.on_refused = on_refused or (lambda endpoint, exc: log.error("%s: %s", endpoint, exc))
        self._poller = select.epoll()
        self._alarm = _Alarm(self._poller)   # watched while disconnected or in a handshake
        self._alarm.watch(True)
        self._connection: _Connection | None = None
        self._unsent: collections.deque[list] = collections.deque()   # sent while disconnected
        self._inbox: collections.deque[list] = collections.deque()    # read from a connection that ended since
        self._backoff = reconnect_ivl_s
        self._cut_short = 0   # connections in a row that the peer closed before its greeting
        self._retry_at = 0.0
        self._handshake_by = 0.0
        self._closed = False
        self._connect()

    def fileno(self) -> int:
        return self._poller.fileno()

    @property
    def connected(self) -> bool:
        """Whether a connection is up (messages sent meanwhile wait for the next one)."""
        return self._connection is not None

    def send_parts(self, parts: list, flags: int = 0) -> None:
        """Send one multipart message; zmq.Again when ``hwm`` messages already wait (``flags`` is
        accepted for libzmq's signature: this never blocks)."""
        connection = self._connection
        if connection is None:
            if len(self._unsent) >= self.hwm:
                raise zmq.Again()
            self._unsent.append(encode(parts))
            self._reconnect_if_due()
            return
        if len(connection.out) >= self.hwm:
            raise zmq.Again()
        connection.queue(encode(parts))

    def has_message(self) -> bool:
        """Whether a message can be read now (after flushing what waits, reading what arrived)."""
        if self.has_message_read():
            return True
        self._service()
        return self.has_message_read()

    def has_message_read(self) -> bool:
        """Whether a message was read and waits, without a system call: what has not been read
        keeps the descriptor readable (the poller is level-triggered)."""
        return bool(self._inbox) or (self._connection is not None and bool(self._connection.reader.messages))

    def recv_parts(self) -> list:
        """One multipart message, without blocking (zmq.Again when none has arrived whole)."""
        if not self.has_message():
            raise NothingToRead()
        if self._inbox:
            return self._inbox.popleft()
        assert self._connection is not None
        return self._connection.reader.messages.popleft()

    def close(self, linger_s: float = 0.0) -> None:
        """Close, after trying for ``linger_s`` to write what waits (connecting meanwhile, as libzmq)."""
        deadline = time.monotonic() + linger_s
        while self._connection is None and self._unsent and time.monotonic() < deadline:
            self._connect()
            if self._connection is None:
                time.sleep(min(self.reconnect_ivl_s, max(0.0, deadline - time.monotonic())))
        self._closed = True
        self._alarm.cancel()
        if self._connection is not None:
            _flush_before_closing([self._connection], max(0.0, deadline - time.monotonic()))
            self._connection.close()
            self._connection = None
        self._poller.close()
        self._alarm.close()

    def _service(self) -> None:
        connection = self._connection
        if connection is None:
            self._reconnect_if_due()
            return
        try:
            if connection.writing:
                connection.write()
            connection.read()
        except ZmtpError as exc:
            self.on_refused(f"ipc://{self.path}", exc)
            connection.broken = True
        if connection.broken:
            self._lost()
        elif not connection.reader.ready:
            rang, now = self._alarm.rang(), time.monotonic()
            if now >= self._handshake_by:
                log.warning("ipc://%s: no handshake from the peer within %g s; reconnecting", self.path, self.handshake_s)
                self._lost(refused=False)
            elif rang:   # early (a timer is no exact clock): ring again at the deadline
                self._alarm.ring_in(self._handshake_by - now)
        elif self._handshake_by:   # the handshake just ended
            self._handshake_by = 0.0
            self._alarm.stop()

    def _connect(self) -> None:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:   # out of descriptors: tried again after the backoff
            log.warning("connecting to ipc://%s: %s", self.path, exc)
            self._retry_later()
            return
        sock.setblocking(False)   # a full backlog answers EAGAIN (retried) instead of blocking the owner
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
            sock.connect(_unix_address(self.path))
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN):
                log.debug("connecting to ipc://%s: %s", self.path, exc)
            self._retry_later()
            return
        self._connection = connection = _Connection(sock, self._poller, b"DEALER", self.identity, self.pools)
        connection.out.extend(self._unsent)
        self._unsent.clear()
        connection.write()
        self._handshake_by = time.monotonic() + self.handshake_s   # the alarm stays watched until the peer's READY
        self._alarm.ring_in(self.handshake_s)

    def _lost(self, refused: bool = True) -> None:
        """The connection ended (``refused``: by the peer, not by our handshake deadline)."""
        connection, self._connection = self._connection, None
        self._handshake_by = 0.0
        if connection is not None:
            self._inbox.extend(connection.reader.messages)   # read before the end: still the owner's
            self._unsent.extend(connection.unsent())
            connection.close()
            if connection.reader.greeted or not refused:
                self._backoff = self.reconnect_ivl_s
                self._cut_short = 0
            else:
                # libzmq closes at once, without a word, on a peer whose mechanism is not its
                # own; twice in a row is no accident of a restart.
                self._cut_short += 1
                if self._cut_short == 2:
                    self.on_refused(f"ipc://{self.path}", ZmtpError(
                        "it closes the connection before its greeting, as a broker that requires CURVE does"))
        self._watch_wake(True)
        self._retry_later()

    def _watch_wake(self, watched: bool) -> None:
        if not self._closed:
            self._alarm.watch(watched)

    def _retry_later(self) -> None:
        """Reconnect after the backoff; the timer makes the descriptor readable, so the owner calls in."""
        if self._closed:
            return
        self._retry_at = time.monotonic() + self._backoff
        delay, self._backoff = self._backoff, min(self._backoff * 2, self.reconnect_ivl_max_s)
        self._alarm.ring_in(delay)

    def _reconnect_if_due(self) -> None:
        woken = self._alarm.rang()
        if self._connection is None and not self._closed and (woken or time.monotonic() >= self._retry_at):
            self._alarm.cancel()
            self._connect()


class ZmtpRouter:
    edge_triggered = False

    def __init__(self, path: str, hwm: int = 100_000,
                 on_refused: Callable[[str, ZmtpError], None] | None = None, handshake_s: float = _HANDSHAKE_S,
                 pools: PoolUse | None = None) -> None:
        self.path = path
        self.hwm = hwm
        self.pools = pools
        self.handshake_s = handshake_s
        # Told (endpoint, error) of a peer that is not a NULL ZMTP DEALER; its connection is closed.
        self.on_refused = on_refused or (lambda endpoint, exc: log.warning("refused a client on %s: %s", endpoint, exc))
        self._poller = select.epoll()
        self._listener = _listen(path)
        self._inode = None if path.startswith("@") else os.stat(path).st_ino
        self._poller.register(self._listener.fileno(), select.EPOLLIN)
        self._connections: dict[int, _Connection] = {}     # by descriptor
        self._by_identity: dict[bytes, _Connection] = {}   # those past their READY
        self._identities: dict[int, bytes] = {}
        self._messages: collections.deque[list] = collections.deque()   # [identity, parts...]
        self._anonymous = itertools.count(1)
        self._handshakes: dict[_Connection, float] = {}   # connections before their READY, by deadline
        self._alarm = _Alarm(self._poller)                 # watched while there are any
        # Out of descriptors, the listener stays readable with nothing it can accept: it is left
        # out of the poller for a while (the owner's loop would spin on it), this alarm its way back.
        self._accept_alarm = _Alarm(self._poller)
        self._accepting = True
        self._accept_failed = False   # since the last connection accepted

    def fileno(self) -> int:
        return self._poller.fileno()

    def send_parts(self, parts: list, flags: int = 0) -> None:
        """Send ``parts[1:]`` to the peer named ``parts[0]``: EHOSTUNREACH when there is none,
        zmq.Again when ``hwm`` messages already wait for it (``flags``: libzmq's signature)."""
        connection = self._by_identity.get(bytes(parts[0]))
        if connection is None or connection.broken or connection.write_failed:
            raise zmq.ZMQError(errno.EHOSTUNREACH)
        if len(connection.out) >= self.hwm:
            raise zmq.Again()
        connection.queue(encode(parts[1:]))   # a failed write leaves it to be read to its end

    def has_message(self) -> bool:
        if self._messages:
            return True
        self._service()
        return bool(self._messages)

    def has_message_read(self) -> bool:
        """Whether a message was read and waits, without a system call: what has not been read
        keeps the descriptor readable (the poller is level-triggered)."""
        return bool(self._messages)

    def recv_parts(self) -> list:
        """One multipart message, its sender's identity first, without blocking (zmq.Again)."""
        if not self._messages:
            self._service()
            if not self._messages:
                raise NothingToRead()
        return self._messages.popleft()

    def close(self, linger_s: float = 0.0) -> None:
        _flush_before_closing(list(self._connections.values()), linger_s)
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()
        self._by_identity.clear()
        self._handshakes.clear()
        self._poller.close()
        self._alarm.close()
        self._accept_alarm.close()
        self._listener.close()
        try:
            if os.stat(self.path).st_ino == self._inode:   # not a newer router's socket at the same path
                os.unlink(self.path)
        except OSError:
            pass

    def _service(self) -> None:
        for fd, events in self._poller.poll(0):
            if fd == self._listener.fileno():
                self._accept()
                continue
            connection = self._connections.get(fd)
            if connection is None:   # an alarm's descriptor
                if not self._accepting and self._accept_alarm.rang():
                    self._resume_accepting()
                continue
            try:
                if events & select.EPOLLOUT:
                    connection.write()
                if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    was_ready = connection.reader.ready
                    connection.read()
                    if not was_ready and connection.reader.ready:
                        self._named(connection)
                    self._take_messages(connection)
            except ZmtpError as exc:
                self.on_refused(f"ipc://{self.path}", exc)
                connection.broken = True
            if connection.broken:
                self._drop(connection)
        if self._handshakes:
            self._end_overdue_handshakes()

    def _end_overdue_handshakes(self) -> None:
        rang = self._alarm.rang()
        now = time.monotonic()
        for connection, deadline in list(self._handshakes.items()):
            if connection.reader.ready or connection.broken:
                del self._handshakes[connection]
            elif now >= deadline:
                log.warning("ipc://%s: dropped a client that had not finished its handshake within %g s",
                            self.path, self.handshake_s)
                self._drop(connection)
        if not self._handshakes:
            self._alarm.stop()
        elif rang:   # it rang for the earliest deadline: now the next one's
            self._alarm.ring_in(max(0.0, min(self._handshakes.values()) - now))

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):   # that client's, gone already
                    continue
                self._pause_accepting(exc)   # out of descriptors, say: the peer waits in the backlog
                return
            if self._accept_failed:
                self._accept_failed = False
                log.info("accepting connections on ipc://%s again", self.path)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
            connection = _Connection(sock, self._poller, b"ROUTER", pools=self.pools)
            self._connections[connection.fd] = connection
            connection.write()
            if not self._handshakes:
                self._alarm.ring_in(self.handshake_s)
                self._alarm.watch(True)
            self._handshakes[connection] = time.monotonic() + self.handshake_s

    def _pause_accepting(self, exc: OSError) -> None:
        if not self._accept_failed:   # once, not every pause while it lasts
            log.warning("cannot accept a connection on ipc://%s (%s): trying again every %g s", self.path, exc,
                        _ACCEPT_PAUSE_S)
            self._accept_failed = True
        self._accepting = False
        self._poller.modify(self._listener.fileno(), 0)
        self._accept_alarm.watch(True)
        self._accept_alarm.ring_in(_ACCEPT_PAUSE_S)

    def _resume_accepting(self) -> None:
        self._accept_alarm.stop()
        self._accepting = True
        self._poller.modify(self._listener.fileno(), select.EPOLLIN)
        self._accept()

    def _named(self, connection: _Connection) -> None:
        """Route to ``connection`` by the identity of its READY. As libzmq's ROUTER, an identity
        that a live peer holds is refused; one whose connection has ended (the peer reconnected
        before its old connection was seen closing) passes to the new connection."""
        identity = connection.reader.properties.get(b"Identity")
        if identity and identity[0] == 0:
            raise ZmtpError("an identity starting with a zero byte (reserved for anonymous peers)")
        identity = identity or b"\0" + next(self._anonymous).to_bytes(4, "big")
        previous = self._by_identity.get(identity)
        if previous is not None:
            try:
                previous.read()
            except ZmtpError:
                previous.broken = True
            self._take_messages(previous)
            if not previous.broken:
                raise ZmtpError(f"the identity {identity!r} is another live peer's")
            self._drop(previous)
        self._by_identity[identity] = connection
        self._identities[connection.fd] = identity

    def _take_messages(self, connection: _Connection) -> None:
        messages = connection.reader.messages
        if messages:
            identity = self._identities.get(connection.fd)
            if identity is None:
                raise ZmtpError("a message before its READY")
            while messages:
                parts = messages.popleft()
                parts.insert(0, identity)
                self._messages.append(parts)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.fd, None)
        if self._handshakes.pop(connection, None) is not None and not self._handshakes:
            self._alarm.stop()   # the last handshake ended with its connection: nothing left to time
        identity = self._identities.pop(connection.fd, None)
        if identity is not None and self._by_identity.get(identity) is connection:
            del self._by_identity[identity]
        connection.broken = True
        connection.close()


def _unix_address(path: str) -> str:
    return "\0" + path[1:] if path.startswith("@") else path   # @: Linux's abstract names


def _listen(path: str) -> socket.socket:
    """A listening Unix socket at ``path``, replacing a socket file left by a process that is gone (as libzmq does)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if not path.startswith("@"):
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                os.unlink(path)
        except FileNotFoundError:
            pass
    sock.bind(_unix_address(path))
    sock.listen(256)
    sock.setblocking(False)
    return sock
