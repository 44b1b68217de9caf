"""Large outputs through an instance's answer pool (tritium/shared_pool.py), whose slots their
reader releases: over real Unix sockets from an instance's DEALER through the broker's ROUTERs
to a gateway's DEALER, and with the broker dropping, copying or resending what it holds."""

from __future__ import annotations

import gc
import logging
import os
import time

import numpy as np
import pytest

from tests.tritium.test_shared_pool import receive
from tritium.broker.ensemble import _owned
from tritium.shared_pool import SMALLEST_SLOT, AnswerSlots, hand_on, locate
from tritium.zmtp import (_MORE, _NULL_GREETING, _POOL_COMMAND, _POOLED, _REFERENCE, PoolUse, ZmtpDealer, ZmtpRouter,
                          _command, _command_frame, _Reader)


@pytest.fixture
def links(tmp_path):
    """instance DEALER -> broker backend ROUTER; broker frontend ROUTER <- gateway DEALER."""
    front = ZmtpRouter(str(tmp_path / "front"), pools=PoolUse.FORWARD)
    back = ZmtpRouter(str(tmp_path / "back"), pools=PoolUse.FORWARD)
    gateway = ZmtpDealer(str(tmp_path / "front"), b"gw", pools=PoolUse.COPY)
    instance = ZmtpDealer(str(tmp_path / "back"), b"inst", pools=PoolUse.COPY)
    sockets = [front, back, gateway, instance]
    for dealer, router, name in ((gateway, front, b"gw"), (instance, back, b"inst")):
        dealer.send_parts([b"hello"])
        assert receive(router, sockets) == [name, b"hello"]
    yield sockets
    for sock in sockets:
        sock.close()


@pytest.fixture
def second_gateway(links, tmp_path):
    """Makes another DEALER on the broker's frontend (a name, whether it reads pools), said hello."""
    def connect(name: bytes, pools: PoolUse | None) -> ZmtpDealer:
        dealer = ZmtpDealer(str(tmp_path / "front"), name, pools=pools)
        made.append(dealer)
        dealer.send_parts([b"hello"])
        assert receive(links[0], [*links, dealer]) == [name, b"hello"]
        return dealer
    made: list[ZmtpDealer] = []
    yield connect
    for dealer in made:
        dealer.close()


