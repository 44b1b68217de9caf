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
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from dataclasses import dataclass, field

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

    def retire(self) -> None:
        """No longer passed on: views of it still alive keep the mapping; sent on, they are bytes."""
        _directory.pop(id(self.mapping), None)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_directory: dict[int, MappedPool] = {}   # id(mapping) -> pool, every pool this process may pass on
_numbers = iter(range(1, 1 << 31))


def map_pool(fd: int, size: int, passed_on: bool) -> MappedPool:
    """Map the memory file ``fd``. ``passed_on``: this process sends views of it on (the gateway
    that owns it, the broker): the pool keeps the descriptor and joins the directory. Otherwise
    (an instance, which copies tensors out) it is mapped read-only and the descriptor closed."""
    try:
        if os.fstat(fd).st_size < size:   # a mapping past the file's end would fault (SIGBUS) when read
            raise OSError(f"the memory file holds {os.fstat(fd).st_size} bytes")
        # Writable where passed on, for its address (ctypes reads one only of a writable buffer);
        # only the owner writes to it.
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if passed_on else 0)
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    except BaseException:
        os.close(fd)
        raise
    if not passed_on:
        os.close(fd)
        return MappedPool(None, size, 0, mapping, memoryview(mapping), 0)
    pool = MappedPool(fd, size, next(_numbers), mapping, memoryview(mapping), _address(mapping))
    _directory[id(mapping)] = pool
    return pool


def unmap(pool: MappedPool) -> None:
    """An instance's mapping, no longer needed (the tensors read from it were copied)."""
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


class SharedPool:
    """The gateway's pool: slots of a power-of-two size, each freed as a whole; a freed slot is
    kept for the next tensor of its size (its pages stay allocated: reused, not faulted in again)."""

    def __init__(self, size: int = DEFAULT_POOL_BYTES) -> None:
        fd = os.memfd_create("tritium-tensors", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        self.pool = map_pool(fd, size, passed_on=True)
        self._top = 0                                    # the pool is carved from here up
        self._free: dict[int, list[int]] = {}            # slot size -> free offsets
        self._sizes: dict[int, int] = {}                 # offset of a slot in use -> its size

    def place(self, data) -> tuple[memoryview, int] | None:
        """A copy of ``data`` in a slot: (its view, the slot's offset for ``free``); None when the
        pool has no room (the caller sends the bytes as they are)."""
        source = memoryview(data)
        if not source.c_contiguous:
            return None
        count = source.nbytes
        size = max(SMALLEST_SLOT, 1 << (count - 1).bit_length())
        free = self._free.get(size)
        if free:
            offset = free.pop()
        elif self._top + size <= self.pool.size:
            offset, self._top = self._top, self._top + size
        else:
            return None
        self._sizes[offset] = size
        view = self.pool.view[offset:offset + count]
        view[:] = source.cast("B")
        return view, offset

    def free(self, offset: int) -> None:
        size = self._sizes.pop(offset)
        self._free.setdefault(size, []).append(offset)

    @property
    def size(self) -> int:
        return self.pool.size

    @property
    def in_use(self) -> int:
        """Slots not freed."""
        return len(self._sizes)


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

    def __init__(self, size: int, when_full: str) -> None:
        self.pool = SharedPool(size)
        self._when_full = when_full   # logged once each time the pool fills up
        self._held: dict[int, list[int]] = {}   # rid -> the offsets of its slots
        self._was_full = False

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
                    self._full()
                else:
                    frame, offset = slot
                    self._held.setdefault(rid, []).append(offset)
                    self._was_full = False
            placed.append(frame)
        return placed

    def release(self, rid: int) -> None:
        for offset in self._held.pop(rid, ()):
            self.pool.free(offset)

    def release_all(self) -> None:
        for rid in list(self._held):
            self.release(rid)

    def _full(self) -> None:
        if not self._was_full:
            self._was_full = True
            log.warning("%s", self._when_full.format(mib=self.pool.size / (1 << 20)))

