"""uvicorn's httptools protocol, with the writes of one event-loop turn sent together.

uvicorn writes a response's status line and headers, then its body, as two separate
``transport.write`` calls: two system calls and two TCP segments per response, which
on a small inference response costs more than the rest of the gateway's work. The
transport below holds a write back until the next one, and sends both together; a
write that no other follows is sent at the end of the event loop's turn. Nothing else
about uvicorn changes (bench/http_servers.py measures the difference).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if self._pending:  # the head waiting for its body: send both now
            self._pending.append(data)
            self._flush()
            return
        self._pending.append(data)
        self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
