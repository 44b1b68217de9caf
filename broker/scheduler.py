"""The broker's hot path: queue requests, form batches, dispatch on credit, route results.

Instances grant credit (how many batches they accept at once); a batch is sent only to
an instance with credit, so a slow instance is never buried and a fast one never
idles. Tensor frames pass through as the ZeroMQ frames they arrived in: the broker
decodes headers only.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from tritium.broker.batcher import DynamicBatcher
from tritium.broker.ensemble import NO_TIMINGS, STEP_CLIENT, EnsembleRunner
from tritium.broker.idle_instances import IdleInstances
from tritium.broker.queue_policy import request_timeout_us
from tritium.broker.rate_limiter import RateLimiter
from tritium.broker.registry import (
    Batch,
    InstanceRecord,
    ModelVersion,
    PendingRequest,
    Registry,
    VersionState,
)
from tritium.input_checks import check_inputs, unexpected_output
from tritium.errors import Cancelled, ErrorCode, InternalError, InvalidArgument, NotFound, TritiumError, Unavailable
from tritium.broker.response_cache import ResponseCache, cached_response, request_key
from tritium.broker.sequences import END as SEQUENCE_END, START as SEQUENCE_START, SequenceBatcher
from tritium.broker.streams import OpenStreams
from tritium.protocol import Batch as BatchHeader
from tritium.protocol import HEARTBEAT_SUFFIX, BatchDone, Cancel, CancelRunning, Infer, Response, error_record, read_record
from tritium.tracing.stamps import batch_stamps
from tritium.zmqio import LONE_ANSWERS_BEFORE_POLLING

if TYPE_CHECKING:
    from tritium.broker.autoscale import Autoscaler
    from tritium.broker.startup_hold import StartupHold

log = logging.getLogger(__name__)

Send = Callable[[list], None]

# An instance's second credit (a batch queued behind the one it runs) hides the round
# trip between broker and instance; it is used only for models that do not batch. A
# batching model's requests wait in the broker while its instances are busy, where they
# can still join a larger batch: fewer, larger batches cost fewer messages and wake-ups
# per request in every process, which on a light model is most of the cost (measured:
# +12% throughput at concurrency 16), and on a compute-bound model is what batching is for.
_AVERAGE_WEIGHT = 0.2
# A batch's own cost (its messages and wake-ups through the broker and an instance) is about
# 100-250 us on a small virtual machine: a request that runs longer than that, and no faster in a
# batch, is better started at once on an idle instance than queued behind another.
SHARE_FROM_NS = 250_000
# A share of a request's time alone. Not less: a model that cannot batch still runs a large batch
# a third faster per request when its other instances sit idle (less contention for the CPUs).
SHARE_WHEN_BATCHED_SAVES_UNDER = 0.5
# How long requests wait for a lost instance that its agent restarts (the agent's backoff
# tops out at 32 s); after that, or when nothing is coming back, they get a 503.
RESTART_WAIT_NS = 40_000_000_000
_DISPATCHING = (VersionState.READY, VersionState.UNLOADING)
# Triton's words for a request a model releases to run again when its model cannot (core's
# InferenceRequest); Triton logs them and leaves the request unanswered, tritium answers with them.
NOT_RESCHEDULABLE = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                     "configured to handle such a flag.")


class _UndecidedCall(NamedTuple):
    """A call for a model's latest version, waiting for a takeover to decide which that is."""

    client: bytes
    record: object
    header: Infer
    external: list | None
    from_backend: bool


