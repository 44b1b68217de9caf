"""Response compression as Triton chooses it from ``Accept-Encoding``.

Triton reads the header its own way, and clients see the result, so it is followed
exactly: entries split at ',', leading spaces skipped, a weight only as ``;q=<number>``
(an entry it cannot read is skipped), names compared case-sensitively, and the first of
the highest weights wins, ``identity`` included. Only successful inference responses
are compressed.
"""

from __future__ import annotations

import functools
import re
import zlib

_WEIGHT = re.compile(rb"\s*[+-]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE)
_CHOICES = (b"identity", b"deflate", b"gzip")
_WBITS = {b"deflate": zlib.MAX_WBITS, b"gzip": 16 + zlib.MAX_WBITS}


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
    compressor = zlib.compressobj(wbits=_WBITS[encoding])
    return compressor.compress(body) + compressor.flush()
