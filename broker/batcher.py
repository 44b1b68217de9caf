"""The dynamic batcher: which queued requests go together, and when. A pure unit.

It owns one model version's queue and answers, when an instance can take work,
which requests form the next batch; it never touches sockets and never reads a
clock of its own (``now_ns`` is passed in), so tests drive it with a fake clock.

The rules follow Triton's ``dynamic_batching``:

* requests are taken in arrival order; a batch is a run of requests from the head of
  the queue whose non-batch shapes agree (``shape_key``) and whose batch sizes add up
  to at most ``max_batch_size``;
* a batch that cannot grow any more (it is full, or the next request does not fit or
  has other shapes) leaves at once;
* otherwise, if a preferred batch size can be formed the largest such batch leaves
  at once; with no queue delay the largest possible batch leaves at once; else the
  batcher waits until the oldest request has waited ``max_queue_delay_us``;
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

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue(self, request: R) -> None:
        self._queue.append(request)

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
        count, best_preferred, can_grow = self._scan()
        if not can_grow:
            return self._take(count)
        if best_preferred:
            return self._take(best_preferred)
        if self._delay_ns == 0 or now_ns - queue[0].arrival_ns >= self._delay_ns:
            return self._take(count)
        return None

    def deadline_ns(self) -> int | None:
        """When the oldest request's queue delay runs out (None: nothing is waiting on time)."""
        if not self._queue or not self.policy.enabled or self._delay_ns == 0:
            return None
        return self._queue[0].arrival_ns + self._delay_ns

    def _scan(self) -> tuple[int, int, bool]:
        """(requests that fit, requests forming the largest preferred size, whether it can grow)."""
        queue = self._queue
        head_key = queue[0].shape_key
        limit = self.policy.max_batch_size
        total = count = best = 0
        for request in queue:
            if request.shape_key != head_key or total + request.batch_size > limit:
                if count == 0:  # a head larger than max_batch_size still goes alone
                    return 1, 0, False
                return count, best, False
            total += request.batch_size
            count += 1
            if total in self._preferred:
                best = count
        return count, best, total < limit

    def _take(self, count: int) -> list[R]:
        queue = self._queue
        return [queue.popleft() for _ in range(count)]
