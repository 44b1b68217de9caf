"""Decoupled models' open streams: batches done executing whose requests are still sending
responses (0..N per request); forwards each response, and closes a request on its final one.
A model that is not decoupled ends a batch this way when it answers a request through its
response sender after its execute returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tritium.errors import ErrorCode
from tritium.broker.registry import Batch, ModelVersion, Registry, first_response
from tritium.protocol import Response, ResponsePart, read_record

log = logging.getLogger(__name__)


class OpenStreams:
    def __init__(self, registry: Registry, reply: Callable[[bool, list], None], clock: Callable[[], int]) -> None:
        self.registry = registry
        self._reply = reply
        self._clock = clock
        self.batches: dict[int, Batch] = {}   # by batch number: done executing, not done answering

    def response_part(self, iid: bytes, part: ResponsePart, frames: list) -> bool:
        """Forward one response of a decoupled model; a final one closes its request. Whether it
        was its request's first response."""
        instance = self.registry.instances.get(iid)
        number, index = part.batch, part.index
        batch = (instance.inflight.get(number) if instance else None) or self.batches.get(number)
        if batch is None or not 0 <= index < len(batch.requests):
            log.warning("response for unknown request %s/%s from instance %r dropped", number, index, iid)
            return False
        request = batch.requests[index]
        first = index not in batch.answered
        batch.answered.add(index)
        response, _, _ = read_record(frames[0])
        if not isinstance(response, Response):
            log.warning("a %s record instead of a RESPONSE for request %s/%s from instance %r dropped",
                        response.kind.name, number, index, iid)
            return False
        first_response(batch.version, request, self._clock())
        ordering = batch.version.ordering   # set only for models that are not decoupled (their one answer,
        # sent after execute returned: workers/executor.py _answered_later)
        if ordering is None or response.final is False:
            self._reply(request.from_backend, [request.client, *frames])
        else:
            for from_backend, ready in ordering.release(request.order, (request.from_backend,
                                                                         [request.client, *frames])):
                self._reply(from_backend, ready)
        if response.final is not False:
            batch.finished.add(index)
            error = response.error
            outcome = (request, error is None, self._clock(),
                       request.cancelled and error is not None and error.code is ErrorCode.CANCELLED)
            if instance is not None and number in instance.inflight:   # still executing: no timings yet
                batch.hold_outcome(*outcome)
            else:
                batch.record_outcome(*outcome)
            if number in self.batches and len(batch.finished) == len(batch.requests):
                del self.batches[number]
        return first

    def executed(self, batch: Batch, counted: bool = True) -> None:
        """The instance is done executing a decoupled batch; its requests may still be answering.
        ``counted``: false for an execute that raised (Triton counts no execution for it).

        The broker counts final responses itself rather than trusting the BATCH_DONE's
        ``open`` list: a response sent from a model's own thread can leave after it.
        """
        if counted:
            batch.version.stats.record_execution(batch.batch_size, batch.timings)
        if len(batch.finished) < len(batch.requests):
            self.batches[batch.number] = batch

    def of_version(self, version: ModelVersion) -> bool:
        """Whether a decoupled request of ``version`` is still sending responses."""
        return any(batch.version is version for batch in self.batches.values())
