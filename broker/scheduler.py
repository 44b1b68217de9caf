"""The broker's hot path: queue requests, form batches, dispatch on credit, route results.

Instances grant credit (how many batches they accept at once); a batch is sent only to
an instance with credit, so a slow instance is never buried and a fast one never
idles. Tensor frames pass through as the ZeroMQ frames they arrived in: the broker
decodes headers only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker.registry import Batch, InstanceRecord, ModelVersion, PendingRequest, Registry, VersionState
from tritium.errors import NotFound, TritiumError, Unavailable
from tritium.protocol import Kind, encode, error_record

log = logging.getLogger(__name__)

Send = Callable[[list], None]

# An instance's second credit (a batch queued behind the one it runs) hides the round
# trip between broker and instance, worth it for short batches. When batches take
# longer than this, requests wait in the broker instead, where they can still join a
# larger batch: on a compute-bound model that is what batching is for.
PIPELINE_LIMIT_NS = 2_000_000
_AVERAGE_WEIGHT = 0.2


class Scheduler:
    def __init__(self, registry: Registry, send_to_instance: Send, send_to_gateway: Send,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.registry = registry
        self._send_to_instance = send_to_instance
        self._send_to_gateway = send_to_gateway
        self._clock = clock
        self._batch_numbers = 0
        self._waiting: set[ModelVersion] = set()  # versions holding requests back for a delay

    # -- requests in --------------------------------------------------------------------

    def submit(self, gateway: bytes, record, header: dict, external: list) -> None:
        """Queue one INFER; an unknown or unready model is answered at once."""
        rid = header["rid"]
        version = self.registry.versions.get((header["m"], header["v"]))
        if version is None or version.state != VersionState.READY:
            self.reply_error(gateway, rid, self._not_ready_error(header["m"], header["v"], version))
            return
        now = self._clock()
        shape_key = None
        if version.variable_shapes:
            batching = version.definition.config.max_batch_size > 0
            shape_key = tuple((d[0], tuple(d[2][1:] if batching else d[2])) for d in header["inputs"])
        version.batcher.enqueue(PendingRequest(
            gateway, rid, record, external, header.get("bs", 1), shape_key, now))
        self.dispatch(version, now)

    def reply_error(self, gateway: bytes, rid: int, error: TritiumError) -> None:
        self._send_to_gateway([gateway, error_record(rid, error.to_wire())])

    @staticmethod
    def _not_ready_error(model: str, number: int, version: ModelVersion | None) -> TritiumError:
        if version is None:
            return NotFound(f"Request for unknown model: '{model}' version {number} is not found")
        return Unavailable(f"model '{model}' version {number} is not ready "
                           f"({version.state.value.lower()}{': ' + version.reason if version.reason else ''})")

    # -- batches out --------------------------------------------------------------------

    def dispatch(self, version: ModelVersion, now: int | None = None) -> None:
        """Send batches while the model has queued requests and an instance has credit."""
        batcher = version.batcher
        if now is None:
            now = self._clock()
        while len(batcher):
            instance = self._pick_instance(version)
            if instance is None:
                return
            requests = batcher.next_batch(now)
            if requests is None:
                self._waiting.add(version)
                return
            self._send_batch(version, instance, requests, now)
        self._waiting.discard(version)

    @staticmethod
    def _pick_instance(version: ModelVersion) -> InstanceRecord | None:
        best = None
        for instance in version.instances:
            if instance.credit <= 0 or (instance.inflight and instance.execution_ns > PIPELINE_LIMIT_NS):
                continue
            if best is None or instance.credit > best.credit:
                best = instance
        return best

    def _send_batch(self, version: ModelVersion, instance: InstanceRecord,
                    requests: list[PendingRequest], now: int) -> None:
        self._batch_numbers += 1
        number = self._batch_numbers
        instance.credit -= 1
        batch_size = 0
        parts = [instance.iid, encode({"k": Kind.BATCH, "b": number, "n": len(requests)})]
        for request in requests:
            request.dispatch_ns = now
            batch_size += request.batch_size
            parts.append(request.record)
            if request.external:
                parts.extend(request.external)
        instance.inflight[number] = Batch(number, version, instance, requests, batch_size)
        self._send_to_instance(parts)

    def next_deadline_ns(self) -> int | None:
        deadlines = [d for v in self._waiting if (d := v.batcher.deadline_ns()) is not None]
        return min(deadlines) if deadlines else None

    def run_due(self) -> None:
        """Dispatch the versions whose queue delay has run out."""
        if not self._waiting:
            return
        now = self._clock()
        for version in list(self._waiting):
            deadline = version.batcher.deadline_ns()
            if deadline is None or deadline <= now:
                self._waiting.discard(version)
                self.dispatch(version, now)

    # -- results in ---------------------------------------------------------------------

    def batch_done(self, iid: bytes, header: dict, frames: list) -> None:
        """Route a batch's RESPONSE records (``frames``), one message per gateway."""
        instance = self.registry.instances.get(iid)
        batch = instance.inflight.pop(header["b"], None) if instance else None
        if batch is None:
            log.warning("result for unknown batch %s from instance %r dropped", header.get("b"), iid)
            return
        instance.credit += 1
        now = self._clock()
        version = batch.version
        stats = version.stats
        timings = tuple(header.get("t") or (0, 0, 0))
        took = sum(timings)
        instance.execution_ns += _AVERAGE_WEIGHT * (took - instance.execution_ns) if instance.execution_ns else took
        oks = header["ok"]
        if any(oks):
            stats.record_execution(batch.batch_size, timings)
        offset = 0
        outgoing: dict[bytes, list] = {}
        for request, external_count, ok in zip(batch.requests, header["x"], oks):
            end = offset + 1 + external_count
            parts = outgoing.get(request.gateway)
            if parts is None:
                parts = outgoing[request.gateway] = [request.gateway]
            parts.extend(frames[offset:end])
            offset = end
            if ok:
                stats.record_success(now - request.arrival_ns, request.dispatch_ns - request.arrival_ns,
                                     request.batch_size, timings)
            else:
                stats.record_failure(now - request.arrival_ns)
        for parts in outgoing.values():
            self._send_to_gateway(parts)
        if version.state == VersionState.READY:
            self.dispatch(version, now)

    # -- instances come and go -----------------------------------------------------------

    def instance_ready(self, instance: InstanceRecord) -> None:
        version = self.registry.versions.get((instance.model, instance.version))
        if version is not None and version.state == VersionState.READY:
            self.dispatch(version)

    def instance_lost(self, iid: bytes, why: str) -> None:
        """Answer every request the instance held with an error; nothing is left silent."""
        instance = self.registry.instances.pop(iid, None)
        if instance is None:
            return
        version = self.registry.versions.get((instance.model, instance.version))
        if version is not None and instance in version.instances:
            version.instances.remove(instance)
        now = self._clock()
        for batch in instance.inflight.values():
            self._fail_batch(batch, why, now)
        instance.inflight.clear()

    def _fail_batch(self, batch: Batch, why: str, now: int) -> None:
        error = Unavailable(
            f"instance '{batch.instance.name}' of model '{batch.version.name}' version "
            f"{batch.version.version} {why} while running this request")
        for request in batch.requests:
            self.reply_error(request.gateway, request.rid, error)
            batch.version.stats.record_failure(now - request.arrival_ns)

    def fail_queued(self, version: ModelVersion, error: TritiumError) -> None:
        """Answer every queued request of a version that cannot serve them any more."""
        now = self._clock()
        for request in version.batcher.drain():
            self.reply_error(request.gateway, request.rid, error)
            version.stats.record_failure(now - request.arrival_ns)
        self._waiting.discard(version)

