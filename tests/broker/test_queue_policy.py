"""Priority levels, queue timeouts (REJECT and DELAY) and preserve_ordering, with a fake clock."""

from __future__ import annotations

from tests.broker.scheduler_world import add_instance, done, lose, make_world, sent_batch
from tritium.errors import ErrorCode
from tritium.protocol import Infer, decode, read_record

TWO_LEVELS = """dynamic_batching {
  priority_levels: 2 default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 0 }
  priority_queue_policy { key: 2 value: { timeout_action: %s default_timeout_microseconds: 1000
                                          allow_timeout_override: true max_queue_size: 3 } }
}"""


def submit(scheduler, rid: int, **params) -> None:
    record = Infer(rid, "m", [["IN", "FP32", [1, 4], 16, False]], version=1, batch_size=1,
                   params=params).encode([b"\0" * 16])
    scheduler.submit(b"gw", record, read_record(record)[0], None)


def answers(to_gateways) -> list[tuple[int, str | None]]:
    """(rid, error message or None) of every record sent to gateways, in order."""
    found = []
    for parts in to_gateways:
        for record in parts[1:]:
            header = decode(record)[0]
            found.append((header["rid"], header.get("err", {}).get("message")))
    return found


def test_the_higher_priority_level_leaves_the_queue_first():
    registry, version, scheduler, to_instances, _, clock = make_world(TWO_LEVELS % "REJECT")
    instance = add_instance(registry, version, credit=1)
    submit(scheduler, 1)                 # runs at once
    submit(scheduler, 2)                 # default level 2
    submit(scheduler, 3, priority=2)
    submit(scheduler, 4, priority=1)
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(instance.iid, header, responses)
    assert sent_batch(to_instances[1])[2] == [4, 2, 3]


def test_a_request_that_waits_past_its_timeout_is_rejected_while_an_execution_runs():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    add_instance(registry, version, credit=1)
    submit(scheduler, 1, priority=1)     # level 1 has no timeout: runs, and keeps running
    submit(scheduler, 2)                 # level 2: 1000 us
    submit(scheduler, 3, priority=1)     # no timeout
    assert scheduler.next_deadline_ns() == clock.now + 1_000_000
    clock.now += 1_000_001
    scheduler.run_due()
    assert answers(to_gateways) == [(2, "Request timeout expired")]
    assert decode(to_gateways[0][1])[0]["err"]["code"] == ErrorCode.UNAVAILABLE
    assert version.stats.failures == {"REJECTED": 1} and len(version.batcher) == 1


def test_a_request_may_only_lower_its_timeout():
    registry, version, scheduler, _, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    add_instance(registry, version, credit=0)
    submit(scheduler, 1, timeout=100)       # lowered to 100 us
    submit(scheduler, 2, timeout=5000)      # cannot raise the 1000 us default
    clock.now += 150_000
    scheduler.run_due()
    assert answers(to_gateways) == [(1, "Request timeout expired")]
    clock.now += 1_000_000
    scheduler.run_due()
    assert answers(to_gateways)[1] == (2, "Request timeout expired")


def test_a_timeout_shorter_than_the_way_to_an_idle_instance_runs_out_before_it_runs():
    """Triton applies the queue policy when its batcher forms a batch: a 5 us timeout has run out
    by then, even with an idle instance, and the request is rejected instead of run."""
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    add_instance(registry, version, credit=2)
    read_at = clock.now

    def ticking() -> int:   # each read of the clock is 10 us after the one before
        nonlocal read_at
        read_at += 10_000
        return read_at

    scheduler._clock = ticking
    submit(scheduler, 1, timeout=5)
    submit(scheduler, 2, timeout=900)
    assert answers(to_gateways) == [(1, "Request timeout expired")]
    assert [sent_batch(parts)[2] for parts in to_instances] == [[2]]
    assert version.stats.failures == {"REJECTED": 1}


def test_a_request_retried_after_its_instance_was_lost_is_not_timed_out_again():
    """It already waited: its old timeout, passed by now, does not reject it on its second try."""
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    first = add_instance(registry, version, "i0", credit=1)
    second = add_instance(registry, version, "i1", credit=0)
    submit(scheduler, 1, timeout=100)
    assert [sent_batch(parts)[0] for parts in to_instances] == [first.iid]
    clock.now += 1_000_000
    second.credit = 1
    lose(scheduler, first.iid, "was killed", restart_expected=False)
    assert answers(to_gateways) == []
    assert [sent_batch(parts)[0] for parts in to_instances] == [first.iid, second.iid]