class Scheduler:
    def __init__(self, registry: Registry, send_to_instance: Send, send_to_gateway: Send,
                 clock: Callable[[], int] = time.monotonic_ns, cache: ResponseCache | None = None,
                 rate_limiter: RateLimiter | None = None) -> None:
        self.registry = registry
        self.cache = cache   # None: no --cache-config, so no model caches
        self.rate_limiter = rate_limiter   # None: --rate-limit=off, instances run whenever they have credit
        self.autoscaler: Autoscaler | None = None   # set by the broker: told of requests to autoscaled models
        self.hold: StartupHold | None = None   # set by the broker: its first seconds, when loading versions queue
        self._send_to_instance = send_to_instance   # the backend socket
        self._send_to_gateway = send_to_gateway     # the frontend socket
        self._clock = clock
        self._batch_numbers = 0
        self.requests_running = 0   # in batches sent to instances and not done executing
        self.last_done_ns = 0   # when a batch was last done (monotonic ns)
        self._lone_in_a_row = 0   # batches done in a row, each the only request running or queued
        self._waiting: set[ModelVersion] = set()  # versions holding requests back for a delay
        self._turns_open = 0   # inside turn(): submitted requests wait for its end
        self._turn = _Turn(self)
        # versions given requests inside turn(), in the order they were given them (dispatched so)
        self._submitted: dict[ModelVersion, None] = {}
        # Calls for a model's latest version made while a newer version than its latest READY one
        # is taken over (broker/startup_hold.py): which version serves them is not known yet.
        self._latest_undecided: dict[str, list[_UndecidedCall]] = {}
        # Versions with queued requests that can time out, with their batcher (only a dynamic batcher has timeouts).
        self._timed: dict[ModelVersion, DynamicBatcher[PendingRequest]] = {}
        self.streams = OpenStreams(registry, self._reply, clock)   # decoupled requests still answering
        self._idle = IdleInstances(registry)
        self.ensembles = EnsembleRunner(registry, self.submit, self._reply, clock, self.remember)

    # -- requests in --------------------------------------------------------------------

    def submit(self, client: bytes, record: object, header: Infer, external: list | None,
               from_backend: bool = False) -> None:
        """Queue one INFER (``record``, whose header is ``header``); an unknown or unready model is answered at once.

        Batches go out at once, or inside ``turn`` at its end.
        """
        rid = header.rid
        number = -1 if header.version is None else header.version
        if number < 0:  # BLS asks for the latest version
            if self._latest_in_doubt(header.model):
                self._latest_undecided.setdefault(header.model, []).append(
                    _UndecidedCall(client, record, header, external, from_backend))
                return
            version = self.registry.latest_ready(header.model)
        else:
            version = self.registry.versions.get((header.model, number))
        if version is None or (version.state != VersionState.READY and not self._held(version)):
            self._refuse(client, header, _not_ready_error(header.model, number, version,
                                                             self.registry.knows(header.model)), from_backend)
            return
        if from_backend and (refused := _bls_call_refused(version, header)) is not None:
            self._refuse(client, header, refused, from_backend)
            return
        now = self._clock()
        cache_key = None
        # A hit needs no instance (nor step) at all. An ensemble's answer carries the request's
        # sequence parameters: one with a sequence id or flags is neither answered from the cache nor kept.
        if version.caches and self.cache is not None and not (
                version.ensemble and (header.sequence_id or header.sequence_flags)):
            cache_key = self._answer_from_cache(self.cache, version, client, rid, record, header, external,
                                                from_backend, now)
            if cache_key is None:
                return
        if version.ensemble:  # no queue of its own: its steps join their models' queues
            self.ensembles.submit(client, record, header, external, from_backend, version, cache_key)
            return
        if not version.serving and not self._instances_coming(version, now):
            self._refuse(client, header, _no_instance_error(version), from_backend)
            return
        if version.scale is not None and self.autoscaler is not None:
            if version.state is not VersionState.READY:   # held (see _held)
                self.autoscaler.request_held(version, now)
            elif (refused := self.autoscaler.request_arrived(version, now)) is not None:
                self._refuse(client, header, refused, from_backend)
                return
        batcher = version.batcher
        level = deadline = 0
        timed: DynamicBatcher[PendingRequest] | None = None   # its batcher, when the request can time out
        # A sequence batcher is always simple; the isinstance only tells the type checker so.
        if not batcher.simple and isinstance(batcher, DynamicBatcher):
            params = header.params
            try:
                level = batcher.queue_policy.level_of(params)
                deadline = batcher.queue_policy.deadline_ns(level, now, params)
                if deadline:
                    timed = batcher
            except TritiumError as exc:
                self._refuse(client, header, exc, from_backend)
                return
            if batcher.full(level):
                self._refuse(client, header, Unavailable(
                    f"[request id: {header.request_id or '<id_unknown>'}] Exceeds maximum queue size"), from_backend)
                return   # refused before it was queued: Triton's statistics do not count it
        elif header.params and isinstance(batcher, SequenceBatcher):   # a timeout bounds its wait for a slot
            try:
                timeout_us = request_timeout_us(header.params)
            except TritiumError as exc:
                self._refuse(client, header, exc, from_backend)
                return
            deadline = now + timeout_us * 1000 if timeout_us else 0
        batching = version.definition.config.max_batch_size > 0
        shape_key = None
        if version.variable_shapes:
            ragged = version.ragged_inputs
            shape_key = tuple((d[0], tuple(d[2][1:] if batching else d[2])) for d in header.inputs if d[0] not in ragged)
        batch_size = header.batch_size
        if batch_size is None:  # BLS requests do not say; the gateway always does
            batch_size = header.inputs[0][2][0] if batching and header.inputs else 1
        correlation_id, flags = header.sequence_id or 0, header.sequence_flags
        if not correlation_id and version.iterative:
            correlation_id, flags = batcher.assign(), SEQUENCE_START   # type: ignore[union-attr]  # as in Triton
            record = _with_sequence(record, correlation_id, flags)     # (its model sees them)
        request = PendingRequest(client, rid, record, external, batch_size, shape_key, now,
                                 from_backend=from_backend, level=level, deadline_ns=deadline,
                                 cache_key=cache_key, correlation_id=correlation_id,
                                 flags=flags, traced=header.trace is not None)
        try:
            batcher.enqueue(request)
        except TritiumError as exc:  # the sequence batcher refuses what Triton's refuses (not counted, as there)
            self._refuse(client, header, exc, from_backend)
            return
        if version.ordering is not None:
            request.order = version.ordering.number()
        if timed is not None:
            self._timed[version] = timed
        if self._turns_open:
            self._submitted[version] = None
        else:
            self.dispatch(version, now)

    def turn(self) -> _Turn:
        """Requests submitted inside (a turn's messages, and the ensemble steps they and the
        turn's answers start) are queued, and dispatched together at the end: a message of N
        requests for an idle instance makes one batch of N, as Triton's batcher finds its queue
        when it wakes, not a batch of the first request alone and the rest after it."""
        return self._turn

    def _dispatch_submitted(self) -> None:
        if self._latest_undecided:
            self._submit_latest_decided()
        if self._submitted:
            submitted, self._submitted = self._submitted, {}
            now = self._clock()
            for version in submitted:
                if version.state in _DISPATCHING:
                    self.dispatch(version, now)

    def _answer_from_cache(self, cache: ResponseCache, version: ModelVersion, client: bytes, rid: int,
                           record: object, header: Infer, external: list | None, from_backend: bool,
                           now: int) -> bytes | None:
        """Answer a request from the response cache; on a miss, the key its response goes under."""
        key = request_key(version.name, self._computed_by(version), header, record, external)
        entry = cache.lookup(key)
        took = self._clock() - now
        if entry is None:
            version.stats.record_cache_miss(took)
            return key
        parts = [client, *entry.parts_for(rid)]
        if version.ordering is None:
            self._reply(from_backend, parts)
        else:   # a hit still leaves after the requests that came before it
            for ready_backend, ready in version.ordering.release(version.ordering.number(), (from_backend, parts)):
                self._reply(ready_backend, ready)
        version.stats.record_cache_hit(took)
        if version.scale is not None:
            version.scale.last_request_ns = now   # traffic, even if no instance saw it
        return None

    def _computed_by(self, version: ModelVersion) -> int | list:
        """What an answer of ``version`` was computed by, in its cache key: the load of the version
        (a reload starts afresh), and for an ensemble also the loads its steps go to now (so that
        reloading one of its models starts the ensemble's answers afresh too)."""
        if not version.ensemble:
            return version.epoch
        computed: list = [version.epoch]
        for step in version.definition.config.ensemble_scheduling.step:
            member = self.registry.resolve_step(step.model_name, step.model_version)
            computed.append(0 if member is None else self._computed_by(member))
        return computed

    def remember(self, version: ModelVersion, key: bytes, frames: list) -> None:
        """Keep a response (its RESPONSE record and external frames) under the key its request missed."""
        assert self.cache is not None   # (a request gets a key only where there is a cache)
        started = self._clock()
        response = cached_response(frames)
        if response is not None:
            self.cache.insert(key, response)
        version.stats.cache_miss.ns += self._clock() - started

    def _held(self, version: ModelVersion) -> bool:
        """Whether a request for a version that is not ready queues for it: a gateway's or a BLS
        call's, for a version loading while a new broker process takes over (broker/startup_hold.py)."""
        return (version.state is VersionState.LOADING and not version.ensemble
                and self.hold is not None and self.hold.holds(self._clock()))

    def hold_ended(self) -> None:
        """The takeover is over: what still waits for a version that did not become ready is
        answered as it would have been on arrival."""
        for version in self.registry.versions.values():
            if version.state is VersionState.LOADING and len(version.batcher):
                self.fail_queued(version, _not_ready_error(version.name, version.version, version, True),
                                 refused=True)
        self._submit_latest_decided()

    def _latest_in_doubt(self, model: str) -> bool:
        """Whether ``model``'s latest version is still to be decided: while a new broker process
        takes over, a version numbered above its latest READY one is loading."""
        if self.hold is None or not self.hold.open or not self.hold.holds(self._clock()):
            return False
        record = self.registry.models.get(model)
        if record is None:
            return False
        ready = max((n for n, v in record.versions.items() if v.state is VersionState.READY), default=-1)
        return any(n > ready and v.state is VersionState.LOADING and not v.ensemble
                   for n, v in record.versions.items())

    def _submit_latest_decided(self) -> None:
        """The calls for a latest version now decided go to it (or are answered not ready)."""
        for model in [m for m in self._latest_undecided if not self._latest_in_doubt(m)]:
            # Queued as they arrive now (their queue time, and any timeout, counts from here): a
            # queue keeps its requests in order of arrival.
            for call in self._latest_undecided.pop(model):
                self.submit(*call)

    def _instances_coming(self, version: ModelVersion, now: int) -> bool:
        """Whether a version without instances can expect one: a restart, the autoscaler's, or
        its load (a held request's)."""
        if any(deadline > now for deadline in version.awaited.values()):
            return True
        if version.state is VersionState.LOADING:
            return self.hold is not None and self.hold.holds(now)
        return version.autoscale is not None and self.autoscaler is not None and self.autoscaler.coming(version)

    def fail_unserviceable(self) -> None:
        """Answer the queues of versions whose instances are gone and not coming back (in time)."""
        now = self._clock()
        for version in self.registry.versions.values():
            if len(version.batcher) and not version.serving and not self._instances_coming(version, now):
                self.fail_queued(version, _no_instance_error(version))

    def cancel(self, client: bytes, cancel: Cancel) -> None:
        """The client of request ``cancel.rid`` gave up on it. Still queued, it leaves its queue and
        is answered CANCELLED (Triton's dynamic batcher does so when it next forms a batch), with the
        rest of its sequence for a sequence batcher's; running, it runs to its end, its instance
        told; sent to its instance but waiting there behind another batch, the instance answers
        it CANCELLED without running it. An ensemble's request is answered at once, and its
        steps still out cancelled."""
        if cancel.version < 0:   # a model's BLS request for the latest version
            if self._cancel_undecided(client, cancel):
                return
            version = self.registry.latest_ready(cancel.model)
        else:
            version = self.registry.versions.get((cancel.model, cancel.version))
        if version is None:
            return
        if version.ensemble:   # answered now; its steps still out are cancelled in turn
            for step_rid, model, number in self.ensembles.cancel(client, cancel.rid):
                self.cancel(STEP_CLIENT, Cancel(step_rid, model, number))
            return
        batcher = version.batcher
        if isinstance(batcher, DynamicBatcher):
            request = batcher.take(client, cancel.rid)
            cancelled = [request] if request is not None else []
        elif isinstance(batcher, SequenceBatcher):   # the rest of its sequence goes with it
            cancelled = batcher.cancel(client, cancel.rid)
        else:
            return
        if not cancelled:
            running, waiting = self._cancel_running(version, client, cancel.rid)
            if running is not None:   # answered CANCELLED by its instance, its failure counts as CANCELED
                running.cancelled = True
            if running is None or not waiting or not isinstance(batcher, SequenceBatcher) \
                    or running.flags & SEQUENCE_END:
                return   # (after its END, the correlation id may name a new sequence)
            # Sent on to its instance behind a batch still running there (a sequence's requests
            # follow each other): queued, for Triton. It runs, and its sequence ends with it.
            cancelled = batcher.end(running.correlation_id)
        now = self._clock()
        for request in cancelled:
            its_own = request.client == client and request.rid == cancel.rid
            self._answer_error(version, request, Cancelled.by_client() if its_own else Cancelled.with_its_sequence())
            version.stats.record_failure(now - request.arrival_ns, "CANCELED")
        if isinstance(batcher, SequenceBatcher):   # a freed slot may take a sequence of the backlog
            self.dispatch(version, now)

    def _cancel_undecided(self, client: bytes, cancel: Cancel) -> bool:
        """Answer CANCELLED a call still waiting for its model's latest version to be decided."""
        waiting = self._latest_undecided.get(cancel.model, [])
        for position, call in enumerate(waiting):
            if call.client == client and call.header.rid == cancel.rid:
                del waiting[position]
                self.reply_error(client, cancel.rid, Cancelled.by_client(), call.from_backend)
                return True
        return False

    def _cancel_running(self, version: ModelVersion, client: bytes, rid: int) -> tuple[PendingRequest | None, bool]:
        """Tell the instance running request ``rid`` that its client left: a Python model may see
        it (``is_cancelled()``) and stop. Returns the request (None when none runs) and whether
        its batch waits at the instance behind an earlier one (instances run theirs in order)."""
        running = [b for instance in version.instances for b in instance.inflight.values()]
        running += [b for b in self.streams.batches.values() if b.version is version]
        for batch in running:
            for index, request in enumerate(batch.requests):
                if request.rid == rid and request.client == client and index not in batch.finished:
                    # Its heartbeat socket's thread marks it at once, even inside a long execute;
                    # the data socket's copy arrives after the batch, however the two race.
                    cancel = CancelRunning(batch.number, index).encode()
                    self._send_to_instance([batch.instance.iid + HEARTBEAT_SUFFIX, cancel])
                    self._send_to_instance([batch.instance.iid, cancel])
                    # Waiting: still held by its instance behind an earlier batch (a decoupled
                    # batch that has executed and still answers has left ``inflight``).
                    inflight = batch.instance.inflight
                    return request, batch.number in inflight and next(iter(inflight)) != batch.number
        return None, False

    def _refuse(self, client: bytes, header: Infer, error: TritiumError, from_backend: bool) -> None:
        """Answer a request refused before it is queued. A model's BLS call gets the words Triton's
        Python backend gives a call its server refused to start (``Model M - Error when running
        inference: ...``); a gateway's request, the error as it is."""
        self.reply_error(client, header.rid, _as_bls_refusal(header.model, error) if from_backend else error,
                         from_backend)

    def reply_error(self, client: bytes, rid: int, error: TritiumError, from_backend: bool = False) -> None:
        self._reply(from_backend, [client, error_record(rid, error)])

    def _reply(self, from_backend: bool, parts: list, timings: tuple = NO_TIMINGS) -> None:
        if parts[0] is STEP_CLIENT:  # an ensemble step's answer goes back to its ensemble
            self.ensembles.answered(parts, timings)
        else:
            (self._send_to_instance if from_backend else self._send_to_gateway)(parts)

    # -- batches out --------------------------------------------------------------------

    def dispatch(self, version: ModelVersion, now: int | None = None) -> None:
        """Send batches while the model has queued requests and an instance has credit."""
        batcher = version.batcher
        if now is None:
            now = self._clock()
        if isinstance(batcher, SequenceBatcher):   # a stateful model's (see ModelVersion.__post_init__)
            self._dispatch_sequences(version, batcher, now)
            return
        if version in self._timed:
            # Timeouts apply when a batch forms, as Triton's batcher applies its queue policy on
            # waking: a timeout shorter than the way from arrival to dispatch (5 us) runs out
            # even for an idle instance. The clock is read afresh, not the turn's.
            self._expire_version(version, self._timed[version], self._clock())
        limiter = self.rate_limiter
        while len(batcher):
            instance = self._idle.pick(version) if limiter is None else self._pick_limited(version, limiter)
            if instance is None:
                return
            requests = batcher.next_batch(now, self._share(version, batcher) if limiter is None else 0)
            if requests is None:
                self._waiting.add(version)
                return
            self._send_batch(version, instance, requests)
        self._waiting.discard(version)
        if limiter is not None:
            limiter.blocked.pop(version, None)

    def _share(self, version: ModelVersion, batcher: DynamicBatcher) -> int:
        """How many of the queued requests the next batch takes when several instances are idle:
        an even share each (0: all that fit). Requests read in one turn would otherwise all go to
        one instance, which runs them in turn (a model that loops over its requests, one BLS call
        after another) while the others stay idle. Only for a model whose batches take what is
        queued anyway, and whose requests take as long in a batch as alone, each longer than a
        batch's own cost: a model that batches well runs a larger batch in about the time of a
        smaller one."""
        queued = len(batcher)
        if queued < 2 or not _batching_saves_little(version) or not batcher.spreads:
            return 0
        idle = self._idle.count(version, queued)
        return -(-queued // idle) if idle > 1 else 0

    def _pick_limited(self, version: ModelVersion, limiter: RateLimiter) -> InstanceRecord | None:
        """Under the rate limiter: the version's idle instance of best rank, when it may start a
        batch now; otherwise the version waits for resources (``limiter.blocked``). An instance
        runs one batch at a time then, as its resources are held per execution."""
        idle = [i for i in version.instances if not i.draining and not i.inflight and i.credit > 0]
        if not idle:
            return None
        instance = min(idle, key=limiter.rank)
        if limiter.may_start(instance, version):
            limiter.blocked.pop(version, None)
            return instance
        limiter.blocked[version] = limiter.rank(instance)
        return None

    def _wake_blocked(self, limiter: RateLimiter) -> None:
        """Resources were freed: versions waiting for them try again, best rank first, until one
        still waits for resources with nobody ahead of it (those after it wait behind it, so it is
        not starved). One that now waits with a worse rank than before (its best instance began
        draining, say) lets the loop go on to those now ahead of it."""
        tried: set[ModelVersion] = set()
        while waiting := [v for v in limiter.blocked if v not in tried]:
            version = min(waiting, key=limiter.blocked.__getitem__)
            tried.add(version)
            del limiter.blocked[version]
            if version.state in _DISPATCHING:
                self.dispatch(version)
            rank = limiter.blocked.get(version)
            if rank is not None and rank <= min(limiter.blocked.values()):
                return

    def _dispatch_sequences(self, version: ModelVersion, batcher: SequenceBatcher[InstanceRecord], now: int) -> None:
        """The sequence batcher picks the instance (the one holding each sequence) and the slots."""
        for request in batcher.expired_backlog(now):
            self._answer_error(version, request, Unavailable("timeout of the corresponding sequence has been expired"))
            version.stats.record_failure(now - request.arrival_ns, "REJECTED")
        accepting = [instance for instance in version.instances if not instance.draining]
        limiter = self.rate_limiter
        if limiter is None:
            while (batch := batcher.next_batch(now, accepting, _sequence_room)) is not None:
                self._send_batch(version, batch.instance, batch.requests, batch.slots, batch.size)
        else:
            self._dispatch_sequences_limited(version, batcher, accepting, limiter, now)
        if batcher.deadline_ns() is None:
            self._waiting.discard(version)
        else:
            self._waiting.add(version)

    def _dispatch_sequences_limited(self, version: ModelVersion, batcher: SequenceBatcher[InstanceRecord],
                                    accepting: list[InstanceRecord], limiter: RateLimiter, now: int) -> None:
        """Under the rate limiter an instance bound to sequences takes their next batch as any
        instance starts one: idle, its resources free, no version waiting with a better rank;
        when one of them must wait, the version waits with that instance's rank."""
        refused: list[InstanceRecord] = []

        def room(instance: InstanceRecord) -> bool:   # asked only of instances with requests queued
            if instance.credit <= 0 or instance.inflight:
                return False
            if limiter.may_start(instance, version):
                return True
            refused.append(instance)
            return False

        while (batch := batcher.next_batch(now, accepting, room)) is not None:
            self._send_batch(version, batch.instance, batch.requests, batch.slots, batch.size)
        if refused:
            limiter.blocked[version] = min(limiter.rank(instance) for instance in refused)
        else:
            limiter.blocked.pop(version, None)

    def _send_batch(self, version: ModelVersion, instance: InstanceRecord, requests: list[PendingRequest],
                    slots: list[int] | None = None, size: int | None = None) -> None:
        """``slots``: the sequence slot of each request (stateful models), told to the instance."""
        self._batch_numbers += 1
        number = self._batch_numbers
        instance.credit -= 1
        self._idle.busy(version, instance)   # until its batch is done
        if self.rate_limiter is not None:
            self.rate_limiter.acquire(instance)
        batch_size = 0
        header = BatchHeader(number, len(requests), slots, batch_stamps(requests), self.one_at_a_time)
        parts: list[object] = [instance.iid, header.encode()]
        # The clock read afresh: a caller's ``now`` may predate requests submitted since (an
        # ensemble's next step, submitted while the batch that answered its last one is handled).
        sent = self._clock()
        for request in requests:
            request.dispatch_ns = sent
            batch_size += request.batch_size
            parts.append(request.record)
            if request.external:
                parts.extend(request.external)
        instance.inflight[number] = Batch(number, version, instance, requests, size or batch_size)
        self.requests_running += len(requests)
        self._send_to_instance(parts)

    @property
    def one_at_a_time(self) -> bool:
        """Whether requests come one at a time: the last batches done each held the only request
        running or queued (the broker polls for messages then, Broker._spin_for_message)."""
        return self._lone_in_a_row >= LONE_ANSWERS_BEFORE_POLLING

    def next_deadline_ns(self) -> int | None:
        deadlines = [d for v in self._waiting if (d := v.batcher.deadline_ns()) is not None]
        deadlines += [d for b in self._timed.values() if (d := b.next_timeout_ns()) is not None]
        return min(deadlines) if deadlines else None

    def run_due(self) -> None:
        """Apply queue timeouts that ran out; dispatch the versions whose queue delay has run out."""
        if self._timed:
            self._expire_timeouts()
        if not self._waiting:
            return
        now = self._clock()
        for version in list(self._waiting):
            deadline = version.batcher.deadline_ns()
            if deadline is None or deadline <= now:
                self._waiting.discard(version)
                self.dispatch(version, now)

    def _expire_timeouts(self) -> None:
        """Enforced while requests wait, even behind a long execution, not only when dequeued."""
        now = self._clock()
        for version, batcher in list(self._timed.items()):
            self._expire_version(version, batcher, now)
            if version.state in _DISPATCHING:
                self.dispatch(version, now)   # a DELAY may have changed what leads the queue

    def _expire_version(self, version: ModelVersion, batcher: DynamicBatcher[PendingRequest], now: int) -> None:
        for request in batcher.expire(now):
            self._answer_error(version, request, Unavailable("Request timeout expired"))
            version.stats.record_failure(now - request.arrival_ns, "REJECTED")
        if batcher.next_timeout_ns() is None:
            self._timed.pop(version, None)   # a dispatch inside _expire_timeouts' loop may have removed it

    def _answer_error(self, version: ModelVersion, request: PendingRequest, error: TritiumError) -> None:
        """Answer a request that will not run, keeping its place when responses are ordered."""
        parts = [request.client, error_record(request.rid, error)]
        if version.ordering is None:
            self._reply(request.from_backend, parts)
            return
        for from_backend, ready in version.ordering.release(request.order, (request.from_backend, parts)):
            self._reply(from_backend, ready)

    # -- results in ---------------------------------------------------------------------

    def batch_done(self, iid: bytes, done: BatchDone, frames: list) -> None:
        """Route a batch's RESPONSE records (``frames``), one message per client."""
        batch = self._batch_ended(iid, done.number, done.timings, done.raised)
        if batch is None:
            return
        now = self.last_done_ns
        version, instance, timings = batch.version, batch.instance, done.timings
        took = sum(timings)
        instance.execution_ns = _moved(instance.execution_ns, took)
        _note_execution(version, took, len(batch.requests))
        oks = done.ok
        answered = batch.requests
        if done.rescheduled is not None:
            if not _rescheduled_in(done.rescheduled, len(answered)):
                self._fail_batch(batch, f"answered batch {done.number} of {len(answered)} request(s) with "
                                 f"requests to run again that it does not hold: {done.rescheduled}", now)
                self._end_iterations(version, answered)
                self._dispatch_after(version, now)
                return
            answered = self._run_again(batch, done.rescheduled, now)
        if done.still_open is not None:
            if done.ran:
                self.streams.executed(batch, counted=not done.raised)
            self._steps_executed(batch, timings)
        elif not _answers_every_request(done, len(answered), len(frames)):
            self._fail_batch(batch, f"answered batch {done.number} of {len(answered)} request(s) with "
                             f"{len(oks)} result(s) and {len(frames)} frame(s)", now)
        else:
            if done.ran and (any(oks) or done.rescheduled or version.counts_failed_executions):
                version.stats.record_execution(batch.batch_size, timings)
            self._route_responses(batch, answered, done.response_frames, oks, frames, now)
        self._end_iterations(version, answered)
        self._dispatch_after(version, now)

    def _end_iterations(self, version: ModelVersion, released: list[PendingRequest]) -> None:
        """Iterative sequences: requests released for good end their sequences, as Triton's
        iterative sequencer ends them (with an END of its own)."""
        if version.iterative:
            for request in released:
                version.batcher.finish(request.correlation_id)   # type: ignore[union-attr]

    def _run_again(self, batch: Batch, rescheduled: list[int], now: int) -> list[PendingRequest]:
        """The requests of ``batch`` its model released to run again (request rescheduling) queue
        in their sequences once more, without START or END, as in Triton's iterative sequences;
        those of a model that is not one, or whose sequence ended meanwhile (idle too long), are
        answered with the error. Each run counts as a successful inference in the statistics, as in
        Triton. Returns the batch's other requests."""
        version = batch.version
        for index in rescheduled:
            batch.finished.add(index)   # it leaves this batch either way
            request = batch.requests[index]
            arrived = request.arrival_ns
            try:
                if request.cancelled:   # its client left while it ran
                    raise Cancelled.by_client()
                if not version.iterative:
                    log.error("Failed to release request: %s", NOT_RESCHEDULABLE)
                    raise InternalError(NOT_RESCHEDULABLE)
                if request.flags:   # its model sees none on its later runs
                    request.flags, request.record = 0, _with_sequence(request.record, request.correlation_id, 0)
                request.received_ns = request.received_ns or arrived   # (its first response is timed from then)
                request.arrival_ns = now   # its queue time and its sequence's idle time count from here
                version.batcher.enqueue(request)
            except TritiumError as exc:
                request.arrival_ns = arrived
                self._answer_error(version, request, exc)
                batch.record_outcome(request, False, now, exc.code is ErrorCode.CANCELLED)
                self._end_iterations(version, [request])
                continue
            # Each run counts as a success, as in Triton's statistics.
            version.stats.record_success(now - arrived, request.dispatch_ns - arrived, request.batch_size,
                                         batch.timings)
        again = set(rescheduled)
        return [request for index, request in enumerate(batch.requests) if index not in again]

    def batch_unreadable(self, iid: bytes, number: int, why: str) -> None:
        """An instance's BATCH_DONE that does not decode: its batch's requests are answered with
        the error rather than left waiting, and the instance takes work again."""
        batch = self._batch_ended(iid, number)
        if batch is not None:
            self._fail_batch(batch, f"answered batch {number} with a malformed result: {why}", self.last_done_ns)
            self._end_iterations(batch.version, batch.requests)
            self._dispatch_after(batch.version, self.last_done_ns)

    def _batch_ended(self, iid: bytes, number: int, timings: tuple = NO_TIMINGS, raised: bool = False) -> Batch | None:
        """The instance is done with batch ``number``, which took ``timings``: it leaves the instance,
        which takes work again, and the answers it gave while it ran are counted."""
        instance = self.registry.instances.get(iid)
        batch = instance.inflight.pop(number, None) if instance is not None else None
        if instance is None or batch is None:
            log.warning("result for unknown batch %s from instance %r dropped", number, iid)
            return None
        batch.timings = timings
        batch.record_held_outcomes(raised)
        self.requests_running -= len(batch.requests)
        instance.credit += 1
        if self.rate_limiter is not None:
            self.rate_limiter.release(instance)
        self.last_done_ns = self._clock()
        version = batch.version
        alone = not self.requests_running and len(batch.requests) == 1 and not len(version.batcher)
        self._lone_in_a_row = self._lone_in_a_row + 1 if alone else 0
        self._idle.idle_again(version, instance)
        return batch

    def _dispatch_after(self, version: ModelVersion, now: int) -> None:
        if version.state in _DISPATCHING:  # a draining version still runs what it queued
            self.dispatch(version, now)
        if self.rate_limiter is not None and self.rate_limiter.blocked:
            self._wake_blocked(self.rate_limiter)

    def _fail_batch(self, batch: Batch, why: str, now: int) -> None:
        version, instance = batch.version, batch.instance
        log.error("instance '%s' of model '%s' version %d %s", instance.name, version.name, version.version, why)
        error = InternalError(f"instance '{instance.name}' of model '{version.name}' version {version.version} {why}")
        for index, request in enumerate(batch.requests):
            if index not in batch.finished:
                batch.finished.add(index)
                self._answer_error(version, request, error)
                batch.record_outcome(request, False, now)
            if request.client is STEP_CLIENT:   # as when its instance is lost: no compute times will come
                self.ensembles.step_executed(request.rid, NO_TIMINGS)

    def _steps_executed(self, batch: Batch, timings: tuple) -> None:
        """A decoupled batch's ensemble step requests: their compute times go to their ensembles."""
        for request in batch.requests:
            if request.client is STEP_CLIENT:
                self.ensembles.step_executed(request.rid, timings)

    def _route_responses(self, batch: Batch, requests: list[PendingRequest], external_counts: list, oks: list,
                         frames: list, now: int) -> None:
        offset = 0
        outgoing: dict[tuple[bool, bytes], list] = {}
        ordering = batch.version.ordering
        succeeded = []
        for request, external_count, ok in zip(requests, external_counts, oks):
            end = offset + 1 + external_count
            if request.cache_key is not None and ok:
                self.remember(batch.version, request.cache_key, frames[offset:end])
            if ordering is None:   # the common case, kept free of per-request lists
                key = (request.from_backend, request.client)
                parts = outgoing.get(key)
                if parts is None:
                    parts = outgoing[key] = [request.client]
                parts.extend(frames[offset:end])
            else:
                for from_backend, (client, *records) in ordering.release(
                        request.order, (request.from_backend, [request.client, *frames[offset:end]])):
                    parts = outgoing.get((from_backend, client))
                    if parts is None:
                        parts = outgoing[(from_backend, client)] = [client]
                    parts.extend(records)
            if ok:
                succeeded.append(request)
            else:
                batch.record_outcome(request, False, now, request.cancelled and _cancelled_answer(frames[offset]))
            offset = end
        batch.record_successes(succeeded, now)
        for (from_backend, _), parts in outgoing.items():
            self._reply(from_backend, parts, batch.timings)

    # -- instances come and go -----------------------------------------------------------

    def instance_ready(self, instance: InstanceRecord) -> None:
        version = self.registry.epochs.get(instance.epoch)
        if version is not None:
            self._idle.idle_again(version, instance)
        if version is not None and version.state in _DISPATCHING:
            self.dispatch(version)
        if self.rate_limiter is not None and self.rate_limiter.blocked:   # it may have raised a default count
            self._wake_blocked(self.rate_limiter)

    def holds_work(self, instances: list[InstanceRecord]) -> bool:
        """Whether any of ``instances`` runs a batch or has a decoupled request still answering."""
        return any(i.inflight for i in instances) or any(b.instance in instances for b in self.streams.batches.values())

    def idle(self) -> bool:
        """Nothing queued, running or streaming anywhere."""
        return not self.streams.batches and all(not len(v.batcher) for v in self.registry.epochs.values()) \
            and not any(i.inflight for i in self.registry.instances.values()) and not self.ensembles.busy \
            and not any(self._latest_undecided.values())

    def fail_everything(self, error: TritiumError) -> None:
        """Answer every request still held (the broker is exiting): none is left silent."""
        self.ensembles.fail_waiting(error)
        batches = [b for i in self.registry.instances.values() for b in i.inflight.values()]
        for batch in [*batches, *self.streams.batches.values()]:
            batch.record_held_outcomes()
            for index, request in enumerate(batch.requests):
                if index not in batch.finished:
                    batch.finished.add(index)
                    self._answer_error(batch.version, request, error)
        for instance in self.registry.instances.values():
            instance.inflight.clear()
        self.requests_running = 0
        self._lone_in_a_row = 0
        self.streams.batches.clear()
        for version in self.registry.epochs.values():
            self.fail_queued(version, error)
        undecided, self._latest_undecided = self._latest_undecided, {}
        for call in (call for calls in undecided.values() for call in calls):
            self.reply_error(call.client, call.header.rid, error, call.from_backend)

    def instance_gone(self, instance: InstanceRecord, version: ModelVersion | None, why: str,
                      restart_expected: bool = True) -> None:
        """Nothing the instance held is left silent: each request runs again once elsewhere, or fails.

        A request goes back to the head of its queue when its model has no sequence state
        and it had no response yet; a request lost a second time is answered with an error.
        When no instance is left and none is coming back (its host is gone or stopping),
        the queued requests are answered too, rather than waiting for a host that may
        never return. ``Membership.remove_instance`` took it out of the registry and its version.
        """
        now = self._clock()
        if version is not None and restart_expected and not instance.passive:   # (a passive one serves nothing)
            version.awaited[instance.name] = now + RESTART_WAIT_NS
        if self.rate_limiter is not None:   # what it held is free, and it no longer counts in the limits
            self.rate_limiter.forget(instance)
        held = list(instance.inflight.values())
        self.requests_running -= sum(len(batch.requests) for batch in held)
        held += [b for b in self.streams.batches.values() if b.instance is instance]
        retry = []
        for batch in held:
            self.streams.batches.pop(batch.number, None)
            batch.record_held_outcomes()   # answered before the instance went: they count, without timings
            for index, request in enumerate(batch.requests):
                if index not in batch.finished:
                    if not request.retried and index not in batch.answered and batch.version.state in _DISPATCHING \
                            and not batch.version.stateful:  # a sequence's state died with its instance
                        request.retried = True
                        request.deadline_ns = 0   # a retried request is not timed out again: it already waited
                        retry.append(request)
                        continue
                    # (the instance failed it: a BACKEND failure, as Triton counts a request its stub died with)
                    self._fail_request(batch.version, instance, request, why, now, "BACKEND")
                if request.client is STEP_CLIENT:   # its batch's compute times will never come
                    self.ensembles.step_executed(request.rid, NO_TIMINGS)
        instance.inflight.clear()
        if version is not None:
            self._requeue_or_fail(version, instance, retry, why, now)
        if self.rate_limiter is not None and self.rate_limiter.blocked:
            self._wake_blocked(self.rate_limiter)

    def instances_stopped(self, instances: list[InstanceRecord]) -> None:
        """A drained version's instances stopped, holding no work: the rate limiter forgets them."""
        if self.rate_limiter is not None:
            for instance in instances:
                self.rate_limiter.forget(instance)

    def _requeue_or_fail(self, version: ModelVersion, instance: InstanceRecord, retry: list[PendingRequest],
                         why: str, now: int) -> None:
        """The lost instance's version: its requests run again, or fail when nothing is left to run them."""
        batcher = version.batcher
        if isinstance(batcher, SequenceBatcher):  # its sequences' queued requests cannot go elsewhere either
            for request in batcher.instance_lost(instance):
                self._fail_request(version, instance, request, why, now)
        elif retry:   # only requests of models without sequence state were kept to run again (above)
            log.warning("instance %s of model %s version %d %s; running its %d request(s) again elsewhere",
                        instance.name, version.name, version.version, why, len(retry))
            batcher.requeue(sorted(retry, key=lambda r: r.arrival_ns))
        if not version.serving and not self._instances_coming(version, now):
            self.fail_queued(version, Unavailable(
                f"no instance of model '{version.name}' version {version.version} is left: "
                f"instance '{instance.name}' {why}"))
        elif version.state in _DISPATCHING:
            self.dispatch(version, now)

    def _fail_request(self, version: ModelVersion, instance: InstanceRecord, request: PendingRequest,
                      why: str, now: int, reason: str = "OTHER") -> None:
        lost = f"instance '{instance.name}' of model '{version.name}' version {version.version} {why}"
        if version.stateful:
            error = Unavailable(f"{lost}; the state of sequence {request.correlation_id} was lost with it")
        else:
            error = Unavailable(f"{lost} while running this request")
        self._answer_error(version, request, error)
        version.stats.record_failure(now - request.arrival_ns, reason)

    def fail_queued(self, version: ModelVersion, error: TritiumError, refused: bool = False) -> None:
        """Answer every queued request of a version that cannot serve them any more; ``refused``:
        as though refused on arrival (held requests whose version did not become ready)."""
        now = self._clock()
        bls_error = _as_bls_refusal(version.name, error) if refused else error
        for request in version.batcher.drain():
            self._answer_error(version, request, bls_error if request.from_backend else error)
            version.stats.record_failure(now - request.arrival_ns)
        self._waiting.discard(version)
        self._timed.pop(version, None)
        if self.rate_limiter is not None:
            self.rate_limiter.blocked.pop(version, None)


def _as_bls_refusal(model: str, error: TritiumError) -> TritiumError:
    """The words Triton's Python backend gives a BLS call its server refused to start."""
    error = copy.copy(error)
    error.message = f"Model {model} - Error when running inference: {error.message}"
    error.args = (error.message,)
    return error


def _with_sequence(record, correlation_id: int | str, flags: int) -> bytes:
    """The INFER ``record`` with its sequence fields set (its inline tensors kept)."""
    infer, view, offset = read_record(record)
    return msgspec.structs.replace(infer, sequence_id=correlation_id, sequence_flags=flags).encode((view[offset:],))


def _rescheduled_in(rescheduled: list[int], requests: int) -> bool:
    """Whether a BATCH_DONE's requests to run again are distinct places of its batch."""
    return len(set(rescheduled)) == len(rescheduled) and all(0 <= index < requests for index in rescheduled)


class _Turn:
    """``Scheduler.turn``'s context, entered once per broker turn (a generator-based context
    manager costs a few microseconds more, on the path of every request at low load)."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def __enter__(self) -> None:
        self._scheduler._turns_open += 1

    def __exit__(self, *_) -> None:
        scheduler = self._scheduler
        scheduler._turns_open -= 1
        if not scheduler._turns_open:   # a turn inside a turn leaves the dispatching to the outer one
            scheduler._dispatch_submitted()


def _answers_every_request(done: BatchDone, requests: int, frames: int) -> bool:
    """Whether a BATCH_DONE holds one result and one RESPONSE record (with its frames) per request."""
    counts = done.response_frames
    return len(done.ok) == requests == len(counts) and frames == requests + sum(counts)


def _cancelled_answer(record) -> bool:
    """Whether a failed request's RESPONSE says CANCELLED (read only for requests whose client gave up)."""
    response = read_record(record)[0]
    return isinstance(response, Response) and response.error is not None and response.error.code is ErrorCode.CANCELLED


def _sequence_room(instance: InstanceRecord) -> bool:
    """A sequence's next request may follow its previous one to its instance at once: its
    slot is taken either way, and the instance runs them in order."""
    return instance.credit > 0


def _no_instance_error(version: ModelVersion) -> Unavailable:
    return Unavailable(f"no instance of model '{version.name}' version {version.version} is running")


def _bls_call_refused(version: ModelVersion, header: Infer) -> TritiumError | None:
    """A model's BLS call the called model does not take, as Triton refuses it, in its order: a call
    for one answer (``exec()`` without ``decoupled=True``) of a decoupled model (Triton's Python
    backend), outputs it does not have, inputs it does not take (names, datatypes, shapes; Triton's
    core). A gateway checks its clients' requests, and their sizes, before they come."""
    if header.one_answer and version.decoupled:   # (Triton's words, its closing quote included)
        return InternalError(
            f"Model {version.name} is using the decoupled. The current BLS request call doesn't support models "
            "using the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
            "'async_exec' calls for decoupled models.'")
    for name in header.outputs or ():
        if name not in version.declared_outputs:
            return unexpected_output(version.name, name)
    try:
        check_inputs(version.name, version.declared_inputs, version.definition.config.max_batch_size,
                     [(descriptor[0], descriptor[1], descriptor[2]) for descriptor in header.inputs],
                     version.runs_without_inputs)
    except InvalidArgument as exc:
        return InvalidArgument(f"[request id: {header.request_id or '<id_unknown>'}] {exc.message}")
    return None


def _not_ready_error(model: str, number: int | None, version: ModelVersion | None, known: bool) -> TritiumError:
    if version is None:
        if not known:   # as Triton's core says it (a gateway's model table answers its clients so too)
            return NotFound(f"Request for unknown model: '{model}' is not found")
        if number is None or number < 0:
            return NotFound(f"Request for unknown model: '{model}' has no available versions")
        return NotFound(f"Request for unknown model: '{model}' version {number} is not found")
    # Triton's core text, as a gateway answers a named version it knows is not ready: a gateway's
    # request meets it here only when its model table was behind (a version reloading after a broker
    # restart), so that its client cannot tell which of the two answered; a BLS call naming a
    # version that is not ready gets it too, as from Triton's core.
    return Unavailable(f"Request for unknown model: '{model}' version {version.version} is not at ready state")


def _moved(average: float, value: float) -> float:
    """A moving average with ``value`` folded in (the first value starts it)."""
    return average + _AVERAGE_WEIGHT * (value - average) if average else value


def _note_execution(version: ModelVersion, took_ns: int, requests: int) -> None:
    """Fold a batch's time in its instance into its version's averages per request."""
    if requests == 1:
        version.execution_alone_ns = _moved(version.execution_alone_ns, took_ns)
    else:
        version.execution_grouped_ns = _moved(version.execution_grouped_ns, took_ns / requests)


def _batching_saves_little(version: ModelVersion) -> bool:
    """Whether the version's requests take long and about as long in a batch as alone (both seen)."""
    alone, grouped = version.execution_alone_ns, version.execution_grouped_ns
    return alone >= SHARE_FROM_NS and grouped >= alone * (1 - SHARE_WHEN_BATCHED_SAVES_UNDER)
