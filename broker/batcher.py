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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Hashable, Protocol, TypeVar


class Batchable(Protocol):
    batch_size: int
    shape_key: Hashable
    arrival_ns: int


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


class DynamicBatcher(Generic[R]):
    def __init__(self, policy: BatchingPolicy) -> None:
        self.policy = policy
        self._queue: deque[R] = deque()
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._delay_ns = policy.max_queue_delay_us * 1000
        # Where a batch stops wanting to grow (Triton's max_preferred_batch_size_).
        self._max_preferred = max(policy.preferred_batch_sizes, default=policy.max_batch_size)

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue(self, request: R) -> None:
        self._queue.append(request)

    def requeue(self, requests: list[R]) -> None:
        """Put requests back at the head of the queue, in their order (their instance was lost)."""
        self._queue.extendleft(reversed(requests))

    def drain(self) -> list[R]:
        """Remove and return everything queued (the model is going away)."""
        pending = list(self._queue)
        self._queue.clear()
        return pending

    def remove(self, request: R) -> bool:
        try:
            self._queue.remove(request)
        except ValueError:
            return False
        return True

    def next_batch(self, now_ns: int) -> list[R] | None:
        """The batch to send now, or None when it is better to wait (see ``deadline_ns``)."""
        queue = self._queue
        if not queue:
            return None
        if not self.policy.enabled:
            return [queue.popleft()]
        count, total, best_preferred, send_now = self._scan()
        delay_exceeded = self._delay_ns != 0 and now_ns - queue[0].arrival_ns >= self._delay_ns
        if best_preferred and not delay_exceeded:
            return self._take(best_preferred)
        if send_now or total >= self._max_preferred or delay_exceeded or self._delay_ns == 0:
            return self._take(count)
        return None

    def deadline_ns(self) -> int | None:
        """When the oldest request's queue delay runs out (None: nothing is waiting on time)."""
        if not self._queue or not self.policy.enabled or self._delay_ns == 0:
            return None
        return self._queue[0].arrival_ns + self._delay_ns

    def _scan(self) -> tuple[int, int, int, bool]:
        """(requests that fit, their batch size, requests of the best preferred batch, send now).

        The best preferred batch is the longest run reaching a preferred size, or the run
        before the request that would pass the largest preferred size, as Triton marks it.
        """
        queue = self._queue
        head_key = queue[0].shape_key
        limit = self.policy.max_batch_size
        max_preferred = self._max_preferred
        total = count = best = 0
        for request in queue:
            if count:
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