def test_delay_puts_a_timed_out_request_behind_those_still_in_time():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(TWO_LEVELS % "DELAY")
    instance = add_instance(registry, version, credit=1)
    submit(scheduler, 1, priority=1)
    submit(scheduler, 2)
    clock.now += 1_000_001
    scheduler.run_due()
    submit(scheduler, 3)
    assert to_gateways == []   # DELAY never rejects
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(instance.iid, header, responses)
    assert sent_batch(to_instances[1])[2] == [3, 2]


def test_each_level_has_its_own_max_queue_size():
    registry, version, scheduler, _, to_gateways, _ = make_world(TWO_LEVELS % "DELAY")
    add_instance(registry, version, credit=0)   # busy: everything queues
    for rid in range(1, 6):
        submit(scheduler, rid)
    submit(scheduler, 6, priority=1)        # level 1 is unbounded
    assert answers(to_gateways) == [(4, "[request id: <id_unknown>] Exceeds maximum queue size"),
                                  (5, "[request id: <id_unknown>] Exceeds maximum queue size")]
    assert len(version.batcher) == 4


def test_a_priority_that_is_not_an_unsigned_integer_is_refused():
    registry, version, scheduler, _, to_gateways, _ = make_world(TWO_LEVELS % "REJECT")
    add_instance(registry, version, credit=0)
    submit(scheduler, 1, priority="high")
    assert answers(to_gateways) == [(1, "parameter 'priority' must be an unsigned integer, got 'high'")]


def two_requests_on_two_instances():
    """An ordered model whose requests 1 and 2 run on instances i0 and i1; the batch of each."""
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(
        "dynamic_batching { preserve_ordering: true }")
    first = add_instance(registry, version, "i0", credit=1)
    second = add_instance(registry, version, "i1", credit=1)
    submit(scheduler, 1)
    submit(scheduler, 2)
    batches = {sent_batch(p)[0]: sent_batch(p)[1]["b"] for p in to_instances}
    return scheduler, to_instances, to_gateways, first, second, batches


def test_preserve_ordering_holds_a_later_response_until_the_earlier_one_leaves():
    scheduler, to_instances, to_gateways, first, second, batches = two_requests_on_two_instances()
    header, responses = done(batches[second.iid], [2])
    scheduler.batch_done(second.iid, header, responses)
    assert to_gateways == []
    header, responses = done(batches[first.iid], [1])
    scheduler.batch_done(first.iid, header, responses)
    assert [rid for rid, _ in answers(to_gateways)] == [1, 2]


def test_preserve_ordering_releases_what_waits_behind_a_failed_request():
    scheduler, to_instances, to_gateways, first, second, batches = two_requests_on_two_instances()
    header, responses = done(batches[second.iid], [2])
    scheduler.batch_done(second.iid, header, responses)
    lose(scheduler, first.iid, "was killed", restart_expected=False)   # 1 runs again on i1
    header, responses = done(sent_batch(to_instances[-1])[1]["b"], [1])
    scheduler.batch_done(second.iid, header, responses)
    assert [rid for rid, _ in answers(to_gateways)] == [1, 2]


def test_preserve_ordering_keeps_its_order_when_a_request_is_answered_after_its_batch_ended():
    """A model answering through its response sender after execute returned ends its batch as a
    decoupled one does (RESPONSE_PART, then BATCH_DONE with the request open); the answer still
    takes its place, and what waits behind it is released."""
    from tritium.protocol import BatchDone, Response, ResponsePart

    scheduler, to_instances, to_gateways, first, second, batches = two_requests_on_two_instances()
    header, responses = done(batches[second.iid], [2])
    scheduler.batch_done(second.iid, header, responses)
    scheduler.batch_done(first.iid, BatchDone(batches[first.iid], [], [], (1, 2, 0), [0]), [])
    assert to_gateways == []
    scheduler.streams.response_part(first.iid, ResponsePart(batches[first.iid], 0), [Response(1, []).encode()])
    assert [rid for rid, _ in answers(to_gateways)] == [1, 2]
    submit(scheduler, 3)   # the order goes on
    iid, batch, _ = sent_batch(to_instances[-1])
    header, responses = done(batch["b"], [3])
    scheduler.batch_done(iid, header, responses)
    assert [rid for rid, _ in answers(to_gateways)] == [1, 2, 3]


