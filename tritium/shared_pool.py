"""Shared memory for large tensors on one host: written once by the gateway, read by the instance.

On the local links a large tensor would otherwise be copied through four Unix sockets (the
gateway's send, the broker's receive and send, the instance's receive). A gateway instead
copies it into its ``SharedPool`` (a memory file, its descriptor passed to the broker once per
connection, and by the broker to each instance once) and the links carry a reference (pool,
offset, size): the broker forwards 20 bytes, and the instance copies the tensor out of its
mapping when it reads the message, so a model never holds pool memory. The gateway frees a
tensor's slot when its request is answered (the instance has read it by then; see
gateway/broker_link.py). Measured: a fresh memory file per tensor costs three times a socket
copy (its pages allocated and freed each time), so the pool keeps its slots' pages.

Every mapping of a pool in a process is in one directory, so that a view of one can be
recognised wherever it is sent (``locate``) and sent on as a reference.

Large outputs go the other way through each instance's own pool (``AnswerSlots``), whose slots
are *released by their reader*: the process that reads a tensor (a gateway, which writes it to
its client from the pool and lets go of it then; an instance that made a BLS call, which copies
it out) does not answer the instance, so it marks the slot free in the pool itself (a byte per
64 KiB in the pool's first slots), and the instance reuses the slots so marked. A
process that holds a view of such a slot (the instance that placed it, the broker forwarding it)
either hands it on as a reference, whole (the next holder's duty from then on), or, when its last
view goes without that, marks the slot free itself (``hold``). The marks are single bytes
written after the copy out and read before the slot is written again: ordered as needed on x86;
on weaker memory models the instance's own work between reading a mark and writing the slot is
far longer than any reordering of the reader's copy.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

log = logging.getLogger(__name__)

SMALLEST_SLOT = 64 * 1024            # slots are powers of two from this up, page-aligned
DEFAULT_POOL_BYTES = 256 * 1024 * 1024   # address space: pages are allocated when first written


@dataclass(eq=False)
class MappedPool:
    """One pool as this process maps it: ``view`` is all of it; ``fd`` its memory file while the
    process may still pass it on (None once retired)."""

    fd: int | None
    size: int
    number: int                       # its number on the links this process sends it on
    mapping: mmap.mmap
    view: memoryview
    address: int                      # where the mapping starts in this process
    holders: list = field(default_factory=list)   # the connections this process passed it to
    released_by_reader: bool = False  # an instance's answer pool: see the module's docstring
    holds: dict = field(default_factory=dict)     # id(view) -> its weakref.finalize: views this process holds

    def retire(self) -> None:
        """No longer passed on: views of it still alive keep the mapping; sent on, they are bytes."""
        _directory.pop(id(self.mapping), None)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_directory: dict[int, MappedPool] = {}   # id(mapping) -> pool, every pool this process may pass on
_numbers = iter(range(1, 1 << 31))


def map_pool(fd: int, size: int, passed_on: bool, released_by_reader: bool = False) -> MappedPool:
    """Map the memory file ``fd``. ``passed_on``: this process sends views of it on (the gateway
    that owns it, the broker): the pool keeps the descriptor and joins the directory. Otherwise
    (a reader, which copies tensors out) the descriptor is closed, and the mapping is read-only
    unless the reader marks slots free in it (``released_by_reader``)."""
    try:
        if os.fstat(fd).st_size < size:   # a mapping past the file's end would fault (SIGBUS) when read
            raise OSError(f"the memory file holds {os.fstat(fd).st_size} bytes")
        # Writable where passed on, for its address (ctypes reads one only of a writable buffer);
        # only the owner writes tensors to it, and readers and holders only the marks.
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if passed_on or released_by_reader else 0)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    except BaseException:
        os.close(fd)
        raise
    if not passed_on:
        os.close(fd)
        return MappedPool(None, size, 0, mapping, memoryview(mapping), 0, released_by_reader=released_by_reader)
    pool = MappedPool(fd, size, next(_numbers), mapping, memoryview(mapping), _address(mapping),
                      released_by_reader=released_by_reader)
    _directory[id(mapping)] = pool
    return pool


def release_slot(pool: MappedPool, offset: int) -> None:
    """Mark the slot at ``offset`` of an answer pool free: its tensor was copied out, or dropped."""
    pool.view[offset // SMALLEST_SLOT] = 0


def hold(pool: MappedPool, view: memoryview, offset: int) -> None:
    """This process holds ``view`` of an answer pool's slot: the slot is released when the view
    goes, unless it was handed on whole first (``hand_on``)."""
    key = id(view)
    token = weakref.finalize(view, _dropped, pool, key, offset)
    token.atexit = False
    pool.holds[key] = token


def hand_on(pool: MappedPool, view: memoryview) -> weakref.finalize | None:
    """Claim ``view``'s hold to send it on as a reference: None when this process does not hold
    it (a slice of a held view, or one claimed already), and it must then go as its bytes. The
    caller ``detach``es the claim once the reference is written whole; a claim never completed
    releases the slot when the view goes, as an unclaimed hold does."""
    token = pool.holds.pop(id(view), None)
    return token if token is not None and token.alive else None


def _dropped(pool: MappedPool, key: int, offset: int) -> None:
    token = pool.holds.get(key)
    if token is not None and not token.alive:   # this one, not a later view's at the same id
        del pool.holds[key]
    release_slot(pool, offset)


def unmap(pool: MappedPool) -> None:
    """A reader's mapping, no longer needed (the tensors read from it were copied). An answer
    pool's is left to go with the last view whose release still writes to it."""
    if pool.released_by_reader:
        return
    try:
        pool.view.release()
        pool.mapping.close()
    except BufferError:   # a view of it still alive: unmapped when the last one goes
        pass


