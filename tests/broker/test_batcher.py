"""The dynamic batcher, driven by a fake clock (integer ``now_ns``), against Triton's rules.

Triton's rules are those of ``dynamic_batching`` (TRITON_REFERENCE.md 4.6) as its core
implements them in ``DynamicBatchScheduler::GetDynamicBatch``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.broker.batcher import BatchingPolicy, DynamicBatcher

US = 1_000  # ns per microsecond


@dataclass(eq=False)
class Req:
    """A queued request as the batcher sees it; identity, not value, tells two apart."""

    name: str
    batch_size: int = 1
    shape_key: object = None
    arrival_ns: int = 0
    level: int = 0
    deadline_ns: int = 0
    delayed: bool = False
    queued: bool = False

    def __repr__(self) -> str:
        return self.name


def batcher(max_batch_size: int = 8, preferred=(), delay_us: int = 0, enabled: bool = True):
    return DynamicBatcher(BatchingPolicy(enabled=enabled, max_batch_size=max_batch_size,
                                         preferred_batch_sizes=tuple(preferred),
                                         max_queue_delay_us=delay_us))


def fill(b: DynamicBatcher, *requests: Req) -> list[Req]:
    for request in requests:
        b.enqueue(request)
    return list(requests)


def names(batch) -> list[str] | None:
    return None if batch is None else [r.name for r in batch]


def drain_batches(b: DynamicBatcher, now_ns: int) -> list[list[str]]:
    """Every batch that leaves at ``now_ns``, in order, until the batcher waits or is empty."""
    out = []
    while (batch := b.next_batch(now_ns)) is not None:
        out.append(names(batch))
    return out


def ones(count: int, prefix: str = "r", arrival_ns: int = 0, shape_key=None) -> list[Req]:
    return [Req(f"{prefix}{i}", 1, shape_key, arrival_ns) for i in range(count)]


# -- disabled batching ---------------------------------------------------------------------

def test_disabled_batching_sends_one_request_per_batch_in_fifo_order():
    b = batcher(max_batch_size=8, enabled=False, delay_us=1000)
    fill(b, *ones(3))
    assert len(b) == 3
    assert drain_batches(b, 0) == [["r0"], ["r1"], ["r2"]]
    assert len(b) == 0
    assert b.next_batch(0) is None


def test_disabled_batching_ignores_delay_and_preferred_sizes():
    b = batcher(max_batch_size=8, preferred=(4,), delay_us=1000, enabled=False)
    fill(b, *ones(4))
    assert b.deadline_ns() is None
    assert names(b.next_batch(0)) == ["r0"]
    assert len(b) == 3


def test_empty_batcher_has_nothing_to_send_and_no_deadline():
    b = batcher(delay_us=100)
    assert b.next_batch(10**12) is None
    assert b.deadline_ns() is None
    assert len(b) == 0


# -- max_batch_size ---------------------------------------------------------------------

def test_max_batch_size_counts_the_sum_of_request_batch_sizes():
    b = batcher(max_batch_size=4)
    fill(b, Req("a", 1), Req("b", 2), Req("c", 1), Req("d", 1))
    first = b.next_batch(0)
    assert names(first) == ["a", "b", "c"]
    assert sum(r.batch_size for r in first) == 4
    assert names(b.next_batch(0)) == ["d"]
    assert b.next_batch(0) is None


def test_a_request_that_does_not_fit_starts_the_next_batch_and_is_never_split():
    b = batcher(max_batch_size=4, delay_us=1000)
    fill(b, Req("a", 3), Req("b", 2))
    # "a" cannot grow (b does not fit): it leaves at once, even with a queue delay.
    assert names(b.next_batch(0)) == ["a"]
    assert len(b) == 1
    # "b" alone (2 of 4) could still grow: it waits for the delay.
    assert b.next_batch(0) is None
    assert names(b.next_batch(1000 * US)) == ["b"]


def test_many_requests_leave_in_batches_of_at_most_max_batch_size():
    b = batcher(max_batch_size=4)
    fill(b, *ones(10))
    assert drain_batches(b, 0) == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"], ["r8", "r9"]]


def test_a_head_request_bigger_than_max_batch_size_goes_alone():
    b = batcher(max_batch_size=4, delay_us=1000)
    fill(b, Req("big", 6), Req("small", 1))
    assert names(b.next_batch(0)) == ["big"]
    assert names(b.next_batch(1000 * US)) == ["small"]


def test_a_lone_head_request_bigger_than_max_batch_size_leaves_without_waiting():
    b = batcher(max_batch_size=4, delay_us=1000)
    fill(b, Req("big", 6))
    assert names(b.next_batch(0)) == ["big"]


def test_a_full_batch_leaves_at_once_even_with_a_delay():
    b = batcher(max_batch_size=4, delay_us=1000)
    fill(b, *ones(4))
    assert names(b.next_batch(0)) == ["r0", "r1", "r2", "r3"]


# -- preferred_batch_size ------------------------------------------------------------------

def test_the_largest_formable_preferred_size_leaves_at_once():
    b = batcher(max_batch_size=8, preferred=(2, 4), delay_us=1000)
    fill(b, *ones(5))
    assert names(b.next_batch(0)) == ["r0", "r1", "r2", "r3"]
    # One left: no preferred size can be formed, so it waits for the delay.
    assert b.next_batch(0) is None
    assert len(b) == 1


def test_a_smaller_preferred_size_is_used_when_the_larger_cannot_be_formed():
    b = batcher(max_batch_size=8, preferred=(2, 4), delay_us=1000)
    fill(b, *ones(3))
    assert names(b.next_batch(0)) == ["r0", "r1"]
    assert b.next_batch(0) is None


def test_preferred_sizes_count_request_batch_sizes():
    b = batcher(max_batch_size=8, preferred=(3, 6), delay_us=1000)
    fill(b, Req("a", 1), Req("b", 2), Req("c", 2))
    # 1, 3 (preferred), 5: the batch of size 3 leaves.
    assert names(b.next_batch(0)) == ["a", "b"]


def test_a_preferred_size_wins_over_a_full_max_batch_size():
    # Triton: the largest preferred size is where a batch stops growing; with
    # preferred [4] and max 8, eight queued requests leave as two batches of 4.
    b = batcher(max_batch_size=8, preferred=(4,))
    fill(b, *ones(10))
    assert drain_batches(b, 0) == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"], ["r8", "r9"]]


def test_a_preferred_size_wins_when_the_queue_exactly_fills_max_batch_size():
    b = batcher(max_batch_size=8, preferred=(4,), delay_us=1000)
    fill(b, *ones(8))
    assert names(b.next_batch(0)) == ["r0", "r1", "r2", "r3"]
    assert names(b.next_batch(0)) == ["r4", "r5", "r6", "r7"]


def test_with_no_delay_a_preferred_size_still_leaves_first():
    b = batcher(max_batch_size=8, preferred=(4,), delay_us=0)
    fill(b, *ones(6))
    assert drain_batches(b, 0) == [["r0", "r1", "r2", "r3"], ["r4", "r5"]]


def test_once_the_delay_is_exceeded_everything_that_fits_leaves():
    # Triton sends the preferred batch only while the oldest request is within the delay;
    # past it, the whole pending batch (up to max_batch_size) goes.
    b = batcher(max_batch_size=8, preferred=(4,), delay_us=100)
    fill(b, *ones(6))
    assert names(b.next_batch(100 * US)) == ["r0", "r1", "r2", "r3", "r4", "r5"]


def test_passing_the_largest_preferred_size_marks_the_batch_before_it():
    # preferred [4]: 3 + 3 would pass 4, so the batch stops at the first request
    # (Triton's MarkCursor at max_preferred_batch_size_), without waiting.
    b = batcher(max_batch_size=8, preferred=(4,), delay_us=1000)
    fill(b, Req("a", 3), Req("b", 3))
    assert names(b.next_batch(0)) == ["a"]
    assert b.next_batch(0) is None
    assert names(b.next_batch(1000 * US)) == ["b"]


# -- max_queue_delay_microseconds -------------------------------------------------------------

def test_with_a_delay_the_batcher_waits_for_the_oldest_request():
    b = batcher(max_batch_size=8, delay_us=100)
    a, c = fill(b, Req("a", arrival_ns=1_000), Req("c", arrival_ns=50_000))
    assert b.deadline_ns() == 1_000 + 100 * US
    assert b.next_batch(1_000) is None
    assert b.next_batch(1_000 + 100 * US - 1) is None
    assert len(b) == 2
    batch = b.next_batch(1_000 + 100 * US)
    assert batch == [a, c]
    assert len(b) == 0
    assert b.deadline_ns() is None


def test_the_deadline_follows_the_new_oldest_request():
    b = batcher(max_batch_size=2, delay_us=100)
    fill(b, Req("a", arrival_ns=0), Req("b", arrival_ns=10), Req("c", arrival_ns=70_000))
    assert names(b.next_batch(0)) == ["a", "b"]        # full: leaves at once
    assert b.deadline_ns() == 70_000 + 100 * US         # now "c" is the oldest
    assert b.next_batch(100 * US) is None
    assert names(b.next_batch(170_000)) == ["c"]


def test_requests_arriving_during_the_wait_join_the_batch():
    b = batcher(max_batch_size=8, delay_us=100)
    fill(b, Req("a", arrival_ns=0))
    assert b.next_batch(10 * US) is None
    fill(b, Req("b", arrival_ns=20 * US), Req("c", arrival_ns=90 * US))
    assert b.next_batch(99 * US) is None
    assert names(b.next_batch(100 * US)) == ["a", "b", "c"]


def test_without_delay_the_largest_batch_leaves_at_once():
    b = batcher(max_batch_size=8, delay_us=0)
    fill(b, *ones(3))
    assert b.deadline_ns() is None
    assert names(b.next_batch(0)) == ["r0", "r1", "r2"]


def test_a_share_caps_the_batch_at_that_many_requests():
    b = batcher(max_batch_size=8, delay_us=0)
    fill(b, *ones(5))
    assert names(b.next_batch(0, share=3)) == ["r0", "r1", "r2"]
    assert names(b.next_batch(0, share=3)) == ["r3", "r4"]


def test_only_a_batcher_that_takes_what_is_queued_may_share_it_out():
    assert batcher(max_batch_size=8).spreads
    assert batcher(max_batch_size=8, preferred=(8,)).spreads   # auto-complete's preferred size
    assert not batcher(max_batch_size=8, preferred=(4, 8)).spreads
    assert not batcher(max_batch_size=8, delay_us=100).spreads
    assert not batcher(max_batch_size=8, enabled=False).spreads


def test_the_deadline_is_reported_only_when_batching_waits_on_time():
    assert batcher(delay_us=0).deadline_ns() is None
    nodelay = batcher(delay_us=0)
    fill(nodelay, Req("a", arrival_ns=5))
    assert nodelay.deadline_ns() is None
    disabled = batcher(delay_us=100, enabled=False)
    fill(disabled, Req("a", arrival_ns=5))
    assert disabled.deadline_ns() is None
    delayed = batcher(delay_us=100)
    fill(delayed, Req("a", arrival_ns=5))
    assert delayed.deadline_ns() == 5 + 100 * US


# -- shapes --------------------------------------------------------------------------------

def test_requests_with_other_shapes_are_never_batched_together():
    b = batcher(max_batch_size=8, delay_us=1000)
    fill(b, Req("a1", shape_key="A"), Req("a2", shape_key="A"), Req("b1", shape_key="B"),
         Req("a3", shape_key="A"))
    # The A run cannot grow past b1 (arrival order is kept): it leaves at once.
    assert names(b.next_batch(0)) == ["a1", "a2"]
    # b1 cannot grow past a3 either.
    assert names(b.next_batch(0)) == ["b1"]
    # a3 alone can grow: it waits.
    assert b.next_batch(0) is None
    assert names(b.next_batch(1000 * US)) == ["a3"]


def test_every_batch_holds_a_single_shape():
    b = batcher(max_batch_size=8)
    keys = ["A", "A", "B", "B", "B", "A", "C"]
    fill(b, *[Req(f"{k}{i}", shape_key=k) for i, k in enumerate(keys)])
    batches = []
    while (batch := b.next_batch(0)) is not None:
        batches.append(batch)
        assert len({r.shape_key for r in batch}) == 1
    assert [[r.name for r in batch] for batch in batches] == [
        ["A0", "A1"], ["B2", "B3", "B4"], ["A5"], ["C6"]]


def test_tuple_shape_keys_compare_by_value():
    b = batcher(max_batch_size=8)
    fill(b, Req("a", shape_key=(("X", (3,)),)), Req("b", shape_key=(("X", (3,)),)),
         Req("c", shape_key=(("X", (4,)),)))
    assert names(b.next_batch(0)) == ["a", "b"]


# -- drain and remove ----------------------------------------------------------------------

def test_drain_returns_everything_in_order_and_empties_the_queue():
    b = batcher(delay_us=100)
    queued = fill(b, *ones(3))
    assert b.drain() == queued
    assert len(b) == 0
    assert b.next_batch(10**12) is None
    assert b.deadline_ns() is None
    assert b.drain() == []


def test_remove_takes_one_request_out_of_the_queue():
    b = batcher(max_batch_size=8)
    r0, r1, r2 = fill(b, *ones(3))
    assert b.remove(r1) is True
    assert len(b) == 2
    assert b.remove(r1) is False
    assert b.remove(Req("stranger")) is False
    assert b.next_batch(0) == [r0, r2]


def test_removing_the_oldest_request_moves_the_deadline():
    b = batcher(delay_us=100)
    first, second = fill(b, Req("a", arrival_ns=0), Req("b", arrival_ns=30 * US))
    assert b.remove(first)
    assert b.deadline_ns() == 130 * US
    assert b.next_batch(100 * US) is None
    assert b.next_batch(130 * US) == [second]


# -- BatchingPolicy.from_config ------------------------------------------------------------

def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_policy_from_a_config_with_dynamic_batching():
    policy = BatchingPolicy.from_config(config("""
        name: "m" max_batch_size: 16
        dynamic_batching { preferred_batch_size: [ 8, 4, 8 ] max_queue_delay_microseconds: 250 }
    """))
    assert policy == BatchingPolicy(enabled=True, max_batch_size=16, preferred_batch_sizes=(4, 8),
                                    max_queue_delay_us=250)


def test_policy_from_an_empty_dynamic_batching_block():
    policy = BatchingPolicy.from_config(config('name: "m" max_batch_size: 4 dynamic_batching { }'))
    assert policy.enabled is True
    assert policy.max_batch_size == 4
    assert policy.preferred_batch_sizes == ()
    assert policy.max_queue_delay_us == 0


def test_policy_without_dynamic_batching_is_one_request_per_batch():
    policy = BatchingPolicy.from_config(config('name: "m" max_batch_size: 8'))
    assert policy.enabled is False
    assert policy.max_batch_size == 8
    b = DynamicBatcher(policy)
    fill(b, *ones(2))
    assert drain_batches(b, 0) == [["r0"], ["r1"]]


def test_policy_with_max_batch_size_0_disables_batching_even_with_dynamic_batching():
    policy = BatchingPolicy.from_config(config(
        'name: "m" max_batch_size: 0 dynamic_batching { max_queue_delay_microseconds: 100 }'))
    assert policy.enabled is False
    assert policy.max_batch_size == 1
    b = DynamicBatcher(policy)
    fill(b, *ones(2))
    assert b.deadline_ns() is None
    assert names(b.next_batch(0)) == ["r0"]


def test_a_policy_from_a_normalized_config_batches_as_the_raw_one():
    # Triton normalizes an empty preferred_batch_size to [max_batch_size].
    raw = DynamicBatcher(BatchingPolicy.from_config(config(
        'name: "m" max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 100 }')))
    normalized = DynamicBatcher(BatchingPolicy.from_config(config(
        'name: "m" max_batch_size: 4 dynamic_batching { preferred_batch_size: 4 '
        'max_queue_delay_microseconds: 100 }')))
    for b in (raw, normalized):
        fill(b, *ones(6))
        assert drain_batches(b, 0) == [["r0", "r1", "r2", "r3"]]
        assert drain_batches(b, 100 * US) == [["r4", "r5"]]


@pytest.mark.parametrize("max_batch_size,preferred,delay_us,sizes", [
    (8, (), 0, [1, 2, 3, 1, 1, 4, 2]),
    (8, (2, 4), 0, [1] * 11),
    (4, (), 500, [1, 3, 2, 2, 1]),
    (16, (4, 8), 100, [2, 2, 5, 1, 3, 3, 8, 1]),
])
def test_every_request_leaves_exactly_once_in_order(max_batch_size, preferred, delay_us, sizes):
    b = batcher(max_batch_size=max_batch_size, preferred=preferred, delay_us=delay_us)
    queued = fill(b, *[Req(f"r{i}", s) for i, s in enumerate(sizes)])
    sent = []
    now = 0
    while len(b):
        batch = b.next_batch(now)
        if batch is None:
            now = b.deadline_ns()
            continue
        assert sum(r.batch_size for r in batch) <= max_batch_size
        sent.extend(batch)
    assert sent == queued
