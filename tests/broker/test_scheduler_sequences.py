"""The scheduler with a stateful model: slots told to instances, refusals, idle wake-ups, lost instances.

A fake clock and recorded sends, as in test_scheduler.py; the model has ``sequence_batching``.
"""

from __future__ import annotations

from tritium.broker.sequences import END, START
from tests.broker.scheduler_world import add_instance, done, error_of, lose, make_world, sent_batch
from tritium.errors import ErrorCode
from tritium.protocol import BatchDone, Cancel, Infer, Kind, Response, ResponsePart, decode, read_record

MS = 1_000_000


def world(strategy: str = "direct { }", idle_us: int = 1_000_000):
    return make_world(f"sequence_batching {{ max_sequence_idle_microseconds: {idle_us} {strategy} }}")


def submit(scheduler, rid: int, cid, flags: int = 0, batch_size: int = 1, **params) -> None:
    record = Infer(rid, "m", [["IN", "FP32", [batch_size, 4], 16 * batch_size, False]], version=1,
                   batch_size=batch_size, sequence_id=cid or None, sequence_flags=flags,
                   params=params or None).encode([b"\0" * 16 * batch_size])
    scheduler.submit(b"gw", record, read_record(record)[0], None)


def test_each_batch_tells_the_instance_the_slot_of_each_request():
    registry, version, scheduler, to_instances, to_gateways, clock = world()
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 10, START)
    submit(scheduler, 2, 20, START)
    submit(scheduler, 3, 10)
    instance, header, rids = sent_batch(to_instances[0])
    assert (instance, header["sl"], rids) == (b"i0", [0], [1])
    scheduler.batch_done(b"i0", *done(header["b"], [1]))
    instance, header, rids = sent_batch(to_instances[1])
    assert (header["sl"], rids) == ([0, 1], [3, 2])
    scheduler.batch_done(b"i0", *done(header["b"], [3, 2]))
    # A padded direct batch counts at its full width, as in Triton's batch statistics.
    assert [entry["batch_size"] for entry in version.stats.as_dict("m", 1)["batch_stats"]] == [1, 2]


def test_refused_requests_are_answered_at_once_and_not_counted():
    registry, version, scheduler, to_instances, to_gateways, clock = world()
    add_instance(registry, version, "i0")
    submit(scheduler, 1, 10)
    submit(scheduler, 2, 0, START)
    submit(scheduler, 3, 11, START, batch_size=2)
    messages = [error_of(parts)["message"] for parts in to_gateways]
    assert messages == [
        "inference request for sequence 10 to model 'm' must specify the START flag on the first request of "
        "the sequence",
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID",
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher"]
    assert all(error_of(parts)["code"] == ErrorCode.INVALID_ARG for parts in to_gateways)
    assert to_instances == [] and version.stats.fail.count == 0


def test_the_broker_wakes_up_when_a_sequence_goes_idle_and_gives_its_slot_to_the_backlog():
    registry, version, scheduler, to_instances, to_gateways, clock = world(idle_us=1000)
    add_instance(registry, version, "i0", credit=9)
    for cid in range(1, 10):   # one batch each; the model batches 8: eight slots, the ninth sequence waits
        submit(scheduler, cid, cid, START)
    assert len(to_instances) == 8 and scheduler.next_deadline_ns() == clock.now + 1000 * 1000
    clock.now += 1000 * 1000
    scheduler.run_due()
    instance, header, rids = sent_batch(to_instances[-1])
    assert (header["sl"], rids) == ([0], [9])


def test_a_sequence_waiting_for_a_slot_past_its_requests_timeout_is_rejected_with_tritons_text():
    registry, version, scheduler, to_instances, to_gateways, clock = world("direct { }", idle_us=60_000_000)
    add_instance(registry, version, "i0", credit=1)
    for cid in range(1, 9):   # the eight slots taken
        submit(scheduler, cid, cid, START)
    submit(scheduler, 9, 9, START, timeout=1000)
    submit(scheduler, 10, 9, timeout=5000)
    assert scheduler.next_deadline_ns() == clock.now + 1000 * 1000
    clock.now += 1000 * 1000
    scheduler.run_due()
    assert [(decode(parts[1])[0]["rid"], error_of(parts)) for parts in to_gateways] == [
        (rid, {"code": ErrorCode.UNAVAILABLE, "message": "timeout of the corresponding sequence has been expired"})
        for rid in (9, 10)]
    assert version.stats.failures == {"REJECTED": 2}
    submit(scheduler, 11, 9)
    assert error_of(to_gateways[-1])["message"].startswith("inference request for sequence 9 to model 'm' must "
                                                           "specify the START flag")


def test_a_lost_instance_fails_its_sequences_requests_and_they_are_not_run_elsewhere():
    registry, version, scheduler, to_instances, to_gateways, clock = world()
    add_instance(registry, version, "i0", credit=1)
    add_instance(registry, version, "i1", credit=1)
    submit(scheduler, 1, 10, START)          # i0, slot 0: running
    submit(scheduler, 2, 10)                 # queued behind it
    assert [sent_batch(p)[0] for p in to_instances] == [b"i0"]
    lose(scheduler, b"i0", "was killed by signal 9")
    assert len(to_instances) == 1
    messages = sorted((decode(p[1])[0]["rid"], error_of(p)["message"]) for p in to_gateways)
    assert messages == [(rid, "instance 'i0' of model 'm' version 1 was killed by signal 9; the state of "
                              "sequence 10 was lost with it") for rid in (1, 2)]
    assert version.stats.fail.count == 2
    submit(scheduler, 3, 10, END)
    assert error_of(to_gateways[-1])["message"].startswith("inference request for sequence 10 ")
    submit(scheduler, 4, 10, START)
    assert sent_batch(to_instances[-1])[0] == b"i1"


def test_cancelling_a_decoupled_request_still_answering_leaves_its_sequence_running():
    """Its batch executed and left the instance's in-flight batches (it answers from the model's
    threads): it is neither queued nor waiting behind another batch, so its sequence goes on."""
    registry, version, scheduler, to_instances, to_gateways, clock = world(
        "direct { } } model_transaction_policy { decoupled: true")
    add_instance(registry, version, "i0", credit=2)
    submit(scheduler, 1, 10, START)
    submit(scheduler, 2, 20, START)
    (_, first, _), (_, second, _) = (sent_batch(parts) for parts in to_instances[:2])
    scheduler.batch_done(b"i0", BatchDone(first["b"], [], [], (1, 2, 3), [0]), [])   # still answering
    scheduler.cancel(b"gw", Cancel(1, "m", 1))
    told = [decode(parts[1])[0] for parts in to_instances[2:]]
    assert [(t["k"], t["b"], t["i"]) for t in told] == [(Kind.CANCEL_RUNNING, first["b"], 0)] * 2
    submit(scheduler, 3, 10)   # no START: the sequence still runs
    assert to_gateways == [] and version.stats.failures == {}
    assert sent_batch(to_instances[-1])[2] == [3]


def test_a_cancelled_request_s_queued_siblings_are_told_their_sequence_was_cancelled():
    registry, version, scheduler, to_instances, to_gateways, clock = world()
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 10, START)   # runs
    submit(scheduler, 2, 10)
    submit(scheduler, 3, 10)          # both queued behind it
    scheduler.cancel(b"gw", Cancel(2, "m", 1))
    answers = {decode(parts[1])[0]["rid"]: error_of(parts) for parts in to_gateways}
    assert answers == {
        2: {"code": ErrorCode.CANCELLED.value, "message": "the client cancelled the request"},
        3: {"code": ErrorCode.CANCELLED.value,
            "message": "cancelled with its sequence: another request of the sequence was cancelled"}}


