"""Garbage-collector settings for the long-running processes on the request path.

Requests allocate many short-lived objects that reference counting frees at once; the
cyclic collector, left at its defaults, still walks the young generation every 700
allocations (4% of an instance's time under load, measured with py-spy). Objects
that exist once startup is done are frozen out of collection, and young collections
are made rarer.
"""

from __future__ import annotations

import gc


def tune_for_serving() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
