"""Triton's local response cache: identical requests answered without reaching an instance.

Enabled per model (``response_cache { enable: true }``) and sized for the whole broker
(``--cache-config local,size=BYTES``). The key is a hash of the model name, version,
each input's name, datatype, shape and bytes (as Triton's), and the outputs asked for
(so that a request for one output is never answered with another's). Entries are whole
RESPONSE records, evicted least recently used first when the byte budget is spent.

This is the one place where the broker reads tensor bytes: it hashes them (without
copying) for models that enable the cache, and keeps a copy of their responses.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import msgpack
import msgspec

from tritium.protocol import Infer, Response, read_record, record_body, tensor_views


@dataclass(frozen=True, slots=True)
class CachedResponse:
    header: Response        # the RESPONSE header, its rid the first asker's
    inline: bytes           # the record's inline tensor bytes
    external: tuple         # its external frames' bytes
    size: int

    def parts_for(self, rid: int) -> list:
        """The RESPONSE record(s) answering request ``rid``."""
        return [msgspec.structs.replace(self.header, rid=rid).encode([self.inline]), *self.external]


def parse_cache_config(values: tuple[str, ...]) -> int:
    """Bytes of ``--cache-config local,size=N`` (0 when not given); ValueError on anything else."""
    size = 0
    if len({value.partition(",")[0] for value in values}) > 1:
        raise ValueError("found multiple cache configurations, but only a single cache is currently supported")
    for value in values:
        kind, _, setting = value.partition(",")
        if kind != "local":
            raise ValueError(f"cache '{kind}' is not supported; tritium has the 'local' cache only")
        key, _, number = setting.partition("=")
        if key != "size" or not number.isdigit():
            raise ValueError(f"--cache-config expects 'local,size=<bytes>', got '{value}'")
        size = int(number)
    return size


def request_key(model: str, computed_by: int | list, header: Infer, record, external) -> bytes:
    """The cache key of an INFER record (header already decoded); ``computed_by``: the loads that
    would compute its answer (Scheduler._computed_by)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(msgpack.packb([model, computed_by, [d[:3] for d in header.inputs], header.outputs]))
    view, offset = record_body(record)
    for tensor in tensor_views(header.inputs, view, offset, external or ()):
        digest.update(tensor)
    return digest.digest()


def cached_response(frames: list) -> CachedResponse | None:
    """A copy of one RESPONSE record (and its external frames), kept after the frames are gone;
    None when the record is not a RESPONSE (nothing to cache)."""
    header, view, offset = read_record(frames[0])
    if not isinstance(header, Response):
        return None
    if header.trace is not None:   # the first asker's trace is not a later one's
        header = msgspec.structs.replace(header, trace=None)
    inline = bytes(view[offset:])
    external = tuple(bytes(f.buffer if hasattr(f, "buffer") else f) for f in frames[1:])
    return CachedResponse(header, inline, external, len(inline) + sum(len(e) for e in external) + 256)


class ResponseCache:
    """The entries, and Triton's summary of the cache's use (``nv_cache_*`` without a model label)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()
        self.hits = self.misses = self.evictions = 0
        self.lookup_ns = self.insertion_ns = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> CachedResponse | None:
        started = time.perf_counter_ns()
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        self.lookup_ns += time.perf_counter_ns() - started
        return entry

    def insert(self, key: bytes, entry: CachedResponse) -> None:
        if entry.size > self.capacity_bytes or key in self._entries:
            return
        started = time.perf_counter_ns()
        while self.used_bytes + entry.size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.size
            self.evictions += 1
        self._entries[key] = entry
        self.used_bytes += entry.size
        self.insertion_ns += time.perf_counter_ns() - started