# -- iterative sequences: requests a model releases to run again (request rescheduling) ----------


def sequence_fields(parts: list) -> list[tuple[int, object, int]]:
    """(rid, correlation id, flags) of each request of a sent batch, as its instance reads them."""
    return [(infer.rid, infer.sequence_id, infer.sequence_flags) for infer in (read_record(p)[0] for p in parts[2:])]


def rescheduled(batch_number: int, indices: list[int], answered_rids: list[int] = ()) -> tuple[BatchDone, list]:
    oks = [True] * len(answered_rids)
    responses = [Response(rid, []).encode() for rid in answered_rids]
    return BatchDone(batch_number, oks, [0] * len(oks), (10, 20, 30), rescheduled=indices), responses


def test_an_iterative_sequence_numbers_requests_without_an_id_and_runs_a_released_one_again_in_its_slot():
    registry, version, scheduler, to_instances, to_gateways, clock = world("iterative_sequence: true direct { }")
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    submit(scheduler, 2, 0)    # its own sequence, waiting for the instance's credit
    assert sequence_fields(to_instances[0]) == [(1, 1, START)]   # Triton's numbers start at 1, with START
    scheduler.batch_done(b"i0", *rescheduled(sent_batch(to_instances[0])[1]["b"], [0]))
    assert to_gateways == []   # no answer yet: it runs again, without START, in the same slot
    instance, header, rids = sent_batch(to_instances[1])
    assert header["sl"] == [0, 1] and sequence_fields(to_instances[1]) == [(1, 1, 0), (2, 2, START)]
    scheduler.batch_done(b"i0", *rescheduled(header["b"], [1], answered_rids=[1]))
    assert [decode(p[1])[0]["rid"] for p in to_gateways] == [1]
    # Each run counts, as in Triton: request 1 ran twice, request 2 once so far.
    assert version.stats.success.count == 3 and version.stats.execution_count == 2
    # Released for good, request 1 ended its sequence; request 2 runs again alone.
    submit(scheduler, 3, 1)
    assert error_of(to_gateways[-1])["message"] == ("inference request for sequence 1 to model 'm' must specify "
                                                    "the START flag on the first request of the sequence")
    assert sent_batch(to_instances[2])[1]["sl"] == [1] and sequence_fields(to_instances[2]) == [(2, 2, 0)]