def marks(slots: AnswerSlots) -> list[int]:
    """The in-use mark of each slot the pool has placed a tensor in and not reclaimed."""
    return [slots.pool.pool.view[offset // SMALLEST_SLOT] for offset in sorted(slots.pool._sizes)]


def answer(slots: AnswerSlots, links, tensor: bytes) -> list:
    """The instance answers with ``tensor`` placed in its pool; what the broker reads."""
    front, back, gateway, instance = links
    instance.send_parts(slots.place([b"done", b"record", tensor]))
    return receive(back, links)


def test_large_outputs_are_placed_and_marked_and_small_ones_and_the_first_frame_are_not():
    slots = AnswerSlots(8 << 20)
    record, small, large = os.urandom(SMALLEST_SLOT), b"small", np.arange(100_000, dtype=np.float32)
    placed = slots.place([record, small, large])
    assert placed[0] is record and placed[1] is small
    assert locate(placed[2]) is not None and np.frombuffer(placed[2], np.float32).tolist() == large.tolist()
    assert marks(slots) == [1]
    assert slots.place([b"done", b"only small"]) == [b"done", b"only small"]


def test_an_answer_crosses_as_references_and_its_reader_frees_its_slot(links):
    front, back, gateway, instance = links
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(600_000)
    identity, done, record, held = answer(slots, links, tensor)
    assert identity == b"inst" and locate(held) is not None and bytes(held) == tensor   # the broker: a view
    front.send_parts([b"gw", record, held])
    del held
    received_record, received = receive(gateway, links)
    assert bytes(received_record) == b"record" and received == tensor and isinstance(received, bytearray)
    assert list(gateway._connection.reader.pools.values())[0].released_by_reader   # it came as a reference
    gc.collect()
    assert marks(slots) == [0]           # released by the gateway, which copied it out
    slots.pool.reclaim()
    assert slots.pool.in_use == 0
    for round_ in range(3):              # the slot is reused, each answer its own
        tensor = os.urandom(600_000)
        _, _, record, held = answer(slots, links, tensor)
        front.send_parts([b"gw", record, held])
        del held
        assert receive(gateway, links)[1] == tensor
        assert slots.pool.in_use == 1


def test_an_answer_the_broker_drops_is_released_when_it_lets_go_of_it(links):
    slots = AnswerSlots(8 << 20)
    held = answer(slots, links, os.urandom(300_000))[3]
    assert marks(slots) == [1]
    del held                             # the gateway it was for is gone, say
    gc.collect()
    assert marks(slots) == [0]


def test_an_answer_sent_to_a_peer_that_reads_no_pools_goes_as_bytes_and_is_released(links, second_gateway):
    front, back, gateway, instance = links
    plain = second_gateway(b"plain", None)
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    _, _, record, held = answer(slots, links, tensor)
    front.send_parts([b"plain", record, held])
    del held
    assert [bytes(part) for part in receive(plain, [*links, plain])] == [b"record", tensor]
    gc.collect()
    assert marks(slots) == [0]


def test_a_held_view_is_handed_on_once_and_its_slices_never(links):
    """Only the view the broker read may go on as a reference, and only once: a second reader
    would release the slot again, after the instance had reused it."""
    slots = AnswerSlots(8 << 20)
    held = answer(slots, links, os.urandom(300_000))[3]
    pool = locate(held)[0]
    assert hand_on(pool, held[:SMALLEST_SLOT]) is None
    claim = hand_on(pool, held)
    assert claim is not None and hand_on(pool, held) is None
    claim.detach()


def test_a_view_sent_twice_goes_once_as_a_reference_then_as_bytes(links, second_gateway):
    """The second copy leaves as bytes at once: the instance may reuse the slot as soon as the
    first reader releases it, before the second reader has read anything."""
    front, back, gateway, instance = links
    other = second_gateway(b"other", PoolUse.COPY)
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    _, _, _, held = answer(slots, links, tensor)
    front.send_parts([b"gw", held])
    front.send_parts([b"other", held])
    del held
    assert receive(gateway, links) == [tensor]
    gc.collect()
    overwritten = slots.place([b"done", bytes(300_000)])[1]   # the same slot, reclaimed
    assert bytes(overwritten) != tensor
    assert receive(other, [*links, other]) == [tensor]


def test_an_ensemble_copies_a_step_output_in_an_answer_pool_and_so_releases_it(links):
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    held = answer(slots, links, tensor)[3]
    copy = _owned(held)
    del held
    gc.collect()
    assert copy == tensor and type(copy) is bytes and marks(slots) == [0]


def test_the_reader_releases_a_slot_once_its_message_is_whole_and_never_for_one_cut_short():
    """A message cut short (its connection ended) was not written whole: its sender releases the
    slot when it lets go of the view, so the reader must not."""
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    view = slots.place([b"done", tensor])[1]
    pool, offset = locate(view)
    readers = []
    for _ in range(2):
        reader = _Reader(PoolUse.COPY)
        reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"}))
        reader.descriptors.append(os.dup(pool.fd))
        reader.feed(_command_frame(b"X-POOL", _POOL_COMMAND.pack(pool.number, pool.size, 1)))
        reader.feed(bytes((_POOLED | _MORE, _REFERENCE.size)) + _REFERENCE.pack(pool.number, offset, len(tensor)))
        readers.append(reader)
    assert marks(slots) == [1]
    readers[0].close()                      # cut short
    assert marks(slots) == [1]
    readers[1].feed(bytes((0, 3)) + b"end")
    assert [bytes(part) for part in readers[1].messages.popleft()] == [tensor, b"end"] and marks(slots) == [0]
    readers[1].close()


def test_a_full_answer_pool_sends_bytes_and_says_so_once(caplog):
    slots = AnswerSlots(4 * SMALLEST_SLOT)   # a slot for the marks, three for tensors
    with caplog.at_level(logging.WARNING):
        kept = [slots.place([b"done", bytes(SMALLEST_SLOT)])[1] for _ in range(5)]
    assert [locate(memoryview(k)) is not None if type(k) is memoryview else False for k in kept] == \
        [True, True, True, False, False]
    assert len([r for r in caplog.records if "pool for large outputs" in r.getMessage()]) == 1
    del kept
    gc.collect()                            # never sent: let go of, so released
    assert slots.place([b"done", bytes(SMALLEST_SLOT)])[1].obj is slots.pool.pool.mapping


def test_a_gateway_reads_answers_as_views_and_the_slot_is_released_when_the_last_view_goes(links, second_gateway):
    """No copy in the gateway: the answer is written to its client from the pool itself."""
    front, back, gateway, instance = links
    viewer = second_gateway(b"viewer", PoolUse.VIEW)
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    _, _, record, held = answer(slots, links, tensor)
    front.send_parts([b"viewer", record, held])
    del held
    _, received = receive(viewer, [*links, viewer])
    assert type(received) is memoryview and received.readonly and received == tensor
    part = received[1000:2000]
    del received
    gc.collect()
    assert marks(slots) == [1] and part == tensor[1000:2000]   # a slice still holds it
    del part
    gc.collect()
    assert marks(slots) == [0]


def pump(sockets, until, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.0005)
        for sock in sockets:
            sock.has_message()


def test_a_view_kept_past_the_end_of_its_pool_still_releases_its_slot(links, second_gateway, tmp_path):
    """The instance goes (the broker tells the gateway its pool ended) while the gateway still
    writes an answer of it to a client: the slot is released when that view goes, not lost."""
    front, back, gateway, instance = links
    viewer = second_gateway(b"viewer", PoolUse.VIEW)
    leaving = ZmtpDealer(str(tmp_path / "back"), b"leaving", pools=PoolUse.COPY)
    everyone = [*links, viewer, leaving]
    leaving.send_parts([b"hello"])
    assert receive(back, everyone) == [b"leaving", b"hello"]
    slots = AnswerSlots(8 << 20)
    tensor = os.urandom(300_000)
    leaving.send_parts(slots.place([b"done", b"record", tensor]))
    _, _, record, held = receive(back, everyone)
    front.send_parts([b"viewer", record, held])
    del held
    _, received = receive(viewer, everyone)
    leaving.close()
    pump([front, back, viewer], lambda: not viewer._connection.reader.pools)   # X-POOL-END read
    assert received == tensor
    del received
    gc.collect()
    assert marks(slots) == [0]


def test_a_message_cut_short_on_its_way_to_the_broker_is_released_by_its_sender_alone():
    slots = AnswerSlots(8 << 20)
    view = slots.place([b"done", os.urandom(300_000)])[1]
    pool, offset = locate(view)
    broker = _Reader(PoolUse.FORWARD)
    broker.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"DEALER"}))
    broker.descriptors.append(os.dup(pool.fd))
    broker.feed(_command_frame(b"X-POOL", _POOL_COMMAND.pack(pool.number, pool.size, 1)))
    broker.feed(bytes((_POOLED | _MORE, _REFERENCE.size)) + _REFERENCE.pack(pool.number, offset, len(view)))
    broker.close()                           # the connection ended before the rest came
    broker._parts.clear()
    gc.collect()
    assert marks(slots) == [1]               # the instance's view, not yet let go of, holds it


