"""Priority levels and queue policies of ``dynamic_batching``, as Triton defines them.

A model may have ``priority_levels`` queues (level 1 is the highest); each level has a
policy: how long a request may wait (``default_timeout_microseconds``, which a request's
``timeout`` parameter may lower when ``allow_timeout_override`` is set), what happens
when it has waited that long (``REJECT``: answered 503; ``DELAY``: it goes behind every
request of its level that is still in time), and how many requests the level holds
(``max_queue_size``). A request's ``priority`` parameter picks its level; 0 or a value
above ``priority_levels`` means ``default_priority_level``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritium.errors import InvalidArgument

_DELAY = 1   # ModelQueuePolicy.TimeoutAction.DELAY


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    timeout_ns: int = 0             # 0: requests wait as long as it takes
    delay_on_timeout: bool = False  # DELAY rather than REJECT
    allow_override: bool = False
    max_queue_size: int = 0         # 0: unbounded

    @classmethod
    def from_proto(cls, policy) -> "LevelPolicy":
        return cls(timeout_ns=int(policy.default_timeout_microseconds) * 1000,
                   delay_on_timeout=policy.timeout_action == _DELAY,
                   allow_override=bool(policy.allow_timeout_override),
                   max_queue_size=int(policy.max_queue_size))


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Levels are indexes from 0 (priority level 1). Only the levels ``priority_queue_policy`` names
    are kept; any other level has the default policy (``priority_levels`` may be as large as a
    uint64: as Triton, levels exist as requests use them)."""

    level_count: int = 1
    default: LevelPolicy = LevelPolicy()
    named: dict[int, LevelPolicy] = field(default_factory=dict)   # index -> its own policy
    default_level: int = 0                                         # an index
    preserve_ordering: bool = False

    @classmethod
    def from_config(cls, config) -> "QueuePolicy":
        if not config.HasField("dynamic_batching"):
            return cls()
        batching = config.dynamic_batching
        default = LevelPolicy.from_proto(batching.default_queue_policy)
        count = int(batching.priority_levels)
        if count == 0:   # one queue, the default policy's: Triton ignores priority_queue_policy then
            return cls(1, default, {}, 0, bool(batching.preserve_ordering))
        named = {level - 1: LevelPolicy.from_proto(policy) for level, policy in batching.priority_queue_policy.items()
                 if 1 <= level <= count}
        return cls(count, default, named, max(0, int(batching.default_priority_level) - 1),
                   bool(batching.preserve_ordering))

    @property
    def trivial(self) -> bool:
        """One level, no timeout, no bound: the batcher's fast path."""
        policy = self.policy(0)   # (allow_override alone changes nothing: a request may only lower a timeout)
        return self.level_count == 1 and not policy.timeout_ns and not policy.max_queue_size

    def policy(self, level: int) -> LevelPolicy:
        return self.named.get(level, self.default)

    def level_of(self, params: dict | None) -> int:
        priority = _unsigned(params, "priority")
        if priority == 0 or priority > self.level_count:
            return self.default_level
        return priority - 1

    def deadline_ns(self, level: int, arrival_ns: int, params: dict | None) -> int:
        """When a request of ``level`` has waited too long (0: never). As Triton, a request's
        ``timeout`` only shortens the policy's: it has no effect where the policy has none."""
        policy = self.policy(level)
        timeout_ns = policy.timeout_ns
        requested_us = _unsigned(params, "timeout")
        if policy.allow_override and requested_us and requested_us * 1000 < timeout_ns:
            timeout_ns = requested_us * 1000
        return arrival_ns + timeout_ns if timeout_ns else 0


def request_timeout_us(params: dict | None) -> int:
    """The request's own ``timeout`` parameter in µs (0: none); InvalidArgument when not unsigned."""
    return _unsigned(params, "timeout")


def _unsigned(params: dict | None, key: str) -> int:
    if not params or key not in params:
        return 0
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"parameter '{key}' must be an unsigned integer, got {value!r}")
    return value