def test_a_released_request_whose_sequence_went_idle_meanwhile_gets_tritons_start_error():
    registry, version, scheduler, to_instances, to_gateways, clock = world("iterative_sequence: true direct { }",
                                                                          idle_us=1000)
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 7, START)   # a sequence id of the client's own is kept
    clock.now += 2 * MS              # the model ran longer than the idle limit
    scheduler.batch_done(b"i0", *rescheduled(sent_batch(to_instances[0])[1]["b"], [0]))
    assert error_of(to_gateways[0])["message"] == ("inference request for sequence 7 to model 'm' must specify "
                                                   "the START flag on the first request of the sequence")
    # Its one run is not counted a success: the request failed.
    assert (version.stats.success.count, version.stats.fail.count, len(to_instances)) == (0, 1, 1)


def test_a_decoupled_request_answers_from_each_run_and_its_stream_closes_with_its_last():
    registry, version, scheduler, to_instances, to_gateways, clock = world(
        "iterative_sequence: true direct { } } model_transaction_policy { decoupled: true")
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    first = sent_batch(to_instances[0])[1]["b"]
    scheduler.streams.response_part(b"i0", ResponsePart(first, 0), [Response(1, [], final=False).encode()])
    scheduler.batch_done(b"i0", BatchDone(first, [], [], (1, 2, 3), [], rescheduled=[0]), [])
    second = sent_batch(to_instances[1])[1]["b"]
    assert sequence_fields(to_instances[1]) == [(1, 1, 0)]
    scheduler.streams.response_part(b"i0", ResponsePart(second, 0), [Response(1, [], final=True).encode()])
    scheduler.batch_done(b"i0", BatchDone(second, [], [], (1, 2, 3), []), [])
    assert [decode(p[1])[0].get("final") for p in to_gateways] == [False, True]
    assert scheduler.streams.batches == {} and version.stats.success.count == 2


def test_a_request_cancelled_while_it_ran_and_released_to_run_again_is_answered_cancelled_and_frees_its_slot():
    registry, version, scheduler, to_instances, to_gateways, clock = world("iterative_sequence: true direct { }")
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    scheduler.cancel(b"gw", Cancel(1, "m", 1))   # it runs: its instance is told
    scheduler.batch_done(b"i0", *rescheduled(sent_batch(to_instances[0])[1]["b"], [0]))
    assert error_of(to_gateways[0])["code"] == ErrorCode.CANCELLED
    submit(scheduler, 2, 0)
    assert sent_batch(to_instances[-1])[1]["sl"] == [0]   # the slot of sequence 1 is free again


def test_a_batch_done_naming_requests_to_run_again_that_its_batch_does_not_hold_fails_the_batch():
    registry, version, scheduler, to_instances, to_gateways, clock = world("iterative_sequence: true direct { }")
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    number = sent_batch(to_instances[0])[1]["b"]
    scheduler.batch_done(b"i0", *rescheduled(number, [0, 0]))
    assert error_of(to_gateways[0])["message"] == (f"instance 'i0' of model 'm' version 1 answered batch {number} of "
                                                   "1 request(s) with requests to run again that it does not hold: "
                                                   "[0, 0]")
    submit(scheduler, 2, 0)
    assert sent_batch(to_instances[-1])[1]["sl"] == [0]


def test_a_model_that_is_not_iterative_releasing_a_request_to_run_again_gets_tritons_error():
    registry, version, scheduler, to_instances, to_gateways, clock = make_world("dynamic_batching { }")
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    scheduler.batch_done(b"i0", *rescheduled(sent_batch(to_instances[0])[1]["b"], [0]))
    assert error_of(to_gateways[0])["message"] == ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                                                   "while the model is not configured to handle such a flag.")
    assert version.stats.fail.count == 1 and len(to_instances) == 1


def test_a_rescheduled_decoupled_request_counts_one_first_response_from_its_first_arrival():
    registry, version, scheduler, to_instances, to_gateways, clock = world(
        "iterative_sequence: true direct { } } model_transaction_policy { decoupled: true")
    version.stats.enable_histogram((100.0, 500.0, 2000.0))
    add_instance(registry, version, "i0", credit=1)
    submit(scheduler, 1, 0)
    first = sent_batch(to_instances[0])[1]["b"]
    clock.now += 150_000_000
    scheduler.streams.response_part(b"i0", ResponsePart(first, 0), [Response(1, [], final=False).encode()])
    scheduler.batch_done(b"i0", BatchDone(first, [], [], (1, 2, 3), [], rescheduled=[0]), [])
    second = sent_batch(to_instances[1])[1]["b"]
    clock.now += 1_000_000_000
    scheduler.streams.response_part(b"i0", ResponsePart(second, 0), [Response(1, [], final=True).encode()])
    scheduler.batch_done(b"i0", BatchDone(second, [], [], (1, 2, 3), []), [])
    assert version.stats.histogram_counts == [0, 1, 0, 0] and version.stats.histogram_sum_ms == 150