def locate(view: memoryview) -> tuple[MappedPool, int] | None:
    """The pool ``view`` lies in and its offset there, if it is a view of a pool this process may pass on."""
    pool = _directory.get(id(view.obj))
    if pool is None or not view.contiguous or not len(view):
        return None
    return pool, _address(view) - pool.address


def _address(buffer) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class _Buddies:
    """Which parts of a pool are free, as blocks of a power-of-two size aligned to their size: a
    block is split in halves for a smaller slot, and a freed slot joins its free twin (its
    buddy) back into the larger block, so small slots freed leave room for large ones. The
    lowest free block of the smallest size that fits is taken, so the pages in use tend to stay
    together at the bottom of the pool (they stay allocated once written: reused, not faulted
    in again)."""

    def __init__(self, start: int, end: int) -> None:
        self._start = start
        self._free: dict[int, set[int]] = {}   # block size -> offsets of the free blocks of that size
        offset = start
        while end - offset >= SMALLEST_SLOT:   # the largest aligned blocks that fit, in turn
            size = 1 << ((end - offset).bit_length() - 1)
            while (offset - start) % size:
                size >>= 1
            self._free.setdefault(size, set()).add(offset)
            offset += size
        self._largest = max(self._free, default=0)

    def take(self, size: int) -> int | None:
        """The offset of a free slot of ``size`` bytes (a power of two), or None."""
        block = size
        while block <= self._largest:
            blocks = self._free.get(block)
            if blocks:
                offset = min(blocks)
                blocks.remove(offset)
                while block > size:   # split: the upper half stays free
                    block >>= 1
                    self._free.setdefault(block, set()).add(offset + block)
                return offset
            block <<= 1
        return None

    def give(self, offset: int, size: int) -> None:
        """The slot at ``offset`` of ``size`` bytes is free again: joined with its buddy while that is free."""
        while True:
            buddy = self._start + ((offset - self._start) ^ size)
            blocks = self._free.get(size)
            if not blocks or buddy not in blocks:
                break
            blocks.remove(buddy)
            offset, size = min(offset, buddy), size << 1
        self._free.setdefault(size, set()).add(offset)


class PoolUsage(NamedTuple):
    """A pool's figures, as its owner reports them on its heartbeats (the broker's /metrics)."""

    size: int        # bytes
    used: int        # bytes of the slots in use
    overflows: int   # large tensors sent as bytes because the pool had no room (since it started)
    renewals: int = 0   # times the pool was replaced by a new one, its slots given up for lost


