"""Which peers the broker still hears from. A pure unit: times are passed in.

Any message counts as a sign of life; peers send a HEARTBEAT when they have nothing
else to say. A peer silent for ``MISSED_HEARTBEATS`` intervals is reported once by
``silent`` and forgotten, so the broker can drop it and answer what it held.
"""

from __future__ import annotations

from tritium.protocol import MISSED_HEARTBEATS


class PeerLiveness:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.limit_s = interval_s * MISSED_HEARTBEATS
        self._last_heard: dict[bytes, float] = {}

    def heard(self, peer: bytes, now: float) -> None:
        self._last_heard[peer] = now

    def forget(self, peer: bytes) -> None:
        self._last_heard.pop(peer, None)

    def silent(self, now: float) -> list[bytes]:
        """Peers not heard from for too long; each is reported once."""
        gone = [peer for peer, last in self._last_heard.items() if now - last > self.limit_s]
        for peer in gone:
            del self._last_heard[peer]
        return gone