def test_a_model_without_instances_and_none_coming_answers_at_once():
    registry, version, scheduler, _, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    submit(scheduler, 1)
    assert answers(to_gateways) == [(1, "no instance of model 'm' version 1 is running")]


def test_passive_instances_alone_serve_nothing():
    """They are never given work: a model left with only them refuses at once, and is not ready."""
    registry, version, scheduler, _, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    active = add_instance(registry, version, "active")
    standby = add_instance(registry, version, "standby", passive=True)
    assert version.serving and version.healthy
    standby.healthy = False   # its is_ready() says no: it serves nothing anyway
    assert version.healthy
    lose(scheduler, standby.iid, "exited with status 1", restart_expected=True)   # coming back, but to serve nothing
    lose(scheduler, active.iid, "failed to initialize", restart_expected=False)
    submit(scheduler, 1)
    assert answers(to_gateways) == [(1, "no instance of model 'm' version 1 is running")]
    assert not version.serving and not version.healthy


def test_requests_wait_for_a_restarting_instance_only_so_long():
    registry, version, scheduler, _, to_gateways, clock = make_world(TWO_LEVELS % "REJECT")
    instance = add_instance(registry, version, credit=0)
    lose(scheduler, instance.iid, "exited with status 1", restart_expected=True)
    submit(scheduler, 1, priority=1)
    scheduler.fail_unserviceable()
    assert to_gateways == []
    clock.now += 41_000_000_000
    scheduler.fail_unserviceable()
    assert answers(to_gateways) == [(1, "no instance of model 'm' version 1 is running")]


def test_a_cache_hit_keeps_its_place_when_responses_are_ordered():
    from tritium.broker.response_cache import ResponseCache

    registry, version, scheduler, to_instances, to_gateways, clock = make_world(
        "dynamic_batching { preserve_ordering: true } response_cache { enable: true }")
    scheduler.cache = ResponseCache(1 << 20)
    instance = add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1)
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(instance.iid, header, responses)        # 1 runs, and is cached
    other = Infer(2, "m", [["IN", "FP32", [1, 4], 16, False]], version=1, batch_size=1,
                  params={}).encode([b"\1" * 16])
    scheduler.submit(b"gw", other, read_record(other)[0], None)      # 2 misses, and runs
    submit(scheduler, 3)                                         # 3 hits 1's answer
    assert [rid for rid, _ in answers(to_gateways)] == [1]
    header, responses = done(sent_batch(to_instances[1])[1]["b"], [2])
    scheduler.batch_done(instance.iid, header, responses)
    assert [rid for rid, _ in answers(to_gateways)] == [1, 2, 3]


def test_priority_levels_as_large_as_a_uint64_are_made_as_requests_use_them():
    """Triton makes a level's queue when a request uses it; a config with 2^64-1 levels loads and
    orders its requests by level."""
    registry, version, scheduler, to_instances, _, _ = make_world(
        "dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 1 }")
    assert version.batcher.queue_policy.level_count == 2**64 - 1
    instance = add_instance(registry, version, credit=1)
    submit(scheduler, 1)                      # runs at once
    submit(scheduler, 2, priority=2**63)
    submit(scheduler, 3, priority=7)
    submit(scheduler, 4)                      # the default level, 1
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(instance.iid, header, responses)
    assert sent_batch(to_instances[1])[2] == [4, 3, 2]


def test_a_request_timeout_has_no_effect_where_the_policy_has_none():
    """As in Triton, a request's timeout only shortens its level's default timeout."""
    registry, version, scheduler, _, to_gateways, clock = make_world(
        "dynamic_batching { default_queue_policy { allow_timeout_override: true } }")
    assert version.batcher.simple   # nothing to time out: the plain queue
    add_instance(registry, version, credit=0)
    submit(scheduler, 1, timeout=100)
    assert scheduler.next_deadline_ns() is None
    clock.now += 10_000_000
    scheduler.run_due()
    assert answers(to_gateways) == [] and len(version.batcher) == 1


def test_without_priority_levels_the_level_policies_are_ignored():
    registry, version, scheduler, _, to_gateways, _ = make_world(
        "dynamic_batching { priority_queue_policy { key: 1 value: { max_queue_size: 1 } } }")
    assert version.batcher.simple
    add_instance(registry, version, credit=0)
    for rid in range(1, 4):
        submit(scheduler, rid, priority=1)
    assert answers(to_gateways) == [] and len(version.batcher) == 3

