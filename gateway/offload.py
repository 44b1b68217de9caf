"""Work too long for the gateway's event loop, done on the gateway's own threads.

The event loop serves every client and keeps the broker link alive: a loop held for
seconds misses its heartbeats, and the broker lets the gateway go with everything it has
in flight. zlib releases the GIL while it works; decoding a large request of typed values
(JSON numbers, protobuf's typed contents) does not, but on a thread it runs in the
interpreter's switch intervals (its long numpy steps cut in chunks), and the loop goes on
between them. Each kind of work has its own two threads, so that two clients' large
requests being read do not hold up everybody's compression.
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

T = TypeVar("T")


class Threads:
    """Two threads for one kind of work, started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None

    def run(self, work: Callable[..., T], *args) -> asyncio.Future[T]:
        """``work(*args)`` on one of the threads; its result comes to the event loop."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"tritium-{self.name}")
        return asyncio.get_running_loop().run_in_executor(self._pool, work, *args)


zlib_threads = Threads("zlib")
decode_threads = Threads("decode")
