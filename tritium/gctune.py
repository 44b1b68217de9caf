"""Memory settings for the long-running processes on the request path: the garbage collector
and the C heap.

Requests allocate many short-lived objects that reference counting frees at once; the
cyclic collector, left at its defaults, still walks the young generation every 700
allocations (4% of an instance's time under load, measured with py-spy). Objects
that exist once startup is done are frozen out of collection, and young collections
are made rarer.

A large tensor (an image's 600 KB) is a buffer of its own in every process it crosses: the
gateway's request body, the frames each process reads it into. glibc maps a buffer above
its threshold afresh and unmaps it when freed, so each request's buffers were page-faulted
in page by page (measured: 60 faults per request in the gateway, the largest share of its
CPU; +44% throughput on such a model once buffers are reused). Large buffers come from the
heap instead, and freed heap memory is kept for the next request rather than given back.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold: buffers up to 32 MiB come from the heap.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Freed heap memory a process keeps for reuse: a few batches of large tensors.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
# Set by a user who tunes glibc's allocator themselves: their settings stand.
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def tune_for_serving() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    reuse_large_buffers()


def reuse_large_buffers() -> bool:
    """Whether glibc now serves large buffers from a heap it keeps (not where another C
    library is used, or where the user set glibc's allocator options)."""
    if any(name in os.environ for name in _USER_SETTINGS) or "malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # no mallopt (macOS): that allocator decides
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not done:
        log.debug("the C library did not take the heap settings")
    return done
