"""The sequence batcher, driven by a fake clock (integer ``now_ns``), against Triton's rules.

Triton's rules are those of ``sequence_batching`` (TRITON_REFERENCE.md 2.9, 4.7) as its
core implements them in ``SequenceBatchScheduler`` (direct and oldest strategies); the
error texts were checked against Triton 2.51.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.broker.sequences import END, START, SequenceBatcher, SequencePolicy
from tritium.errors import InvalidArgument

US = 1_000  # ns per microsecond
MS = 1_000_000


@dataclass(eq=False)
class Req:
    name: str
    correlation_id: int | str
    flags: int = 0
    arrival_ns: int = 0
    batch_size: int = 1
    shape_key: object = None
    rid: int = 0
    client: bytes = b"gw"
    deadline_ns: int = 0

    def __repr__(self) -> str:
        return self.name


class Instance:
    def __init__(self, name: str, room: bool = True) -> None:
        self.name, self.room = name, room

    def __repr__(self) -> str:
        return self.name


def policy(text: str, max_batch_size: int = 4) -> SequencePolicy:
    config = text_format.Parse(f'name: "m" max_batch_size: {max_batch_size} sequence_batching {{ {text} }}',
                               model_config_pb2.ModelConfig())
    return SequencePolicy.from_config(config)


def direct(slots: int = 4, **settings) -> SequenceBatcher:
    text = " ".join(f"{k}: {v}" for k, v in settings.items() if k != "idle_us")
    idle = f"max_sequence_idle_microseconds: {settings.get('idle_us', 1_000_000)}"
    return SequenceBatcher(policy(f"{idle} direct {{ {text} }}", slots))


def oldest(max_batch_size: int = 4, **settings) -> SequenceBatcher:
    preferred = settings.pop("preferred", ())
    text = " ".join(f"{k}: {v}" for k, v in settings.items())
    text += "".join(f" preferred_batch_size: {size}" for size in preferred)
    return SequenceBatcher(policy(f"oldest {{ {text} }}", max_batch_size))


def batches(b: SequenceBatcher, now_ns: int, instances) -> list[tuple[str, list[str], list[int], int]]:
    """Every batch that leaves at ``now_ns``: (instance, requests, slots, size)."""
    out = []
    while (batch := b.next_batch(now_ns, instances, lambda i: i.room)) is not None:
        out.append((batch.instance.name, [r.name for r in batch.requests], batch.slots, batch.size))
    return out


def refusal(b: SequenceBatcher, request: Req) -> str:
    with pytest.raises(InvalidArgument) as caught:
        b.enqueue(request)
    return caught.value.message


# -- Triton's refusals ---------------------------------------------------------------------

def test_requests_that_triton_refuses_get_its_texts():
    b = direct()
    assert refusal(b, Req("a", 7, START, batch_size=2)) == (
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher")
    assert refusal(b, Req("b", 0, START)) == (
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID")
    assert refusal(b, Req("c", "", START)) == (
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID")
    assert refusal(b, Req("d", 42)) == ("inference request for sequence 42 to model 'm' must specify the "
                                        "START flag on the first request of the sequence")
    assert refusal(b, Req("e", "abc", END)) == ("inference request for sequence abc to model 'm' must specify "
                                                "the START flag on the first request of the sequence")
    assert len(b) == 0


def test_after_its_end_a_sequence_takes_no_request_without_start():
    b, i0 = direct(), Instance("i0")
    b.enqueue(Req("s", 1, START | END))
    assert refusal(b, Req("x", 1)).startswith("inference request for sequence 1 ")
    assert batches(b, 0, [i0]) == [("i0", ["s"], [0], 1)]


# -- direct: slots -------------------------------------------------------------------------

def test_each_sequence_keeps_its_slot_and_a_batch_takes_one_request_per_slot_in_slot_order():
    b, i0 = direct(), Instance("i0")
    b.enqueue(Req("a1", 10, START))
    b.enqueue(Req("b1", 20, START))
    b.enqueue(Req("a2", 10))
    assert batches(b, 0, [i0]) == [("i0", ["a1", "b1"], [0, 1], 2), ("i0", ["a2"], [0], 1)]
    b.enqueue(Req("b2", 20))
    b.enqueue(Req("a3", 10, END))
    assert batches(b, 0, [i0]) == [("i0", ["a3", "b2"], [0, 1], 2)]


def test_a_batch_runs_up_to_its_highest_slot_so_the_instance_can_pad_the_gaps():
    b, i0 = direct(), Instance("i0")
    for cid in (1, 2, 3):
        b.enqueue(Req(f"s{cid}", cid, START))
    batches(b, 0, [i0])
    b.enqueue(Req("third", 3))
    assert batches(b, 0, [i0]) == [("i0", ["third"], [2], 3)]


def test_sequences_spread_over_instances_lowest_slot_first():
    b, i0, i1 = direct(slots=2), Instance("i0"), Instance("i1")
    for cid in (1, 2, 3):
        b.enqueue(Req(f"s{cid}", cid, START))
    sent = batches(b, 0, [i0, i1])
    assert sorted(sent) == [("i0", ["s1", "s3"], [0, 1], 2), ("i1", ["s2"], [0], 1)]
    b.enqueue(Req("s2b", 2, END))
    assert batches(b, 0, [i0, i1]) == [("i1", ["s2b"], [0], 1)]


def test_without_a_free_slot_a_sequence_waits_in_the_backlog_for_the_next_end():
    b, i0 = direct(slots=1), Instance("i0")
    b.enqueue(Req("a1", 1, START))
    b.enqueue(Req("b1", 2, START))
    b.enqueue(Req("b2", 2, END))
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1)]
    assert len(b) == 2
    b.enqueue(Req("a2", 1, END))
    assert batches(b, 0, [i0]) == [("i0", ["a2"], [0], 1), ("i0", ["b1"], [0], 1), ("i0", ["b2"], [0], 1)]
    assert len(b) == 0


def test_a_start_for_a_running_sequence_continues_in_its_slot(caplog):
    b, i0 = direct(), Instance("i0")
    b.enqueue(Req("a1", 5, START))
    b.enqueue(Req("b1", 6, START))
    batches(b, 0, [i0])
    b.enqueue(Req("b-again", 6, START))
    assert batches(b, 0, [i0]) == [("i0", ["b-again"], [1], 2)]
    assert "sequence 6 for model 'm' has a conflict" in caplog.text


def test_an_instance_without_room_keeps_its_requests_until_it_has_room():
    b, i0 = direct(), Instance("i0", room=False)
    b.enqueue(Req("a1", 1, START))
    assert batches(b, 0, [i0]) == []
    i0.room = True
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1)]


def test_new_sequences_go_only_to_the_instances_offered_but_bound_ones_stay():
    b, i0, i1 = direct(slots=1), Instance("i0"), Instance("i1")
    b.enqueue(Req("a1", 1, START))
    batches(b, 0, [i0])
    b.enqueue(Req("b1", 2, START))
    b.enqueue(Req("a2", 1))
    # i0 drains (it is no longer offered for new sequences) but still serves sequence 1.
    assert sorted(batches(b, 0, [i1])) == [("i0", ["a2"], [0], 1), ("i1", ["b1"], [0], 1)]


def test_heads_of_other_shapes_wait_for_a_later_batch():
    b, i0 = direct(), Instance("i0")
    b.enqueue(Req("a1", 1, START, shape_key="short"))
    b.enqueue(Req("b1", 2, START, shape_key="long"))
    b.enqueue(Req("c1", 3, START, shape_key="short"))
    assert batches(b, 0, [i0]) == [("i0", ["a1", "c1"], [0, 2], 3), ("i0", ["b1"], [1], 2)]


# -- direct: queue delay and slot utilization ----------------------------------------------

def test_with_delay_and_utilization_a_batch_waits_for_enough_slots_or_the_delay():
    b, i0 = direct(max_queue_delay_microseconds=500, minimum_slot_utilization=0.5), Instance("i0")
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    assert batches(b, 0, [i0]) == []
    assert b.deadline_ns() == 500 * US
    b.enqueue(Req("b1", 2, START, arrival_ns=100 * US))
    # Two of four slots ready: half, enough.
    assert batches(b, 100 * US, [i0]) == [("i0", ["a1", "b1"], [0, 1], 2)]
    b.enqueue(Req("a2", 1, arrival_ns=200 * US))
    assert batches(b, 699 * US, [i0]) == []
    assert batches(b, 700 * US, [i0]) == [("i0", ["a2"], [0], 1)]


def test_a_delay_without_utilization_does_not_hold_a_batch_back():
    b, i0 = direct(max_queue_delay_microseconds=500), Instance("i0")
    b.enqueue(Req("a1", 1, START))
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1)]


# -- idle sequences ------------------------------------------------------------------------

def test_an_idle_sequence_loses_its_slot_and_its_next_request_is_refused():
    b, i0 = direct(slots=1, idle_us=1000), Instance("i0")
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    b.enqueue(Req("b1", 2, START, arrival_ns=10 * US))
    # Sequence 1 got slot 0 when the batcher first ran: its idle clock starts there.
    assert batches(b, 10 * US, [i0]) == [("i0", ["a1"], [0], 1)]
    assert b.deadline_ns() == 1010 * US
    assert batches(b, 1009 * US, [i0]) == []
    # The idle limit frees slot 0 for the backlogged sequence 2 ...
    assert batches(b, 1010 * US, [i0]) == [("i0", ["b1"], [0], 1)]
    # ... and sequence 1 is unknown now.
    message = refusal(b, Req("a2", 1, arrival_ns=1011 * US))
    assert message.startswith("inference request for sequence 1 to model 'm' must specify the START flag")


def test_each_request_restarts_the_idle_clock():
    b, i0 = direct(idle_us=1000), Instance("i0")
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    b.enqueue(Req("a2", 1, arrival_ns=900 * US))
    batches(b, 900 * US, [i0])
    assert b.deadline_ns() == 1900 * US
    b.enqueue(Req("a3", 1, arrival_ns=1800 * US))
    assert batches(b, 1800 * US, [i0]) == [("i0", ["a3"], [0], 1)]


def test_an_idle_sequence_still_runs_what_it_had_queued_before_its_slot_frees():
    b, i0 = direct(slots=1, idle_us=1000), Instance("i0", room=False)
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    b.enqueue(Req("b1", 2, START, arrival_ns=0))
    assert batches(b, 0, [i0]) == []
    b.expire(5 * MS)
    i0.room = True
    assert batches(b, 5 * MS, [i0]) == [("i0", ["a1"], [0], 1), ("i0", ["b1"], [0], 1)]


def test_backlogged_sequences_do_not_age_and_an_ended_sequence_no_longer_does():
    b, i0 = direct(slots=1, idle_us=1000), Instance("i0")
    b.enqueue(Req("a1", 1, START | END, arrival_ns=0))
    b.enqueue(Req("b1", 2, START, arrival_ns=0))
    b.enqueue(Req("c1", 3, START, arrival_ns=0))
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1), ("i0", ["b1"], [0], 1)]
    # Sequence 3 waited the whole time in the backlog; its clock starts when it gets slot 0.
    assert batches(b, 5 * MS, [i0]) == [("i0", ["c1"], [0], 1)]
    b.enqueue(Req("c2", 3, arrival_ns=5 * MS + 1))
    assert batches(b, 5 * MS + 1, [i0]) == [("i0", ["c2"], [0], 1)]


def test_a_backlogged_sequence_is_rejected_whole_once_its_requests_timeout_runs_out():
    """Triton's backlog expiry: the earliest timeout of the sequence's queued requests."""
    b, i0 = direct(slots=1), Instance("i0", room=False)
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    b.enqueue(Req("b1", 2, START, arrival_ns=0, deadline_ns=3 * MS))
    b.enqueue(Req("b2", 2, arrival_ns=1 * MS, deadline_ns=2 * MS))
    b.enqueue(Req("c1", 3, START, arrival_ns=0))
    assert batches(b, 0, [i0]) == []
    assert b.deadline_ns() == 2 * MS
    assert b.expired_backlog(2 * MS - 1) == []
    assert [r.name for r in b.expired_backlog(2 * MS)] == ["b1", "b2"]
    assert len(b) == 2
    message = refusal(b, Req("b3", 2, arrival_ns=2 * MS + 1))
    assert message.startswith("inference request for sequence 2 to model 'm' must specify the START flag")
    # A timeout bounds only the wait for a slot: once its sequence is bound, a request no longer expires.
    b.enqueue(Req("a2", 1, END, arrival_ns=2 * MS))
    b.enqueue(Req("c2", 3, arrival_ns=2 * MS, deadline_ns=2 * MS + 1))
    i0.room = True
    assert batches(b, 2 * MS, [i0]) == [("i0", ["a1"], [0], 1), ("i0", ["a2"], [0], 1), ("i0", ["c1"], [0], 1),
                                        ("i0", ["c2"], [0], 1)]
    assert b.expired_backlog(3 * MS) == [] and len(b) == 0


# -- oldest ----------------------------------------------------------------------------------

def test_oldest_batches_the_oldest_heads_and_never_two_requests_of_one_sequence():
    b, i0 = oldest(max_candidate_sequences=4), Instance("i0")
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    b.enqueue(Req("a2", 1, arrival_ns=1))
    b.enqueue(Req("b1", 2, START, arrival_ns=2))
    b.enqueue(Req("c1", 3, START, arrival_ns=3))
    assert batches(b, 10, [i0]) == [("i0", ["a1", "b1", "c1"], [0, 1, 2], 3), ("i0", ["a2"], [0], 1)]


def test_oldest_waits_for_a_preferred_size_until_the_delay():
    b, i0 = oldest(max_candidate_sequences=4, preferred=(2,), max_queue_delay_microseconds=300), Instance("i0")
    b.enqueue(Req("a1", 1, START, arrival_ns=0))
    assert batches(b, 0, [i0]) == []
    assert b.deadline_ns() == 300 * US
    b.enqueue(Req("b1", 2, START, arrival_ns=100 * US))
    assert batches(b, 100 * US, [i0]) == [("i0", ["a1", "b1"], [0, 1], 2)]
    b.enqueue(Req("c1", 3, START, arrival_ns=150 * US))
    assert batches(b, 449 * US, [i0]) == []
    assert batches(b, 450 * US, [i0]) == [("i0", ["c1"], [2], 1)]


def test_oldest_candidates_are_per_instance_and_the_rest_wait_in_the_backlog():
    b, i0 = oldest(max_candidate_sequences=2), Instance("i0")
    for cid in (1, 2, 3):
        b.enqueue(Req(f"s{cid}", cid, START))
    assert batches(b, 0, [i0]) == [("i0", ["s1", "s2"], [0, 1], 2)]
    b.enqueue(Req("end1", 1, END))
    assert batches(b, 0, [i0]) == [("i0", ["end1"], [0], 1), ("i0", ["s3"], [0], 1)]


def test_oldest_without_candidates_setting_has_max_batch_size_slots():
    assert oldest(max_batch_size=3).policy.slots_per_instance == 3
    assert policy("", max_batch_size=0).slots_per_instance == 1


# -- the queue goes away ---------------------------------------------------------------------

def test_a_lost_instance_gives_back_its_sequences_queued_requests_and_forgets_them():
    b, i0, i1 = direct(slots=1), Instance("i0", room=False), Instance("i1", room=False)
    b.enqueue(Req("a1", 1, START))
    b.enqueue(Req("b1", 2, START))
    batches(b, 0, [i0, i1])
    b.enqueue(Req("a2", 1))
    lost = b.instance_lost(i0)
    assert sorted(r.name for r in lost) in (["a1", "a2"], ["b1"])
    gone = lost[0].correlation_id
    assert refusal(b, Req("later", gone)).startswith(f"inference request for sequence {gone} ")
    assert len(b) == 3 - len(lost)


def test_drain_returns_every_queued_request_in_arrival_order_and_forgets_every_sequence():
    b, i0 = direct(slots=1), Instance("i0", room=False)
    b.enqueue(Req("a1", 1, START, arrival_ns=1))
    b.enqueue(Req("b1", 2, START, arrival_ns=2))
    batches(b, 2, [i0])
    b.enqueue(Req("a2", 1, arrival_ns=3))
    assert [r.name for r in b.drain()] == ["a1", "b1", "a2"]
    assert len(b) == 0
    assert refusal(b, Req("x", 1)).startswith("inference request for sequence 1 ")


# -- a client gives up ------------------------------------------------------------------------

def test_a_cancelled_request_ends_its_sequence_its_queued_requests_cancelled_and_its_slot_freed():
    """As in Triton: the slot of a sequence whose request is cancelled is released, the rest of
    its queue cancelled, and the backlog's next sequence takes the slot."""
    b, i0 = direct(slots=1), Instance("i0")
    b.enqueue(Req("a1", 1, START, rid=1))
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1)]
    for name, rid in (("a2", 2), ("a3", 3)):
        b.enqueue(Req(name, 1, rid=rid))
    b.enqueue(Req("b1", 2, START, rid=4))
    assert [r.name for r in b.cancel(b"gw", 3)] == ["a2", "a3"]
    assert len(b) == 1
    assert refusal(b, Req("a4", 1, rid=5)).startswith("inference request for sequence 1 ")
    assert batches(b, 0, [i0]) == [("i0", ["b1"], [0], 1)]
    assert b.cancel(b"gw", 3) == [] and b.cancel(b"other", 4) == []


