"""The dynamic batcher: which queued requests go together, and when. A pure unit.

It owns one model version's queue and answers, when an instance can take work,
which requests form the next batch; it never touches sockets and never reads a
clock of its own (``now_ns`` is passed in), so tests drive it with a fake clock.

The rules follow Triton's ``dynamic_batching`` (``DynamicBatchScheduler::GetDynamicBatch``):

* requests are taken in arrival order; a batch is a run of requests from the head of
  the queue whose non-batch shapes agree (``shape_key``) and whose batch sizes add up
  to at most ``max_batch_size`` (a head request above it still goes, alone);
* the largest preferred batch size (``max_batch_size`` when none is configured) is
  where a batch stops wanting to grow: the largest batch that reaches a preferred size,
  or else the run before the request that would pass the largest preferred size, leaves
  at once, unless the oldest request has already waited ``max_queue_delay_us``;
* a batch that cannot grow any more (the next request does not fit or has other
  shapes), or that has reached the largest preferred size, leaves at once;
* with no queue delay, or once the oldest request has waited the delay, everything
  that fits (up to ``max_batch_size``) leaves; otherwise the batcher waits;
* without dynamic batching every request is its own batch.

With ``priority_levels`` the queue is ordered by level first (level 1 leaves first), and
within a level the requests still in time come before those a ``DELAY`` policy put back
after their timeout (``broker/queue_policy.py``); ``expire`` applies the timeouts.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Generic, Hashable, Protocol, TypeVar

from tritium.broker.queue_policy import QueuePolicy


class Batchable(Protocol):
    client: bytes       # who asked, and its number for the request
    rid: int
    batch_size: int
    shape_key: Hashable
    arrival_ns: int
    level: int          # priority level index (0 is Triton's level 1)
    deadline_ns: int    # when its queue policy's timeout runs out; 0: never
    delayed: bool       # put back after its timeout (DELAY)
    queued: bool


R = TypeVar("R", bound=Batchable)


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    enabled: bool
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0

    @classmethod
    def from_config(cls, config) -> "BatchingPolicy":
        """The policy of a ModelConfig proto."""
        if not config.HasField("dynamic_batching") or config.max_batch_size <= 0:
            return cls(enabled=False, max_batch_size=max(config.max_batch_size, 1))
        batching = config.dynamic_batching
        return cls(enabled=True, max_batch_size=config.max_batch_size,
                   preferred_batch_sizes=tuple(sorted(set(batching.preferred_batch_size))),
                   max_queue_delay_us=int(batching.max_queue_delay_microseconds))


class RequestQueue(Generic[R]):
    """Queued requests in the order batches take them: by level, then in-time before delayed.

    A level's two parts (in time, delayed) exist while it holds requests: ``priority_levels`` may
    be as large as a uint64, so levels are made as requests use them, as Triton makes them.
    """

    def __init__(self) -> None:
        self._parts: list[deque[R]] = []   # each level's in-time then delayed part, levels in order
        self._levels: list[int] = []       # the level of each pair of parts, ascending
        self._level_sizes: dict[int, int] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[R]:
        for part in self._parts:
            yield from part

    def head(self) -> R:
        for part in self._parts:
            if part:
                return part[0]
        raise IndexError("the queue is empty")

    def append(self, request: R) -> None:
        self._part(request.level, request.delayed).append(request)
        self._added(request)

    def requeue(self, requests: list[R]) -> None:
        for request in reversed(requests):
            self._part(request.level, request.delayed).appendleft(request)
            self._added(request)

    def popleft(self) -> R:
        for part in self._parts:
            if part:
                request = part.popleft()
                self._removed(request)
                return request
        raise IndexError("the queue is empty")

    def remove(self, request: R) -> bool:
        if not request.queued:
            return False
        self._part(request.level, request.delayed).remove(request)
        self._removed(request)
        return True

    def delay(self, request: R) -> None:
        """Move a request behind every request of its level that is still in time."""
        self._part(request.level, False).remove(request)
        request.delayed = True
        self._part(request.level, True).append(request)

    def drain(self) -> list[R]:
        pending = list(self)
        for request in pending:
            request.queued = False
        self._parts, self._levels = [], []
        self._level_sizes.clear()
        self._size = 0
        return pending

    def _part(self, level: int, delayed: bool) -> deque[R]:
        index = bisect.bisect_left(self._levels, level)
        if index == len(self._levels) or self._levels[index] != level:
            self._levels.insert(index, level)
            self._parts[2 * index:2 * index] = [deque(), deque()]
        return self._parts[2 * index + delayed]

    def size_of(self, level: int) -> int:
        return self._level_sizes.get(level, 0)

    def _added(self, request: R) -> None:
        request.queued = True
        self._level_sizes[request.level] = self._level_sizes.get(request.level, 0) + 1
        self._size += 1

    def _removed(self, request: R) -> None:
        request.queued = False
        self._size -= 1
        self._level_sizes[request.level] -= 1
        if not self._level_sizes[request.level]:   # the level's parts go with its last request
            del self._level_sizes[request.level]
            index = bisect.bisect_left(self._levels, request.level)
            del self._levels[index]
            del self._parts[2 * index:2 * index + 2]


class PlainQueue(deque[R]):
    """The queue of a model with one level and no timeouts: a deque, with RequestQueue's extras.

    Most models are like that, and the hot path then runs on deque's C methods.
    """

    def __init__(self) -> None:
        super().__init__()

    def head(self) -> R:
        return self[0]

    def size_of(self, level: int) -> int:
        return len(self)   # one level (and no max_queue_size: that is a queue policy)

    def requeue(self, requests: list[R]) -> None:
        self.extendleft(reversed(requests))

    def remove(self, request: R) -> bool:  # type: ignore[override]
        try:
            super().remove(request)
        except ValueError:
            return False
        return True

    def drain(self) -> list[R]:
        pending = list(self)
        self.clear()
        return pending


class DynamicBatcher(Generic[R]):
    def __init__(self, policy: BatchingPolicy, queue_policy: QueuePolicy = QueuePolicy()) -> None:
        self.policy = policy
        self.queue_policy = queue_policy
        self.simple = queue_policy.trivial   # one level, no timeout, no bound: the fast path
        self._queue: PlainQueue[R] | RequestQueue[R] = \
            PlainQueue() if self.simple else RequestQueue()
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._delay_ns = policy.max_queue_delay_us * 1000
        # Where a batch stops wanting to grow (Triton's max_preferred_batch_size_).
        self._max_preferred = max(policy.preferred_batch_sizes, default=policy.max_batch_size)
        # Whether a batch takes whatever is queued when an instance is free (no queue delay, no
        # preferred size but the largest, which auto-complete sets): then what is queued may be
        # shared among the idle instances (Scheduler._share).
        self.spreads = policy.enabled and self._delay_ns == 0 and self._preferred <= {policy.max_batch_size}
        self._timeouts: list[tuple[int, int, R]] = []   # heap of (deadline, tie-break, request)
        self._tie = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    def oldest_arrival_ns(self) -> int:
        """When the oldest queued request arrived (the queue must not be empty)."""
        queue = self._queue
        if isinstance(queue, PlainQueue):   # the simple case: arrival order
            return queue[0].arrival_ns
        return min(request.arrival_ns for request in queue)

    def full(self, level: int) -> bool:
        """Whether ``level``'s queue holds its policy's ``max_queue_size`` already."""
        limit = self.queue_policy.policy(level).max_queue_size
        return bool(limit) and self._queue.size_of(level) >= limit

    def enqueue(self, request: R) -> None:
        self._queue.append(request)
        if not self.simple and request.deadline_ns and not request.delayed:
            heapq.heappush(self._timeouts, (request.deadline_ns, next(self._tie), request))

    def requeue(self, requests: list[R]) -> None:
        """Put requests back at the head of the queue, in their order (their instance was lost)."""
        self._queue.requeue(requests)

    def drain(self) -> list[R]:
        """Remove and return everything queued (the model is going away)."""
        self._timeouts.clear()
        return self._queue.drain()

    def remove(self, request: R) -> bool:
        return self._queue.remove(request)

    def take(self, client: bytes, rid: int) -> R | None:
        """Remove and return the queued request ``rid`` of ``client`` (its client gave up on it);
        None when it is not queued. A walk of the queue: cancelling is rare, queueing is not."""
        for request in self._queue:
            if request.rid == rid and request.client == client:
                self._queue.remove(request)
                return request
        return None

    def next_timeout_ns(self) -> int | None:
        """When the next queued request's timeout runs out (None: no request has one)."""
        timeouts = self._timeouts
        while timeouts and _stale(timeouts[0]):
            heapq.heappop(timeouts)
        return timeouts[0][0] if timeouts else None

    def expire(self, now_ns: int) -> list[R]:
        """Apply the timeouts that ran out: DELAY requests move back, REJECT ones are returned."""
        rejected: list[R] = []
        queue = self._queue
        if isinstance(queue, PlainQueue):   # a simple queue policy has no timeouts
            return rejected
        timeouts = self._timeouts
        while timeouts and timeouts[0][0] <= now_ns:
            entry = heapq.heappop(timeouts)
            request = entry[2]
            if _stale(entry) or request.delayed:
                continue
            if self.queue_policy.policy(request.level).delay_on_timeout:
                queue.delay(request)
            else:
                queue.remove(request)
                rejected.append(request)
        return rejected

    def next_batch(self, now_ns: int, share: int = 0) -> list[R] | None:
        """The batch to send now, or None when it is better to wait (see ``deadline_ns``);
        ``share``: at most that many requests (0: as many as fit)."""
        queue = self._queue
        if not queue:
            return None
        if not self.policy.enabled:
            return [queue.popleft()]
        count, total, best_preferred, send_now = self._scan(share)
        delay_exceeded = self._delay_ns != 0 and now_ns - queue.head().arrival_ns >= self._delay_ns
        if best_preferred and not delay_exceeded:
            return self._take(best_preferred)
        if send_now or total >= self._max_preferred or delay_exceeded or self._delay_ns == 0:
            return self._take(count)
        return None

    def deadline_ns(self) -> int | None:
        """When the oldest request's queue delay runs out (None: nothing is waiting on time)."""
        if not self._queue or not self.policy.enabled or self._delay_ns == 0:
            return None
        return self._queue.head().arrival_ns + self._delay_ns

    def _scan(self, share: int = 0) -> tuple[int, int, int, bool]:
        """(requests that fit, their batch size, requests of the best preferred batch, send now).

        The best preferred batch is the longest run reaching a preferred size, or the run
        before the request that would pass the largest preferred size, as Triton marks it.
        """
        queue = self._queue
        head_key = queue.head().shape_key
        limit = self.policy.max_batch_size
        max_preferred = self._max_preferred
        total = count = best = 0
        for request in queue:
            if count:
                if count == share:
                    return count, total, best, True
                grown = total + request.batch_size
                if best == 0 and grown > max_preferred:
                    best = count
                if grown > limit or request.shape_key != head_key:
                    return count, total, best, True
            total += request.batch_size
            count += 1
            if total in self._preferred:
                best = count
        return count, total, best, False

    def _take(self, count: int) -> list[R]:
        queue = self._queue
        return [queue.popleft() for _ in range(count)]


def _stale(entry: tuple) -> bool:
    """A timeout entry whose request left the queue, or came back to it without that timeout
    (requeued after its instance was lost: it already waited, and is not timed out again)."""
    deadline, _, request = entry
    return not request.queued or request.deadline_ns != deadline
