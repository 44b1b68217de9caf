"""Triton's system shared memory extension, on the gateway side.

Clients on the gateway's host put tensors in POSIX shared memory and name the region in
a request instead of sending the bytes. Registrations go through the broker, which
pushes the list of regions to every gateway process (they share the ports), and each
gateway opens a region the first time it sees it. Only gateways touch client memory:
workers may run on other hosts.

A region is read and written through its file (``pread``/``pwrite``), not a mapping: a client
that shrinks its shared memory object after registering it would make a read of the mapping
past the new end kill the gateway (SIGBUS), every client's requests with it. Through the file,
the request is refused instead.
"""

from __future__ import annotations

import logging
import os
import stat
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

from tritium.errors import InvalidArgument, NotFound
from tritium.protocol import SharedMemoryRegion

log = logging.getLogger(__name__)

_SHM_ROOT = "/dev/shm"
CUDA_SHM_UNSUPPORTED = "CUDA shared memory is not supported by tritium; use system shared memory"
SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


def unknown_cuda_region(name: str) -> str:
    """Triton's text for the status of a CUDA region it does not have (here: any)."""
    return f"Unable to find cuda shared memory region: '{name}'"


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor lives: a registered region, an offset in it and a byte size."""

    region: str
    offset: int
    byte_size: int


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int   # closed with the last reference to the region (a request in flight may hold one)
    _closer: weakref.finalize = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._closer = weakref.finalize(self, os.close, self.fd)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, start: int, byte_size: int) -> bytes:
        data = os.pread(self.fd, byte_size, start)
        if len(data) == byte_size:
            return data
        parts = [data]   # a read returns at most 2 GiB less 4 KiB (Linux): a larger one comes in parts
        got = len(data)
        while got < byte_size and (part := os.pread(self.fd, byte_size - got, start + got)):
            parts.append(part)
            got += len(part)
        if got < byte_size:
            raise _truncated(self)
        return b"".join(parts)

    def write(self, start: int, data: memoryview) -> None:
        if os.fstat(self.fd).st_size < start + len(data):   # not written past the client's new end
            raise _truncated(self)
        written = 0
        try:
            while written < len(data):   # a write, too, takes at most 2 GiB less 4 KiB
                written += os.pwrite(self.fd, data[written:], start + written)
        except OSError as exc:   # the object shrank meanwhile and /dev/shm is full, say
            raise InvalidArgument(f"cannot write to shared memory region '{self.name}': {exc.strerror}") from None


def _truncated(region: Region) -> InvalidArgument:
    return InvalidArgument(f"shared memory region '{region.name}' is smaller than when it was registered: "
                           f"its object '{region.key}' no longer holds {region.offset + region.byte_size} bytes")


def open_region(key: str, offset: int, byte_size: int, name: str = "") -> int:
    """A descriptor of the POSIX shared memory object ``key``; it must hold offset + byte_size
    bytes (region ``name``'s, as Triton names it when they do not fit)."""
    path = os.path.join(_SHM_ROOT, key.lstrip("/"))
    if "/" in key.lstrip("/") or not key.strip("/"):
        raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
    try:
        # As shm_open opens it: never through a link (a client could point one at any file the
        # gateway may read or write). Only a shared memory object is a region: not a FIFO, say.
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise InvalidArgument(f"Unable to open shared memory region: '{key}'")
        size = status.st_size
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(f"Invalid shared memory region: '{key}'")
        if offset + byte_size > size:   # (Triton's words)
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedMemoryRegions:
    """The regions registered with the broker, as this gateway has opened them."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    def apply(self, table: Iterable[SharedMemoryRegion]) -> None:
        """Follow the broker's list: open new regions, let go of the ones that went away."""
        wanted = {entry.name: entry for entry in table}
        for name, region in list(self._regions.items()):
            entry = wanted.get(name)
            if entry is None or (entry.key, entry.offset, entry.byte_size) != \
                    (region.key, region.offset, region.byte_size):
                # Not closed here: a request that started with it still writes its outputs there,
                # as Triton lets requests in flight finish; its descriptor goes with the last of them.
                del self._regions[name]
        for name, entry in wanted.items():
            if name in self._regions:
                continue
            try:
                fd = open_region(entry.key, entry.offset, entry.byte_size, name)
            except InvalidArgument as exc:  # gone since it was registered: requests naming it fail
                log.warning("shared memory region '%s': %s", name, exc.message)
                continue
            self._regions[name] = Region(name, entry.key, entry.offset, entry.byte_size, fd)

    def status(self, name: str | None) -> list[dict]:
        if name is None:
            return [region.status() for region in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def read(self, ref: SharedMemoryRef) -> bytes:
        """An input's bytes, copied: the client may reuse the region once answered."""
        region = self._region(ref)
        return region.read(_span(region, ref), ref.byte_size)

    def write(self, ref: SharedMemoryRef, output: str, data, region: Region | None = None) -> None:
        """``region``: the one ``check`` gave when the request started (still written to if it was
        unregistered since)."""
        region = region or self._region(ref)
        start = _span(region, ref)
        view = memoryview(data).cast("B")
        if len(view) > ref.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{output}' ({ref.byte_size} bytes) "
                f"should be at least {len(view)} bytes to hold the results")
        region.write(start, view)

    def check(self, ref: SharedMemoryRef) -> Region:
        """The region ``ref`` names, if the reference fits it."""
        region = self._region(ref)
        _span(region, ref)
        return region

    def _region(self, ref: SharedMemoryRef) -> Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{ref.region}'")
        return region


def _span(region: Region, ref: SharedMemoryRef) -> int:
    """Where in ``region``'s object the reference starts; InvalidArgument if it does not fit."""
    if ref.offset >= region.byte_size:
        raise InvalidArgument(f"Invalid offset for shared memory region: '{ref.region}'")
    if ref.byte_size <= 0 or ref.offset + ref.byte_size > region.byte_size:
        raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{ref.region}'")
    return region.offset + ref.offset


def shared_memory_ref(owner: str, parameters: dict) -> SharedMemoryRef | None:
    """The reference an input's or output's parameters make, or None; bad values are 400s."""
    region = parameters.get("shared_memory_region")
    if region is None:
        return None
    if not isinstance(region, str):
        raise InvalidArgument(f"Unable to parse 'shared_memory_region' of {owner}: expected a string")
    values = []
    for key, default in (("shared_memory_offset", 0), ("shared_memory_byte_size", 0)):
        value = parameters.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"Unable to parse '{key}' of {owner}: expected an unsigned integer")
        values.append(value)
    return SharedMemoryRef(region, values[0], values[1])