def test_a_retired_answer_pool_is_ended_at_the_broker(links):
    front, back, gateway, instance = links
    slots = AnswerSlots(8 << 20)
    instance.send_parts(slots.place([b"done", b"record", os.urandom(300_000)]))
    receive(back, links)
    (connection,) = back._connections.values()
    assert len(connection.reader.pools) == 1
    slots.retire()                           # a new broker process keeps the instance: a new pool
    pump(links, lambda: not connection.reader.pools)


def test_a_pool_full_for_long_is_taken_for_lost_slots_and_replaced(caplog):
    """Slots whose reader died are never released: after RENEW_AFTER_S full, a new pool, the old
    one retired (nothing of it reused)."""
    now = [0.0]
    slots = AnswerSlots(3 * SMALLEST_SLOT, clock=lambda: now[0])   # a slot for the marks, two for tensors
    lost = [slots.place([b"done", bytes(SMALLEST_SLOT)])[1] for _ in range(2)]   # never let go of
    old = slots.pool.pool
    assert type(slots.place([b"done", bytes(SMALLEST_SLOT)])[1]) is bytes   # full: bytes
    now[0] = AnswerSlots.RENEW_AFTER_S - 1
    assert type(slots.place([b"done", bytes(SMALLEST_SLOT)])[1]) is bytes   # not yet
    now[0] = AnswerSlots.RENEW_AFTER_S
    with caplog.at_level(logging.WARNING):
        renewed = slots.place([b"done", bytes(SMALLEST_SLOT)])[1]
    assert locate(renewed)[0] is slots.pool.pool is not old and old.fd is None
    assert any("full for 30 s" in record.getMessage() for record in caplog.records)
    assert slots.usage().renewals == 1   # counted, for /metrics
    assert all(bytes(view) == bytes(SMALLEST_SLOT) for view in lost)        # the old slots untouched


