"""A scripted broker for in-process tests of the parts that talk to one.

The test binds a ROUTER socket where the broker would be and plays the broker by hand:
it reads what the part under test sends (HELLO, heartbeats, PLACED, INFER, ...) and
answers, delays, drops or restarts as the scenario says, speaking the real wire
protocol: it sends the protocol's message types and keeps what it reads as the decoded
header dicts, the wire as peers see it. Nothing of the data path is mocked.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from tritium.gateway.broker_link import BrokerLink
from tritium.protocol import Heartbeat, Kind, Message, Models, decode
from tritium.zmqio import recv_parts, send_parts


@dataclass(frozen=True)
class Received:
    """One record a peer sent: who, its header, the record's bytes, when it arrived, its external
    frames, and which message carried it (the broker's count of messages read, from 1)."""

    peer: bytes
    header: dict
    record: bytes
    at: float
    external: tuple[bytes, ...] = ()
    message: int = 0

    @property
    def kind(self) -> Kind:
        return Kind(self.header["k"])


@dataclass
class _Beating:
    record: bytes      # the HEARTBEAT to send
    every_s: float
    next_at: float = 0.0


class ScriptedBroker:
    """A ROUTER bound at ``address``; ``pump`` reads, ``send`` answers one peer."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.received: list[Received] = []
        self.messages = 0   # messages read
        self._beating: dict[bytes, _Beating] = {}

    def keep_beating(self, peer: bytes, boot: int, hb: float, every: float | None = None,
                     since: int | None = None) -> None:
        """Heartbeat to ``peer`` now and then every ``every`` seconds (``hb``, what the beats
        announce, by default), from ``pump``: a broker that is alive, as ``boot`` (which heard
        first the gateway's request ``since``)."""
        self._beating[peer] = _Beating(Heartbeat(boot, hb, since=since).encode(), every or hb)

    def stop_beating(self) -> None:
        """Fall silent (what a hung or unreachable broker looks like)."""
        self._beating.clear()

    def pump(self) -> list[Received]:
        """Send the heartbeats due; read every message that arrived; the records, also kept
        in ``received``."""
        now = time.monotonic()
        for peer, beating in self._beating.items():
            if now >= beating.next_at:
                beating.next_at = now + beating.every_s
                self.send(peer, beating.record)
        records = []
        while True:
            try:
                parts = recv_parts(self.sock)
            except zmq.Again:
                break
            peer, now = parts[0].bytes, time.monotonic()
            self.messages += 1
            position = 1
            while position < len(parts):   # a record, then its external frames
                header = decode(parts[position])[0]
                external = tuple(part.bytes for part in parts[position + 1:position + 1 + header.get("x", 0)])
                records.append(Received(peer, header, parts[position].bytes, now, external, self.messages))
                position += 1 + header.get("x", 0)
        self.received.extend(records)
        return records

    def of(self, kind: Kind, peer: bytes | None = None) -> list[dict]:
        """The headers of every ``kind`` record received (from ``peer``), in order."""
        return [r.header for r in self.received if r.header["k"] == kind and peer in (None, r.peer)]

    def send(self, peer: bytes, *records: bytes) -> None:
        send_parts(self.sock, [peer, *records])

    def tell(self, peer: bytes, message: Message) -> None:
        """Send one record made of ``message`` alone."""
        self.send(peer, message.encode())

    def close(self) -> None:
        self.sock.close(0)


async def attached_gateway_link(broker: ScriptedBroker, table: Models, heartbeat_s: float) -> BrokerLink:
    """A gateway's BrokerLink on the running loop, connected to ``broker``, which beats to it
    and has told it ``table``: what a gateway holds once its broker has taken it in."""
    link = BrokerLink(broker.address, asyncio.get_running_loop(), heartbeat_interval_s=heartbeat_s)
    starting = asyncio.ensure_future(link.start(5))
    while not broker.pump():
        await asyncio.sleep(0.002)
    peer = link.identity.encode()
    broker.keep_beating(peer, 1, heartbeat_s)
    broker.tell(peer, table)
    while not starting.done():
        broker.pump()
        await asyncio.sleep(0.002)
    await starting
    return link


def eventually(condition: Callable[[], object], step: Callable[[], None], timeout_s: float = 5.0,
               what: str = "the condition") -> object:
    """Run ``step`` until ``condition()`` is truthy; its value. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        step()
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"


def at_least(count: int, items: list) -> list:
    """``items`` once there are ``count`` of them, else nothing (a condition for ``eventually``)."""
    return items if len(items) >= count else []


def ipc_address(name: str) -> tuple[str, Path]:
    """An ``ipc://`` address other processes can reach, and the folder to remove afterwards
    (short, under /tmp: a socket path may not exceed ~100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="tritium-t-", dir="/tmp"))
    return f"ipc://{folder / name}", folder
