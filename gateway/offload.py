"""Work too long for the gateway's event loop, done on the gateway's own threads.

The event loop serves every client and keeps the broker link alive: a loop held for
seconds misses its heartbeats, and the broker lets the gateway go with everything it has
in flight. zlib releases the GIL while it works; decoding a large request of typed values
(JSON numbers, protobuf's typed contents) does not, but on a thread it runs in the
interpreter's switch intervals, and the loop goes on between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

# A request whose typed values take this many bytes or more is decoded on a thread: a megabyte
# of JSON numbers or of protobuf's typed contents takes the loop 10-60 ms, a request the
# size of the message limits seconds. Below it, handing the work over costs more than doing it.
DECODE_OFF_LOOP_BYTES = 1 << 20

_threads: ThreadPoolExecutor | None = None
T = TypeVar("T")


def in_thread(work: Callable[..., T], *args) -> asyncio.Future[T]:
    """``work(*args)`` on one of the gateway's threads (created on first use)."""
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tritium-offload")
    return asyncio.get_running_loop().run_in_executor(_threads, work, *args)