def test_a_new_pool_the_system_cannot_give_keeps_the_old_one_and_the_answer_goes_as_bytes(monkeypatch, caplog):
    now = [0.0]
    slots = AnswerSlots(3 * SMALLEST_SLOT, clock=lambda: now[0])
    kept = [slots.place([b"done", bytes(SMALLEST_SLOT)])[1] for _ in range(2)]
    old = slots.pool.pool
    assert type(slots.place([b"done", bytes(SMALLEST_SLOT)])[1]) is bytes
    now[0] = AnswerSlots.RENEW_AFTER_S

    def no_memfd(*args):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    with caplog.at_level(logging.WARNING):
        answer = slots.place([b"done", bytes(SMALLEST_SLOT)])[1]   # never an exception out of the instance's send
    assert type(answer) is bytes and slots.pool.pool is old and old.fd is not None and len(kept) == 2
    assert any("could not make a new pool" in record.getMessage() for record in caplog.records)
    assert slots.renew() is False and slots.pool.pool is old   # (a new broker process: the old one kept)
    assert slots.usage().renewals == 0


def test_an_answer_pools_figures_count_what_its_readers_hold_and_what_went_as_bytes(links):
    front, back, gateway, instance = links
    slots = AnswerSlots(4 * SMALLEST_SLOT)   # a slot for the marks, three for tensors
    assert tuple(slots.usage()) == (4 * SMALLEST_SLOT, 0, 0, 0)
    tensor = os.urandom(SMALLEST_SLOT + 1)   # a slot of twice the smallest size
    _, _, record, held = answer(slots, links, tensor)
    assert tuple(slots.usage()) == (4 * SMALLEST_SLOT, 2 * SMALLEST_SLOT, 0, 0)   # read by no one yet
    kept = slots.place([b"done", bytes(SMALLEST_SLOT)]), slots.place([b"done", bytes(SMALLEST_SLOT)])
    assert slots.usage().used == 3 * SMALLEST_SLOT and slots.usage().overflows == 1   # the second had no room
    front.send_parts([b"gw", record, held])
    del held, kept
    assert receive(gateway, links)[1] == tensor
    gc.collect()
    assert tuple(slots.usage()) == (4 * SMALLEST_SLOT, 0, 1, 0)   # the gateway released its slot; the others let go of


def test_an_answer_pool_that_fills_again_and_again_says_so_at_most_once_a_minute(caplog):
    now = [0.0]
    slots = AnswerSlots(2 * SMALLEST_SLOT, clock=lambda: now[0])   # a slot for the marks, one for a tensor
    with caplog.at_level(logging.WARNING):
        for _ in range(5):   # full, the reader frees the slot, full again...
            kept = slots.place([b"done", bytes(SMALLEST_SLOT)]), slots.place([b"done", bytes(SMALLEST_SLOT)])
            del kept
            gc.collect()
            now[0] += 10.0
    assert len([r for r in caplog.records if "pool for large outputs" in r.getMessage()]) == 1
    assert slots.usage().overflows == 5
