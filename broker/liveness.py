"""Which peers the broker still hears from. A pure unit: times are passed in.

Any message counts as a sign of life; peers send a HEARTBEAT when they have nothing
else to say. A peer silent for ``MISSED_HEARTBEATS`` intervals is reported once by
``silent`` and forgotten, so the broker can drop it and answer what it held.
"""

from __future__ import annotations

from tritium.protocol import MISSED_HEARTBEATS


class PeerLiveness:
    def __init__(self, interval_s: float) -> None:
        self.limit_s = interval_s * MISSED_HEARTBEATS
        self._last_heard: dict[bytes, float] = {}
        self._limits: dict[bytes, float] = {}   # peers that beat slower than the broker

    def heard(self, peer: bytes, now: float) -> None:
        self._last_heard[peer] = now

    def beats_every(self, peer: bytes, interval_s: float) -> None:
        """A peer's own heartbeat interval: it is given as long as its interval says, if longer."""
        if interval_s * MISSED_HEARTBEATS > self.limit_s:
            self._limits[peer] = interval_s * MISSED_HEARTBEATS

    def limit_for(self, peer: bytes) -> float:
        return self._limits.get(peer, self.limit_s)

    def forget(self, peer: bytes) -> None:
        self._last_heard.pop(peer, None)
        self._limits.pop(peer, None)

    def excuse(self, stall_s: float, now: float) -> None:
        """The broker itself did not run for ``stall_s`` (``own_stall``): that much of every
        peer's silence was its own."""
        if not stall_s:
            return
        for peer, last in self._last_heard.items():
            self._last_heard[peer] = min(now, last + stall_s)

    def silent(self, now: float) -> list[bytes]:
        """Peers not heard from for too long; each is reported once."""
        limits = self._limits
        gone = [peer for peer, last in self._last_heard.items()
                if now - last > (limits[peer] if peer in limits else self.limit_s)]
        for peer in gone:
            del self._last_heard[peer]
        return gone
