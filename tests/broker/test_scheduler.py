"""The scheduler with a fake clock and recorded sends: queueing, credit, routing, failures."""

from __future__ import annotations

import pytest

from tests.broker.scheduler_world import add_instance, done, error_of, lose, make_world, sent_batch, submit
from tritium.errors import ErrorCode, Unavailable
from tritium.protocol import BatchDone, Infer, Kind, Response, ResponsePart, decode, read_record


@pytest.fixture
def world():
    return make_world("dynamic_batching { max_queue_delay_microseconds: 100 }")


def test_unknown_model_is_answered_at_once_with_404(world):
    _, _, scheduler, to_instances, to_gateways, _ = world
    submit(scheduler, b"gw", 7, model="nope")
    assert to_instances == []
    (parts,) = to_gateways
    header = decode(parts[1])[0]
    assert parts[0] == b"gw" and header["rid"] == 7 and header["err"]["code"] == ErrorCode.NOT_FOUND


def test_requests_wait_for_the_queue_delay_then_leave_as_one_batch(world):
    registry, version, scheduler, to_instances, _, clock = world
    add_instance(registry, version)
    for rid in (1, 2, 3):
        submit(scheduler, b"gw", rid)
    assert to_instances == []  # the 100 us delay has not run out
    assert scheduler.next_deadline_ns() == clock.now + 100_000
    clock.now += 100_000
    scheduler.run_due()
    (parts,) = to_instances
    iid, header, rids = sent_batch(parts)
    assert (iid, header["k"], header["n"], rids) == (b"i0", Kind.BATCH, 3, [1, 2, 3])


def test_credit_bounds_what_an_instance_is_sent():
    registry, version, scheduler, to_instances, _, clock = make_world("")  # no dynamic batching
    instance = add_instance(registry, version, credit=2)
    for rid in range(1, 5):
        submit(scheduler, b"gw", rid)
    assert [sent_batch(p)[2] for p in to_instances] == [[1], [2]]
    assert instance.credit == 0 and len(version.batcher) == 2
    assert version.pending_requests() == 3   # request 2 waits at the instance behind request 1
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(b"i0", header, responses)
    assert [sent_batch(p)[2] for p in to_instances] == [[1], [2], [3]]


def test_results_go_back_to_each_gateway_in_one_message_and_count_in_statistics(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version)
    submit(scheduler, b"gw-a", 1, batch_size=2)
    submit(scheduler, b"gw-b", 2)
    submit(scheduler, b"gw-a", 3)
    clock.now += 100_000
    scheduler.run_due()
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1, 2, 3], oks=[True, True, False])
    clock.now += 5_000
    scheduler.batch_done(b"i0", header, responses)
    routed = {parts[0]: [decode(p)[0]["rid"] for p in parts[1:]] for parts in to_gateways}
    assert routed == {b"gw-a": [1, 3], b"gw-b": [2]}
    stats = version.stats.as_dict("m", 1)
    assert stats["inference_stats"]["success"]["count"] == 2
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_count"] == 3 and stats["execution_count"] == 1
    assert stats["batch_stats"][0]["batch_size"] == 4
    assert stats["inference_stats"]["queue"]["ns"] == 2 * 100_000


def test_a_batching_model_is_not_pipelined_so_requests_can_still_join_a_batch():
    registry, version, scheduler, to_instances, _, clock = make_world("dynamic_batching { }")
    add_instance(registry, version, credit=2)
    submit(scheduler, b"gw", 1)
    for rid in (2, 3, 4):
        submit(scheduler, b"gw", rid)
    assert [sent_batch(p)[2] for p in to_instances] == [[1]]  # the rest wait in the broker
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1], timings=(0, 5_000_000, 0))
    scheduler.batch_done(b"i0", header, responses)
    assert [sent_batch(p)[2] for p in to_instances] == [[1], [2, 3, 4]]


def run_batch(scheduler, to_instances, rids: list[int], took_ns: int) -> None:
    """Submit ``rids`` in one turn and have the instance they go to take ``took_ns`` over them."""
    with scheduler.turn():
        for rid in rids:
            submit(scheduler, b"gw", rid)
    iid, header, sent = sent_batch(to_instances[-1])
    assert sent == rids
    scheduler.batch_done(iid, *done(header["b"], rids, timings=(0, took_ns, 0)))


