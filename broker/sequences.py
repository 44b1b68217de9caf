"""The sequence batcher: requests of stateful models, each sequence bound to one instance slot. A pure unit.

It stands in for the dynamic batcher of a model version whose config has
``sequence_batching``, with the same queue interface (``enqueue``, ``drain``,
``deadline_ns``, ``len``); it never touches sockets and never reads a clock of its own,
so tests drive it with a fake clock. The rules follow Triton's ``SequenceBatchScheduler``:

* a request needs a correlation id and batch size 1; one that does not start a sequence
  needs a sequence that is running (Triton's three refusals, with Triton's texts);
* a START binds its sequence to a free slot of an instance (the lowest free slot index
  first, which spreads sequences over instances); with no free slot the sequence waits in
  the backlog, in START order, and takes the next slot that frees. Every later request of
  the sequence goes to the same instance and slot;
* the END request unbinds the correlation id at once (a later request without START is
  refused); its slot frees when that request leaves in a batch. A START for a running
  sequence continues in the same slot (Triton logs a warning and does the same);
* a bound sequence with no request for ``max_sequence_idle_microseconds`` is forgotten
  the same way, as if an END had come after its queued requests; sequences in the backlog
  do not age (a deliberate difference: docs/compatibility.md);
* a sequence in the backlog whose requests asked for a ``timeout`` is rejected whole when the
  earliest of them runs out (``expired_backlog``: Triton's "timeout of the corresponding
  sequence has been expired"), and its correlation id is forgotten;
* ``direct``: ``max(1, max_batch_size)`` slots per instance; a batch holds the head
  request of each slot that has one, in slot order (the instance pads the slots between
  with not-ready requests, as Triton does); it leaves at once unless both
  ``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` are set, in which case
  it waits until the ready slots reach that fraction of the slots or the oldest head has
  waited the delay. Heads whose shapes differ from the first one's wait for a later batch;
* a request whose client gives up while it is queued ends its sequence: every request of
  the sequence still queued is answered CANCELLED, the slot frees and the correlation id is
  forgotten (Triton releases a slot whose head request is cancelled the same way);
* ``oldest``: ``max_candidate_sequences`` slots per instance (or ``max(1, max_batch_size)``);
  each instance has a dynamic batcher (``preferred_batch_size``,
  ``max_queue_delay_microseconds``) holding the head request of each of its sequences, so
  a batch never holds two requests of one sequence;
* ``iterative_sequence``: a request without a correlation id starts a sequence of its own,
  numbered by the batcher from 1 (``assign``); the model may release a request to run
  again (request rescheduling), which queues it in its sequence once more without START or
  END (``enqueue`` of the same request); a request released for good ends its sequence
  (``finish``), as Triton's iterative sequencer does.

Instances are whatever objects the caller passes (the scheduler's ``InstanceRecord``);
the batcher only hashes them.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from tritium.broker.batcher import Batchable, BatchingPolicy, DynamicBatcher
from tritium.errors import InvalidArgument

log = logging.getLogger(__name__)

# Triton's request flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END).
START = 1
END = 2
DEFAULT_IDLE_US = 1_000_000


class SequenceRequest(Batchable, Protocol):   # batchable: the oldest strategy batches them
    correlation_id: int | str
    flags: int
    deadline_ns: int   # its own timeout, if it asked for one (0: none): it bounds its wait in the backlog


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    model: str
    oldest: bool
    slots_per_instance: int
    max_batch_size: int                    # at least 1
    max_idle_us: int = DEFAULT_IDLE_US
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0  # direct only
    preferred_batch_sizes: tuple[int, ...] = ()   # oldest only
    iterative: bool = False                # iterative_sequence: requests may run again (see the module doc)

    @classmethod
    def from_config(cls, config) -> "SequencePolicy":
        """The policy of a ModelConfig proto that has ``sequence_batching``."""
        batching = config.sequence_batching
        max_batch_size = max(1, config.max_batch_size)
        idle_us = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        iterative = batching.iterative_sequence
        if batching.WhichOneof("strategy_choice") == "oldest":
            oldest = batching.oldest
            return cls(config.name, True, oldest.max_candidate_sequences or max_batch_size, max_batch_size,
                       idle_us, int(oldest.max_queue_delay_microseconds),
                       preferred_batch_sizes=tuple(sorted(set(oldest.preferred_batch_size))), iterative=iterative)
        direct = batching.direct
        return cls(config.name, False, max_batch_size, max_batch_size, idle_us,
                   int(direct.max_queue_delay_microseconds), float(direct.minimum_slot_utilization),
                   iterative=iterative)


# An instance, as the caller knows it: the batcher only keys its slots by it and hands it back.
Inst = TypeVar("Inst", bound=Hashable)


@dataclass(frozen=True, slots=True)
class SequenceBatch(Generic[Inst]):
    """What to send one instance: requests in batch order, each one's slot, the batch size it runs at."""

    instance: Inst
    requests: list
    slots: list[int]
    size: int   # direct: up to the highest slot (the instance pads the gaps); oldest: the requests


