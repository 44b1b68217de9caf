"""``preserve_ordering``: a model's responses leave in the order its requests arrived.

With several instances, a later batch can finish first; its responses wait here until
every earlier request has been answered (with a result or an error). A pure unit.
"""

from __future__ import annotations


class ResponseOrder:
    def __init__(self) -> None:
        self._issued = 0
        self._next = 0
        self._held: dict[int, object] = {}

    def number(self) -> int:
        """The place of a request that has just been queued."""
        self._issued += 1
        return self._issued - 1

    def release(self, number: int, answer) -> list:
        """Hold ``answer`` to request ``number``; return every answer now free to leave, in order."""
        self._held[number] = answer
        ready = []
        while self._next in self._held:
            ready.append(self._held.pop(self._next))
            self._next += 1
        return ready