@pytest.mark.parametrize("alone_us, grouped_us, shared", [
    (600, 600, True),     # each request runs in turn (one BLS call after another): two instances at once
    (600, 400, True),     # a third faster in a batch (the CPUs less busy), not from batching
    (600, 250, False),    # under half the time per request in a batch: batching pays
    (100, 100, False),    # too light: a second batch would cost more than it saves
])
def test_a_turns_requests_are_shared_among_idle_instances_when_batching_saves_nothing(alone_us, grouped_us, shared):
    registry, version, scheduler, to_instances, _, _ = make_world("dynamic_batching { }")
    add_instance(registry, version, "i0")
    add_instance(registry, version, "i1")
    run_batch(scheduler, to_instances, [1], alone_us * 1000)            # the time of a request alone
    run_batch(scheduler, to_instances, [2, 3], 2 * grouped_us * 1000)   # and in a batch (both idle: not shared yet)
    to_instances.clear()
    with scheduler.turn():
        for rid in (4, 5, 6, 7):
            submit(scheduler, b"gw", rid)
    batches = [(sent_batch(p)[0], sent_batch(p)[2]) for p in to_instances]
    if shared:
        assert sorted(batches) == [(b"i0", [6, 7]), (b"i1", [4, 5])] or sorted(batches) == [(b"i0", [4, 5]), (b"i1", [6, 7])]
    else:
        assert len(batches) == 1 and batches[0][1] == [4, 5, 6, 7]


def test_requests_are_not_shared_with_a_busy_instance():
    registry, version, scheduler, to_instances, _, _ = make_world("dynamic_batching { }")
    add_instance(registry, version, "i0", credit=1)
    add_instance(registry, version, "i1", credit=1)
    run_batch(scheduler, to_instances, [1], 600_000)
    run_batch(scheduler, to_instances, [2, 3], 1_200_000)
    with scheduler.turn():
        submit(scheduler, b"gw", 4)   # one instance busy with it
    to_instances.clear()
    with scheduler.turn():
        for rid in (5, 6, 7):
            submit(scheduler, b"gw", rid)
    assert [sent_batch(p)[2] for p in to_instances] == [[5, 6, 7]]   # all to the one idle instance


def submit_and_wait_out_the_delay(scheduler, clock, rid: int) -> None:
    submit(scheduler, b"gw", rid)
    clock.now += 100_000
    scheduler.run_due()


def test_a_lost_instances_request_runs_again_on_another_instance(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version, "i0", credit=1)
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    add_instance(registry, version, "i1", credit=1)
    lose(scheduler, b"i0", "was killed by signal 9")
    assert to_gateways == []
    assert [(sent_batch(p)[0], sent_batch(p)[2]) for p in to_instances] == [(b"i0", [1]), (b"i1", [1])]
    assert version.instances == [registry.instances[b"i1"]] and b"i0" not in registry.instances


def test_a_request_lost_twice_fails_with_503_naming_the_model(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version, "i0")
    add_instance(registry, version, "i1")
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    first = sent_batch(to_instances[0])[0]
    lose(scheduler, first, "was killed by signal 9")
    second = sent_batch(to_instances[1])[0]
    assert second != first
    lose(scheduler, second, "was killed by signal 9")
    (parts,) = to_gateways
    error = error_of(parts)
    assert error["code"] == ErrorCode.UNAVAILABLE
    assert error["message"] == (f"instance '{second.decode()}' of model 'm' version 1 was killed by signal 9 "
                                "while running this request")
    assert version.stats.as_dict("m", 1)["inference_stats"]["fail"]["count"] == 1
    assert version.stats.failures == {"BACKEND": 1}   # as Triton counts a request whose stub died


def test_a_request_waits_for_a_restarting_instance_when_it_was_the_only_one(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version, "i0")
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    lose(scheduler, b"i0", "exited with status 1")   # its agent restarts it
    assert to_gateways == [] and len(version.batcher) == 1
    scheduler.instance_ready(add_instance(registry, version, "i0-again"))
    assert sent_batch(to_instances[-1])[:3:2] == (b"i0-again", [1])