@dataclass(eq=False, slots=True)
class _Sequence:
    correlation_id: int | str
    idle_since_ns: int
    queue: deque = field(default_factory=deque)
    instance: Any = None   # the SequenceBatcher's Inst it is bound to (None: not bound)
    slot: int = -1
    ending: bool = False   # takes no more requests (END queued, or idle too long): unbind once drained
    expires_ns: int = 0    # in the backlog: when its requests' earliest timeout runs out (0: never)


@dataclass(eq=False, slots=True)
class _Instance:
    """One instance's slots, its free slot numbers (a heap), and for ``oldest`` its dynamic batcher."""

    instance: Any   # the SequenceBatcher's Inst
    sequences: list
    free: list
    batcher: DynamicBatcher[SequenceRequest] | None = None
    offered: dict = field(default_factory=dict)   # oldest: head request in the batcher -> its sequence
    queued: int = 0                               # requests waiting in its sequences

    @property
    def bound(self) -> int:
        return len(self.sequences) - len(self.free)


class SequenceBatcher(Generic[Inst]):
    simple = True   # no priority levels or queue timeouts: the scheduler's plain path

    def __init__(self, policy: SequencePolicy) -> None:
        self.policy = policy
        self._active: dict[int | str, _Sequence] = {}   # correlation id -> the sequence taking its requests
        self._aging: OrderedDict[int | str, _Sequence] = OrderedDict()   # bound active ones, least recent first
        self._backlog: deque[_Sequence] = deque()
        self._instances: dict[Inst, _Instance] = {}
        self._count = 0
        self._idle_ns = policy.max_idle_us * 1000
        self._delay_ns = policy.max_queue_delay_us * 1000
        self._deadline_ns: int | None = None
        self._assigned = 0   # iterative sequences: the last correlation id this batcher gave a request

    def __len__(self) -> int:
        return self._count

    # -- requests in ----------------------------------------------------------------------

    def enqueue(self, request: SequenceRequest) -> None:
        """Queue a request in its sequence; InvalidArgument with Triton's text when it has none."""
        model = self.policy.model
        if request.batch_size > 1:
            raise InvalidArgument(f"inference request to model '{model}' must specify batch-size 1 due to "
                                  "requirements of sequence batcher")
        correlation_id = request.correlation_id
        if not correlation_id:
            raise InvalidArgument(f"inference request to model '{model}' must specify a non-zero or non-empty "
                                  "correlation ID")
        now = request.arrival_ns
        self.expire(now)
        sequence = self._active.get(correlation_id)
        if sequence is None:
            if not request.flags & START:
                raise InvalidArgument(f"inference request for sequence {correlation_id} to model '{model}' must "
                                      "specify the START flag on the first request of the sequence")
            sequence = self._active[correlation_id] = _Sequence(correlation_id, now)
            self._backlog.append(sequence)
        elif request.flags & START:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before "
                        "this sequence start. Previous sequence will be terminated early.", correlation_id, model)
        sequence.queue.append(request)
        self._count += 1
        if sequence.instance is not None:
            self._instances[sequence.instance].queued += 1
            self._touch(sequence, now)
            self._offer(sequence)
        elif request.deadline_ns:   # in the backlog: its requests' timeouts bound its wait
            if not sequence.expires_ns or request.deadline_ns < sequence.expires_ns:
                sequence.expires_ns = request.deadline_ns
        if request.flags & END:
            self._stop_taking(sequence)

    def assign(self) -> int:
        """Iterative sequences: the correlation id of a new sequence for a request that has none."""
        self._assigned += 1
        return self._assigned

    def finish(self, correlation_id: int | str) -> None:
        """Iterative sequences: a request of sequence ``correlation_id`` was released for good,
        which ends its sequence (its queued requests still run; a later one needs START)."""
        sequence = self._active.get(correlation_id)
        if sequence is not None:
            self._stop_taking(sequence)

    def expire(self, now_ns: int) -> None:
        """Forget the bound sequences that had no request for the idle limit."""
        while self._aging:
            sequence = next(iter(self._aging.values()))
            if now_ns - sequence.idle_since_ns < self._idle_ns:
                return
            log.info("sequence %s of model '%s' had no request for %d us; releasing its slot %d",
                     sequence.correlation_id, self.policy.model, self.policy.max_idle_us, sequence.slot)
            self._stop_taking(sequence)

    def expired_backlog(self, now_ns: int) -> list:
        """The requests of backlog sequences whose timeout ran out, to be rejected; those
        sequences are forgotten (a later request of theirs needs START)."""
        expired = [s for s in self._backlog if s.expires_ns and s.expires_ns <= now_ns]
        rejected: list = []
        for sequence in expired:
            self._backlog.remove(sequence)
            rejected.extend(sequence.queue)
            self._count -= len(sequence.queue)
            sequence.queue.clear()
            if self._active.get(sequence.correlation_id) is sequence:
                del self._active[sequence.correlation_id]
            log.info("sequence %s of model '%s' waited for a slot past its requests' timeout; rejected",
                     sequence.correlation_id, self.policy.model)
        return rejected

    def _touch(self, sequence: _Sequence, now_ns: int) -> None:
        if not sequence.ending:
            sequence.idle_since_ns = now_ns
            self._aging[sequence.correlation_id] = sequence
            self._aging.move_to_end(sequence.correlation_id)

    def _stop_taking(self, sequence: _Sequence) -> None:
        sequence.ending = True
        if self._active.get(sequence.correlation_id) is sequence:
            del self._active[sequence.correlation_id]
            self._aging.pop(sequence.correlation_id, None)
        if sequence.instance is not None and not sequence.queue:
            self._unbind(sequence)

    # -- slots ------------------------------------------------------------------------------

    def _bind_backlog(self, instances: Iterable[Inst], now_ns: int) -> None:
        """Give free slots of ``instances`` to the backlog, oldest START first."""
        if not self._backlog:
            return
        candidates = [self._slots_of(instance) for instance in instances]
        while self._backlog:
            best = min((c for c in candidates if c.free), key=lambda c: (c.free[0], c.bound), default=None)
            if best is None:
                return
            sequence = self._backlog.popleft()
            slot = heapq.heappop(best.free)
            best.sequences[slot] = sequence
            sequence.instance, sequence.slot = best.instance, slot
            sequence.expires_ns = 0
            best.queued += len(sequence.queue)
            self._touch(sequence, now_ns)
            self._offer(sequence)
            if sequence.ending and not sequence.queue:
                self._unbind(sequence)

    def _slots_of(self, instance: Inst) -> _Instance:
        slots = self._instances.get(instance)
        if slots is None:
            count = self.policy.slots_per_instance
            batcher: DynamicBatcher[SequenceRequest] | None = None
            if self.policy.oldest:
                batcher = DynamicBatcher(BatchingPolicy(
                    enabled=self.policy.max_batch_size > 1, max_batch_size=self.policy.max_batch_size,
                    preferred_batch_sizes=self.policy.preferred_batch_sizes,
                    max_queue_delay_us=self.policy.max_queue_delay_us))
            slots = self._instances[instance] = _Instance(instance, [None] * count, list(range(count)), batcher)
        return slots

    def _unbind(self, sequence: _Sequence) -> None:
        slots = self._instances[sequence.instance]
        slots.sequences[sequence.slot] = None
        heapq.heappush(slots.free, sequence.slot)
        sequence.instance = None

    def _offer(self, sequence: _Sequence) -> None:
        """Oldest: put the sequence's head request in its instance's batcher, unless one is there."""
        slots = self._instances.get(sequence.instance)
        if slots is None or slots.batcher is None or not sequence.queue:
            return
        head = sequence.queue[0]
        if head not in slots.offered:
            slots.offered[head] = sequence
            slots.batcher.enqueue(head)

    # -- batches out --------------------------------------------------------------------------

    def next_batch(self, now_ns: int, instances: Iterable[Inst],
                   can_take: Callable[[Inst], bool]) -> SequenceBatch[Inst] | None:
        """The next batch for an instance that ``can_take`` one, or None (see ``deadline_ns``).

        ``instances`` are those that may take new sequences; an instance already holding
        sequences keeps getting their requests while it lives.
        """
        self.expire(now_ns)
        self._bind_backlog(instances, now_ns)
        deadline = next(iter(self._aging.values())).idle_since_ns + self._idle_ns if self._aging else None
        for sequence in self._backlog:
            if sequence.expires_ns and (deadline is None or sequence.expires_ns < deadline):
                deadline = sequence.expires_ns
        for instance, slots in self._instances.items():
            if not slots.queued or not can_take(instance):
                continue
            batch = self._oldest(instance, slots.batcher, slots, now_ns) if slots.batcher is not None \
                else self._direct(instance, slots, now_ns)
            if isinstance(batch, SequenceBatch):
                return batch
            if batch is not None:
                deadline = batch if deadline is None else min(deadline, batch)
        self._deadline_ns = deadline
        return None

    def deadline_ns(self) -> int | None:
        """When the batcher next has something to do: a queue delay or an idle limit runs out."""
        return self._deadline_ns

    def _direct(self, instance: Inst, slots: _Instance, now_ns: int) -> SequenceBatch[Inst] | int | None:
        heads = [(index, sequence.queue[0]) for index, sequence in enumerate(slots.sequences)
                 if sequence is not None and sequence.queue]
        if not heads:
            return None
        ready = len(heads)
        shape_key = heads[0][1].shape_key
        heads = [(index, request) for index, request in heads if request.shape_key == shape_key]
        utilization = self.policy.minimum_slot_utilization
        if self._delay_ns and utilization:
            oldest = min(request.arrival_ns for _, request in heads)
            if now_ns - oldest < self._delay_ns and ready / self.policy.max_batch_size < utilization:
                return oldest + self._delay_ns
        for index, _ in heads:
            self._take(slots, slots.sequences[index])
        return SequenceBatch(instance, [request for _, request in heads], [index for index, _ in heads],
                             heads[-1][0] + 1)

    def _oldest(self, instance: Inst, batcher: DynamicBatcher[SequenceRequest], slots: _Instance,
                now_ns: int) -> SequenceBatch[Inst] | int | None:
        requests = batcher.next_batch(now_ns)
        if requests is None:
            return batcher.deadline_ns()
        sequences = [slots.offered.pop(request) for request in requests]
        numbers = [sequence.slot for sequence in sequences]
        for sequence in sequences:
            self._take(slots, sequence)
            self._offer(sequence)
        return SequenceBatch(instance, requests, numbers, len(requests))

    def _take(self, slots: _Instance, sequence: _Sequence) -> None:
        sequence.queue.popleft()
        slots.queued -= 1
        self._count -= 1
        if sequence.ending and not sequence.queue:
            self._unbind(sequence)

    # -- a client gives up ---------------------------------------------------------------------

    def cancel(self, client: bytes, rid: int) -> list:
        """Request ``rid`` of ``client`` gave up while queued: its sequence is over, as in Triton.
        Returns the sequence's queued requests, that one among them, to be answered CANCELLED
        (none when it is not queued here). The slot frees at once and the correlation id is
        forgotten: a later request of the sequence without START is refused."""
        for sequence in self._queued_sequences():
            if any(request.rid == rid and request.client == client for request in sequence.queue):
                return self._end_cancelled(sequence)
        return []

    def end(self, correlation_id: int | str) -> list:
        """A running request of sequence ``correlation_id`` was cancelled: the sequence ends as in
        ``cancel``; returns its queued requests (none when it is not active)."""
        sequence = self._active.get(correlation_id)
        return self._end_cancelled(sequence) if sequence is not None else []

    def _queued_sequences(self) -> Iterable[_Sequence]:
        yield from self._backlog
        for slots in self._instances.values():
            yield from (sequence for sequence in slots.sequences if sequence is not None and sequence.queue)

    def _end_cancelled(self, sequence: _Sequence) -> list:
        cancelled = list(sequence.queue)
        sequence.queue.clear()
        self._count -= len(cancelled)
        slots = self._instances.get(sequence.instance) if sequence.instance is not None else None
        if slots is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
        elif cancelled:
            slots.queued -= len(cancelled)
            head = cancelled[0]
            if slots.offered.pop(head, None) is not None:
                assert slots.batcher is not None
                slots.batcher.take(head.client, head.rid)
        log.info("sequence %s of model '%s' cancelled; %d queued request(s) of it cancelled",
                 sequence.correlation_id, self.policy.model, len(cancelled))
        self._stop_taking(sequence)   # unbinds it, its queue being empty
        return cancelled

    def binds(self, instance: Inst) -> bool:
        """Whether sequences are bound to ``instance`` (it must live until they end)."""
        slots = self._instances.get(instance)
        return slots is not None and slots.bound > 0

    # -- the queue goes away ------------------------------------------------------------------

    def instance_lost(self, instance: Inst) -> list:
        """Forget the sequences bound to ``instance``; return their queued requests, to be failed."""
        slots = self._instances.pop(instance, None)
        if slots is None:
            return []
        lost = []
        for sequence in slots.sequences:
            if sequence is None:
                continue
            lost.extend(sequence.queue)
            sequence.queue.clear()
            correlation_id = sequence.correlation_id
            if self._active.get(correlation_id) is sequence:
                del self._active[correlation_id]
                self._aging.pop(correlation_id, None)
        self._count -= len(lost)
        return lost

    def drain(self) -> list:
        """Remove and return every queued request (the model is going away); every sequence ends."""
        sequences = [*self._backlog, *(s for slots in self._instances.values() for s in slots.sequences if s)]
        pending = sorted((r for s in sequences for r in s.queue), key=lambda r: r.arrival_ns)
        self._active.clear()
        self._aging.clear()
        self._backlog.clear()
        self._instances.clear()
        self._count = 0
        self._deadline_ns = None
        return pending