def test_a_cancelled_sequence_in_the_backlog_leaves_it():
    b, i0 = direct(slots=1), Instance("i0")
    b.enqueue(Req("a1", 1, START, rid=1))
    b.enqueue(Req("b1", 2, START, rid=2))
    b.enqueue(Req("b2", 2, END, rid=3))
    b.enqueue(Req("c1", 3, START | END, rid=4))
    assert [r.name for r in b.cancel(b"gw", 2)] == ["b1", "b2"]
    assert batches(b, 0, [i0]) == [("i0", ["a1"], [0], 1)]
    b.enqueue(Req("a2", 1, END, rid=5))
    assert batches(b, 0, [i0]) == [("i0", ["a2"], [0], 1), ("i0", ["c1"], [0], 1)]
    assert len(b) == 0


def test_oldest_a_cancelled_head_leaves_its_instance_s_batcher():
    b, i0 = oldest(), Instance("i0")
    b.enqueue(Req("a1", 1, START, rid=1))
    b.enqueue(Req("a2", 1, rid=2))
    b.enqueue(Req("b1", 2, START, rid=3))
    i0.room = False
    assert batches(b, 0, [i0]) == []   # both bound, their heads in i0's batcher
    assert [r.name for r in b.cancel(b"gw", 1)] == ["a1", "a2"]
    i0.room = True
    assert batches(b, 0, [i0]) == [("i0", ["b1"], [1], 1)]
    assert len(b) == 0