class SharedPool:
    """A pool its owner places tensors in: slots of a power-of-two size from 64 KiB, each freed
    as a whole (``_Buddies``). ``released_by_reader``: an answer pool, its first slots the marks
    of the others (a byte per 64 KiB, 1 while in use), and a placed tensor ``hold``."""

    def __init__(self, size: int = DEFAULT_POOL_BYTES, released_by_reader: bool = False) -> None:
        fd = os.memfd_create("tritium-tensors", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        self.pool = map_pool(fd, size, passed_on=True, released_by_reader=released_by_reader)
        marks = -(-size // SMALLEST_SLOT) if released_by_reader else 0
        self._free = _Buddies(-(-marks // SMALLEST_SLOT) * SMALLEST_SLOT, size)
        self._sizes: dict[int, int] = {}   # offset of a slot in use -> its size

    def place(self, data) -> tuple[memoryview, int] | None:
        """A copy of ``data`` in a slot: (its view, the slot's offset for ``free``); None when the
        pool has no room (the caller sends the bytes as they are)."""
        source = memoryview(data)
        if not source.c_contiguous:
            return None
        count = source.nbytes
        size = max(SMALLEST_SLOT, 1 << (count - 1).bit_length())
        offset = self._free.take(size)
        if offset is None:
            return None
        self._sizes[offset] = size
        view = self.pool.view[offset:offset + count]
        view[:] = source.cast("B")
        if self.pool.released_by_reader:
            self.pool.view[offset // SMALLEST_SLOT] = 1
            hold(self.pool, view, offset)
        return view, offset

    def reclaim(self) -> None:
        """Free the slots of an answer pool that their readers (or holders) marked free."""
        marks = self.pool.view
        for offset in [offset for offset in self._sizes if not marks[offset // SMALLEST_SLOT]]:
            self.free(offset)

    def free(self, offset: int) -> None:
        self._free.give(offset, self._sizes.pop(offset))

    @property
    def size(self) -> int:
        return self.pool.size

    @property
    def used(self) -> int:
        """Bytes of the slots in use (asked once a second, for the heartbeats)."""
        return sum(self._sizes.values())

    @property
    def in_use(self) -> int:
        """Slots not freed."""
        return len(self._sizes)


_COUNTED = " (said at most once a minute; tritium_tensor_pool_overflows_total counts each such tensor)"


class _Occasionally:
    """Whether a warning is due: at most once per ``every_s``. A pool that fills and drains under
    load is full again with every other request."""

    def __init__(self, clock: Callable[[], float], every_s: float = 60.0) -> None:
        self._clock = clock
        self._every_s = every_s
        self._last: float | None = None

    def due(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self._every_s:
            return False
        self._last = now
        return True


def request_slots(size: int, when_full: str) -> RequestSlots | None:
    """``RequestSlots`` over a new pool of ``size`` bytes; None, said once, when the system gives no
    such memory (no memfd, not that much address space): large tensors then cross as bytes."""
    try:
        return RequestSlots(size, when_full)
    except OSError as exc:
        log.warning("no shared memory of %g MiB for large tensors (%s): they cross the local sockets as bytes",
                    size / (1 << 20), exc)
        return None


class RequestSlots:
    """A pool's slots held by the requests in flight of one sender (a gateway, a model's BLS
    calls): a request's large frames are placed in the pool as it is sent and its slots freed when
    it is answered, by when the instance that read them has copied them out. Not thread-safe."""

    def __init__(self, size: int, when_full: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = SharedPool(size)
        self._when_full = when_full   # logged when the pool is full, at most once a minute
        self._full_said = _Occasionally(clock)
        self._held: dict[int, list[int]] = {}   # rid -> the offsets of its slots
        self.overflows = 0   # large frames sent as bytes for want of room

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def place(self, rid: int, frames) -> list:
        """``frames`` with each large one replaced by its copy in the pool (where there is room)."""
        placed = []
        for frame in frames:
            view = memoryview(frame)
            if view.nbytes >= SMALLEST_SLOT and view.c_contiguous:
                slot = self.pool.place(view)
                if slot is None:
                    self.overflows += 1
                    self._full()
                else:
                    frame, offset = slot
                    self._held.setdefault(rid, []).append(offset)
            placed.append(frame)
        return placed

    def release(self, rid: int) -> None:
        for offset in self._held.pop(rid, ()):
            self.pool.free(offset)

    def release_below(self, rid: int) -> None:
        """Free the slots of every request numbered below ``rid`` (lost with a broker process)."""
        for held in [r for r in self._held if r < rid]:
            self.release(held)

    def release_all(self) -> None:
        for rid in list(self._held):
            self.release(rid)

    def usage(self) -> PoolUsage:
        return PoolUsage(self.pool.size, self.pool.used, self.overflows)

    def _full(self) -> None:
        if self._full_said.due():
            log.warning("%s%s", self._when_full.format(mib=self.pool.size / (1 << 20)), _COUNTED)


def answer_slots(size: int) -> AnswerSlots | None:
    """``AnswerSlots`` over a new pool of ``size`` bytes; None, said once, when the system gives none."""
    try:
        return AnswerSlots(size)
    except OSError as exc:
        log.warning("no shared memory of %g MiB for large outputs (%s): they cross the local sockets as bytes",
                    size / (1 << 20), exc)
        return None


class AnswerSlots:
    """An instance's pool for its large outputs, released by their readers (see the module's
    docstring). Not thread-safe: whoever holds the instance's Outbox lock places the answer it sends.

    A reader that dies (a gateway killed) never releases the slots of the answers it had not
    read yet. A pool full for ``RENEW_AFTER_S`` (far longer than any answer waits to be read) is
    taken to be full of such slots and replaced by a new one: nothing of the old is reused, and
    its memory goes with the last mapping of it."""

    RENEW_AFTER_S = 30.0

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = SharedPool(size, released_by_reader=True)
        self._clock = clock
        self._full_since: float | None = None
        self._full_said = _Occasionally(clock)
        self.overflows = 0   # large outputs sent as bytes for want of room
        self.renewals = 0    # pools made anew (``renew``)

    def place(self, frames: list) -> list:
        """``frames`` (a message: its record first) with each large tensor replaced by its copy in
        the pool, where there is room."""
        placed = None
        for index in range(1, len(frames)):
            view = memoryview(frames[index])
            if view.nbytes < SMALLEST_SLOT or not view.c_contiguous:
                continue
            if placed is None:
                placed = list(frames)
                self.pool.reclaim()
            slot = self.pool.place(view)
            if slot is None and self._renewed():
                slot = self.pool.place(view)
            if slot is None:
                self.overflows += 1
            else:
                placed[index] = slot[0]
                self._full_since = None
        return frames if placed is None else placed

    def usage(self) -> PoolUsage:
        """What the pool holds now: the slots its readers released are freed first."""
        self.pool.reclaim()
        return PoolUsage(self.pool.size, self.pool.used, self.overflows, self.renewals)

    def renew(self) -> bool:
        """Place in a new pool from now on, the old one retired (nothing of it reused); False, said,
        when the system gives no new one (the old one is kept)."""
        try:
            fresh = SharedPool(self.pool.size, released_by_reader=True)
        except OSError as exc:
            log.warning("could not make a new pool for large outputs (%s); keeping the old one", exc)
            return False
        self.retire()
        self.pool = fresh
        self.renewals += 1
        return True

    def retire(self) -> None:
        """No longer used: its memory goes with the last mapping of it, in any process (the peers
        it was passed to are told, X-POOL-END)."""
        pool = self.pool.pool
        pool.retire()
        for holder in list(pool.holders):
            holder.pool_ended(pool)

    def _renewed(self) -> bool:
        """The pool is full: said (at most once a minute); replaced once it has been full for
        ``RENEW_AFTER_S``."""
        now = self._clock()
        if self._full_since is None:
            self._full_since = now
            if self._full_said.due():
                log.warning("the instance's pool for large outputs (--tensor-pool-mb, %g MiB) is full: large outputs "
                            "cross the local sockets as bytes until its readers free some%s",
                            self.pool.size / (1 << 20), _COUNTED)
            return False
        if now - self._full_since < self.RENEW_AFTER_S:
            return False
        log.warning("the instance's pool for large outputs has been full for %g s: taking its slots for lost "
                    "(a reader that went without freeing them) and making a new one", now - self._full_since)
        self._full_since = None if self.renew() else now   # (no new one: tried again after as long)
        return self._full_since is None

