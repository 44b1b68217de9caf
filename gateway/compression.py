"""Response compression as Triton chooses it from ``Accept-Encoding``.

Triton reads the header its own way, and clients see the result, so it is followed
exactly: entries split at ',', leading spaces skipped, a weight only as ``;q=<number>``
(an entry it cannot read is skipped), names compared case-sensitively, and the first of
the highest weights wins, ``identity`` included. Only successful inference responses
are compressed.
"""

from __future__ import annotations

import asyncio
import functools
import re
import zlib
from collections.abc import Callable

from tritium.gateway.offload import zlib_threads

_WEIGHT = re.compile(rb"\s*[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE)
_CHOICES = (b"identity", b"deflate", b"gzip")

# A body this large or larger is compressed or inflated on a thread, zlib releasing the GIL
# while it works: gzip takes about 28 ms a megabyte on a 2-core machine, and the event loop
# serves every other client and the broker's heartbeats meanwhile. Below it, handing the work
# over costs more than doing it.
OFF_LOOP_BYTES = 128 * 1024
# zlib's window bits for each encoding, in HTTP's Content-Encoding as in gRPC's grpc-encoding
WBITS = {b"deflate": zlib.MAX_WBITS, b"gzip": 16 + zlib.MAX_WBITS}


@functools.lru_cache(maxsize=64)
def response_encoding(accept_encoding: bytes) -> bytes | None:
    """``gzip``, ``deflate``, or None for identity."""
    chosen, best = b"identity", 0.0
    for entry in accept_encoding.split(b","):
        name, has_weight, weight_text = entry.lstrip(b" ").partition(b";q=")
        weight = 1.0
        if has_weight:
            number = _WEIGHT.match(weight_text)
            if number is None:
                continue
            weight = float(number.group().strip())
        if name in _CHOICES and weight > best:
            chosen, best = name, weight
    return None if chosen == b"identity" else chosen


def compress(body: bytes, encoding: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=WBITS[encoding])
    return compressor.compress(body) + compressor.flush()


def compress_then(body: bytes, encoding: bytes, deliver: Callable[[bytes], None],
                  fail: Callable[[Exception], None]) -> None:
    """``deliver`` the compressed body: at once for a small one, from a thread for a large one."""
    if len(body) < OFF_LOOP_BYTES:
        deliver(compress(body, encoding))
        return

    def compressed(done: asyncio.Future[bytes]) -> None:
        try:
            packed = done.result()
        except Exception as exc:
            fail(exc)
            return
        deliver(packed)

    zlib_threads.run(compress, body, encoding).add_done_callback(compressed)
