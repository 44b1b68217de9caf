"""The open connections of one front end (HTTP or gRPC), and the drain that waits for them."""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class _Closable(Protocol):
    def close(self) -> None: ...


Conn = TypeVar("Conn", bound=_Closable)


class OpenConnections(Generic[Conn]):
    """Every open connection; once ``draining``, ``drained`` is set when the last one goes."""

    def __init__(self) -> None:
        self.open: set[Conn] = set()
        self.draining = False
        self.drained = asyncio.Event()

    def opened(self, connection: Conn) -> None:
        self.open.add(connection)

    def lost(self, connection: Conn) -> None:
        self.open.discard(connection)
        if self.draining and not self.open:
            self.drained.set()

    async def close_when_drained(self, grace_s: float, protocol: str) -> None:
        """Wait up to ``grace_s`` for the connections to finish, then close those still open."""
        if self.open:
            try:
                await asyncio.wait_for(self.drained.wait(), grace_s)
            except asyncio.TimeoutError:
                log.warning("%d %s connection(s) still busy after %.0f s; closing them",
                            len(self.open), protocol, grace_s)
        for connection in list(self.open):
            connection.close()