def test_when_the_last_host_is_gone_queued_and_running_requests_fail_at_once(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version, "i0", credit=1)
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    submit(scheduler, b"gw", 2)   # queued behind the busy instance
    lose(scheduler, b"i0", "was lost with its host h1", restart_expected=False)
    errors = sorted((decode(p[1])[0]["rid"], error_of(p)["message"]) for p in to_gateways)
    assert [rid for rid, _ in errors] == [1, 2]
    assert all(message == "no instance of model 'm' version 1 is left: instance 'i0' was lost with its host h1"
               for _, message in errors)
    assert len(version.batcher) == 0


def test_a_decoupled_request_that_already_answered_is_not_run_twice():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world("")
    add_instance(registry, version, "i0")
    add_instance(registry, version, "i1")
    submit(scheduler, b"gw", 1)
    number = sent_batch(to_instances[0])[1]["b"]
    scheduler.streams.response_part(b"i0", ResponsePart(number, 0), [Response(1, [], final=False).encode()])
    lose(scheduler, b"i0", "was killed by signal 9")
    assert len(to_instances) == 1
    assert [error_of(p)["code"] for p in to_gateways[1:]] == [ErrorCode.UNAVAILABLE]


def test_a_full_queue_rejects_with_tritons_message():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(
        "dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    add_instance(registry, version, credit=0)
    for rid in (1, 2, 3):
        submit(scheduler, b"gw", rid)
    (parts,) = to_gateways
    assert decode(parts[1])[0]["rid"] == 3
    assert error_of(parts) == {"code": ErrorCode.UNAVAILABLE, "message": "[request id: <id_unknown>] Exceeds maximum queue size"}
    assert len(version.batcher) == 2
    # Refused before it entered the queue: Triton's statistics and failure metric do not count it.
    assert version.stats.failures == {} and version.stats.fail.count == 0
    submit(scheduler, b"gw", 4, request_id="r4")
    assert error_of(to_gateways[1])["message"] == "[request id: r4] Exceeds maximum queue size"


def test_a_draining_instance_gets_no_new_batch_and_the_broker_can_tell_when_it_is_idle(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    draining = add_instance(registry, version, "i0")
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    draining.draining = True
    assert scheduler.holds_work([draining])
    submit(scheduler, b"gw", 2)
    clock.now += 100_000
    scheduler.run_due()
    assert len(to_instances) == 1 and len(version.batcher) == 1
    header, responses = done(sent_batch(to_instances[0])[1]["b"], [1])
    scheduler.batch_done(b"i0", header, responses)
    assert not scheduler.holds_work([draining]) and not scheduler.idle()
    scheduler.instance_ready(add_instance(registry, version, "i1"))
    assert sent_batch(to_instances[-1])[:3:2] == (b"i1", [2])


def test_fail_everything_answers_queued_running_and_streaming_requests_once(world):
    registry, version, scheduler, to_instances, to_gateways, clock = world
    add_instance(registry, version, "i0", credit=1)
    submit_and_wait_out_the_delay(scheduler, clock, 1)
    submit(scheduler, b"gw", 2)
    scheduler.fail_everything(Unavailable("shutting down"))
    assert sorted(decode(p[1])[0]["rid"] for p in to_gateways) == [1, 2]
    assert scheduler.idle()


def test_the_first_response_histogram_counts_a_decoupled_request_at_its_first_response_in_whole_ms():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(
        "model_transaction_policy { decoupled: true }")
    version.stats.enable_histogram((100.0, 500.0, 2000.0))
    add_instance(registry, version, "i0")
    submit(scheduler, b"gw", 1)
    number = sent_batch(to_instances[0])[1]["b"]
    clock.now += 1_000_999_999     # 1,000.999999 ms after arrival
    scheduler.streams.response_part(b"i0", ResponsePart(number, 0), [Response(1, [], final=False).encode()])
    clock.now += 2_000_000_000
    scheduler.streams.response_part(b"i0", ResponsePart(number, 0), [Response(1, [], final=True).encode()])
    assert version.stats.histogram_counts == [0, 0, 1, 0] and version.stats.histogram_sum_ms == 1000
    scheduler.batch_done(b"i0", BatchDone(number, [], [], (5, 3_000_000_000, 7), still_open=[]), [])
    assert version.stats.success.count == 1


def answered_while_executing(wait_ns: int = 0):
    """A decoupled model's one request, its batch sent to instance i0 and its final response given
    ``wait_ns`` after, while the batch still executes: (version, scheduler, gateway messages, batch number)."""
    registry, version, scheduler, to_instances, to_gateways, clock = make_world(
        "model_transaction_policy { decoupled: true }")
    add_instance(registry, version, "i0")
    submit(scheduler, b"gw", 1)
    number = sent_batch(to_instances[0])[1]["b"]
    clock.now += wait_ns
    scheduler.streams.response_part(b"i0", ResponsePart(number, 0), [Response(1, [], final=True).encode()])
    return version, scheduler, to_gateways, number


def test_a_decoupled_request_answered_while_its_batch_executes_counts_the_batch_s_compute_times():
    """Its final response leaves before the instance says how long the batch took: the request is
    counted once it does, with those times, as Triton counts a request's compute times."""
    version, scheduler, _, number = answered_while_executing(300_000_000)
    assert version.stats.success.count == 0   # not yet: the batch's times are not known
    scheduler.batch_done(b"i0", BatchDone(number, [], [], (11, 300_000_000, 13), still_open=[]), [])
    stats = version.stats
    assert (stats.success.count, stats.success.ns) == (1, 300_000_000)
    assert [(d.count, d.ns) for d in (stats.compute_input, stats.compute_infer, stats.compute_output)] == \
        [(1, 11), (1, 300_000_000), (1, 13)]


def test_a_decoupled_request_answered_before_its_execute_raised_counts_as_failed_as_in_triton():
    version, scheduler, to_gateways, number = answered_while_executing()
    scheduler.batch_done(b"i0", BatchDone(number, [], [], (1, 2, 3), still_open=[], raised=True), [])
    stats = version.stats
    assert (stats.success.count, stats.failures, stats.execution_count) == (0, {"BACKEND": 1}, 0)
    assert len(to_gateways) == 1   # its answer went out as it was


@pytest.mark.parametrize("ending", ["unreadable BATCH_DONE", "instance lost", "broker exiting"])
def test_a_decoupled_request_answered_while_its_batch_executes_counts_however_the_batch_ends(ending):
    version, scheduler, to_gateways, number = answered_while_executing()
    if ending == "unreadable BATCH_DONE":
        scheduler.batch_unreadable(b"i0", number, "truncated")
    elif ending == "instance lost":
        lose(scheduler, b"i0", "exited")
    else:
        scheduler.fail_everything(Unavailable("the broker is stopping"))
    assert (version.stats.success.count, version.stats.failures) == (1, {})   # answered once, counted once
    assert len(to_gateways) == 1


RAGGED = """backend: "python"
input [ { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""


def submit_ragged(scheduler, rid: int, length: int) -> None:
    record = Infer(rid, "m", [["IN", "FP32", [1, 4], 16, False], ["R", "FP32", [1, length], 4 * length, False]],
                   version=1, batch_size=1).encode([b"\0" * 16, b"\0" * 4 * length])
    scheduler.submit(b"gw", record, read_record(record)[0], None)


@pytest.mark.parametrize("backend, batches", [("python", [[1, 2, 3]]), ("onnxruntime", [[1], [2], [3]])])
def test_requests_whose_ragged_inputs_differ_share_a_batch_of_a_python_model(backend, batches):
    """allow_ragged_batch: a Python model gets each request's own arrays, so shapes need not match (as
    in Triton); a stacking backend, which would need Triton's batch_input, batches equal shapes only."""
    registry, version, scheduler, to_instances, _, clock = make_world(RAGGED.replace("python", backend))
    for name in ("i0", "i1", "i2"):
        add_instance(registry, version, name, credit=1)
    for rid, length in [(1, 16), (2, 8), (3, 4)]:
        submit_ragged(scheduler, rid, length)
    for _ in range(3):
        clock.now += 2_000_000
        scheduler.run_due()
    assert [sent_batch(parts)[2] for parts in to_instances] == batches
