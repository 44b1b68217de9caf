"""Large tensors through a shared pool (tritium/shared_pool.py) on the ZMTP links, over real Unix sockets:
a gateway's DEALER, the broker's ROUTERs, an instance's DEALER, and peers that do not read pools."""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import time

import numpy as np
import pytest
import zmq

from tests.tritium.test_zmtp import libzmq_dealer
from tritium.broker.ensemble import _owned
from tritium.shared_pool import SMALLEST_SLOT, RequestSlots, SharedPool, locate, request_slots
from tritium.zmtp import (_NULL_GREETING, PoolUse, ZmtpDealer, ZmtpError, ZmtpRouter, _command, _Connection, _Reader,
                          encode)


@pytest.fixture
def links(tmp_path):
    """gateway DEALER -> broker frontend ROUTER; broker backend ROUTER <- instance DEALER."""
    front = ZmtpRouter(str(tmp_path / "front"), pools=PoolUse.FORWARD)
    back = ZmtpRouter(str(tmp_path / "back"), pools=PoolUse.FORWARD)
    gateway = ZmtpDealer(str(tmp_path / "front"), b"gw")
    instance = ZmtpDealer(str(tmp_path / "back"), b"inst", pools=PoolUse.COPY)
    sockets = [front, back, gateway, instance]
    yield sockets
    for sock in sockets:
        sock.close()


def receive(sock, others, timeout_s: float = 5.0) -> list:
    """The next message of ``sock``, moving ``others`` meanwhile (these sockets move only when called)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.0005)
        for other in others:
            other.has_message()
        if isinstance(sock, zmq.Socket):
            if sock.poll(1):
                return sock.recv_multipart()
        elif sock.has_message():
            return sock.recv_parts()
    raise TimeoutError("no message")


def said_hello(links) -> None:
    front, back, gateway, instance = links
    instance.send_parts([b"hello"])
    assert receive(back, links) == [b"inst", b"hello"]


def test_a_pool_places_copies_in_slots_of_a_power_of_two_and_reuses_freed_ones():
    pool = SharedPool(4 * SMALLEST_SLOT)
    data = os.urandom(SMALLEST_SLOT + 1)                  # a slot of twice the smallest size
    view, first = pool.place(data)
    assert bytes(view) == data and locate(view) == (pool.pool, first)
    small, second = pool.place(np.arange(10, dtype=np.float32))   # any buffer, any format
    assert np.frombuffer(small, np.float32).tolist() == list(range(10)) and second == 2 * SMALLEST_SLOT
    assert pool.place(bytes(2 * SMALLEST_SLOT)) is None    # no room left for another large slot
    assert pool.place(np.arange(40_000)[::2]) is None      # not contiguous: sent as it is
    pool.free(first)
    again, offset = pool.place(bytes(2 * SMALLEST_SLOT))  # the freed slot, its pages kept
    assert offset == first and bytes(again) == bytes(2 * SMALLEST_SLOT) and pool.in_use == 2


def test_small_slots_freed_join_back_into_room_for_a_large_tensor():
    """A burst of small tensors must not carve the pool for good: freed slots join their free
    buddies, and the lowest free room is taken, so the pages in use stay at the bottom."""
    pool = SharedPool(8 * SMALLEST_SLOT)
    offsets = [pool.place(bytes(SMALLEST_SLOT))[1] for _ in range(8)]
    assert sorted(offsets) == [n * SMALLEST_SLOT for n in range(8)] and pool.place(bytes(10)) is None
    for offset in offsets[1:]:
        pool.free(offset)
    assert pool.place(bytes(8 * SMALLEST_SLOT)) is None     # the first slot still in use
    assert pool.place(bytes(4 * SMALLEST_SLOT))[1] == 4 * SMALLEST_SLOT
    pool.free(offsets[0])
    assert pool.place(bytes(SMALLEST_SLOT))[1] == 0         # the lowest free room
    assert pool.place(bytes(2 * SMALLEST_SLOT))[1] == 2 * SMALLEST_SLOT


def test_a_pool_of_an_odd_size_is_cut_into_aligned_rooms():
    pool = SharedPool(6 * SMALLEST_SLOT + 100)
    assert pool.place(bytes(4 * SMALLEST_SLOT))[1] == 0
    assert pool.place(bytes(2 * SMALLEST_SLOT))[1] == 4 * SMALLEST_SLOT
    assert pool.place(bytes(SMALLEST_SLOT)) is None


def test_a_pooled_tensor_reaches_the_instance_without_the_broker_copying_it(links):
    front, back, gateway, instance = links
    said_hello(links)
    pool = SharedPool(8 << 20)
    tensor = os.urandom(600_000)
    view, _ = pool.place(tensor)
    gateway.send_parts([b"record", view, b"small"])
    identity, record, forwarded, small = receive(front, links)
    assert (identity, bytes(record), bytes(small)) == (b"gw", b"record", b"small")
    located = locate(forwarded)          # the broker holds a view of the gateway's pool, not a copy
    assert located is not None and bytes(forwarded) == tensor
    back.send_parts([b"inst", record, forwarded])
    received_record, received = receive(instance, links)
    assert bytes(received_record) == b"record" and bytes(received) == tensor
    assert isinstance(received, bytearray) and locate(memoryview(received)) is None   # copied out: the model holds no pool memory
    received[0] ^= 0xFF                  # and writing to it leaves the pool as it was
    assert bytes(forwarded) == tensor


def test_peers_that_do_not_read_pools_get_the_bytes(links, tmp_path):
    front, back, gateway, instance = links
    plain = ZmtpDealer(str(tmp_path / "back"), b"plain")    # offers no pools (as a gateway's answers link)
    context = zmq.Context()
    old = libzmq_dealer(context, str(tmp_path / "back"), b"old")
    try:
        plain.send_parts([b"hello"])
        old.send_multipart([b"hello"])
        assert {receive(back, [*links, plain])[0] for _ in range(2)} == {b"plain", b"old"}
        pool = SharedPool(8 << 20)
        tensor = os.urandom(300_000)
        gateway.send_parts([pool.place(tensor)[0]])
        (_, forwarded) = receive(front, links)
        back.send_parts([b"plain", forwarded])
        back.send_parts([b"old", forwarded])
        assert [bytes(part) for part in receive(plain, links)] == [tensor]
        assert receive(old, links) == [tensor]
    finally:
        plain.close()
        old.close(0)
        context.term()


def test_a_pooled_message_sent_before_the_broker_binds_arrives_as_one(tmp_path):
    gateway = ZmtpDealer(str(tmp_path / "front"), b"gw")
    pool = SharedPool(8 << 20)
    tensor = os.urandom(200_000)
    gateway.send_parts([b"early", pool.place(tensor)[0]])      # written once the broker's READY says it reads pools
    front = ZmtpRouter(str(tmp_path / "front"), pools=PoolUse.FORWARD)
    try:
        identity, record, forwarded = receive(front, [gateway])
        assert (identity, bytes(record), bytes(forwarded)) == (b"gw", b"early", tensor)
        assert locate(forwarded) is not None
    finally:
        gateway.close()
        front.close()


def test_when_a_gateway_goes_the_instances_forget_its_pool_and_its_tensors_still_arrive(links):
    front, back, gateway, instance = links
    said_hello(links)
    pool = SharedPool(8 << 20)
    tensor = os.urandom(100_000)
    gateway.send_parts([pool.place(tensor)[0]])
    (_, forwarded) = receive(front, links)
    back.send_parts([b"inst", forwarded])
    assert bytes(receive(instance, links)[0]) == tensor
    assert len(instance._connection.reader.pools) == 1
    gateway.close()
    deadline = time.monotonic() + 5
    while instance._connection.reader.pools and time.monotonic() < deadline:
        for sock in (front, back, instance):
            sock.has_message()
        time.sleep(0.001)
    assert instance._connection.reader.pools == {}    # the broker told it: X-POOL-END, its mapping closed
    assert locate(forwarded) is None                    # the broker no longer passes the pool on
    back.send_parts([b"inst", forwarded])               # a request of that gateway still queued: its bytes
    assert bytes(receive(instance, links)[0]) == tensor


@pytest.mark.parametrize("frame, why", [
    (bytes((8, 20)) + struct.pack("<IQQ", 7, 0, 10), "pool 7, which this connection was not given"),
    (bytes((8, 3)) + b"abc", "a malformed pooled frame"),
])
def test_a_pooled_frame_the_reader_cannot_resolve_is_a_protocol_error(frame, why):
    reader = _Reader(PoolUse.COPY)
    reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"}))
    with pytest.raises(ZmtpError, match=why):
        reader.feed(frame)


def test_a_pool_that_cannot_be_mapped_is_a_protocol_error_naming_it():
    reader = _Reader(PoolUse.COPY)
    reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"}))
    read_end, write_end = os.pipe()   # a descriptor, but no memory file
    os.close(write_end)
    reader.descriptors.append(read_end)
    body = b"\x06X-POOL" + struct.pack("<IQB", 3, 1 << 20, 0)
    with pytest.raises(ZmtpError, match="could not map the peer's pool 3 of 1048576 bytes"):
        reader.feed(bytes((4, len(body))) + body)


def test_a_pool_command_without_its_descriptor_is_a_protocol_error():
    reader = _Reader(PoolUse.FORWARD)
    reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"DEALER"}))
    body = b"\x06X-POOL" + struct.pack("<IQB", 1, 1 << 20, 0)
    with pytest.raises(ZmtpError, match="a pool without its descriptor"):
        reader.feed(bytes((4, len(body))) + body)


def test_a_reference_past_the_end_of_its_pool_is_a_protocol_error(links):
    front, back, gateway, instance = links
    pool = SharedPool(1 << 20)
    gateway.send_parts([pool.place(bytes(SMALLEST_SLOT))[0]])
    receive(front, links)
    reader = next(iter(front._connections.values())).reader
    with pytest.raises(ZmtpError, match="past the end of pool"):
        reader.feed(bytes((8, 20)) + struct.pack("<IQQ", pool.pool.number, (1 << 20) - 10, 20))


def test_an_ensemble_keeps_a_copy_of_a_pooled_input():
    pool = SharedPool(1 << 20)
    view, _ = pool.place(b"x" * SMALLEST_SLOT)
    owned = _owned(view)
    assert owned == b"x" * SMALLEST_SLOT and locate(memoryview(owned)) is None
    plain = memoryview(b"y" * SMALLEST_SLOT)
    assert _owned(plain) is plain


def test_a_malformed_pool_command_is_a_protocol_error():
    reader = _Reader(PoolUse.FORWARD)
    reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"DEALER"}))
    body = b"\x06X-POOL" + b"\x01\x02"
    with pytest.raises(ZmtpError, match="malformed ZMTP"):
        reader.feed(bytes((4, len(body))) + body)


def test_a_pool_larger_than_its_memory_file_is_refused_before_it_is_mapped():
    reader = _Reader(PoolUse.COPY)
    reader.feed(_NULL_GREETING + _command(b"READY", {b"Socket-Type": b"ROUTER"}))
    small = os.memfd_create("small")
    os.ftruncate(small, 4096)
    reader.descriptors.append(small)
    body = b"\x06X-POOL" + struct.pack("<IQB", 4, 1 << 20, 0)   # reading past 4096 bytes would fault
    with pytest.raises(ZmtpError, match="the memory file holds 4096 bytes"):
        reader.feed(bytes((4, len(body))) + body)


def test_an_ensemble_copies_views_of_a_pool_no_longer_passed_on():
    pool = SharedPool(1 << 20)
    view, _ = pool.place(b"z" * SMALLEST_SLOT)
    pool.pool.retire()                       # its sender gone: not in the directory any more
    owned = _owned(view)
    assert owned == b"z" * SMALLEST_SLOT and not isinstance(owned, memoryview)


class _ShortFirstPass:
    """A socket whose first write with a descriptor takes only 5 bytes of it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.cut = sock, True

    def sendmsg(self, buffers, ancillary=()):
        if ancillary and self.cut:
            self.cut = False
            return self.sock.sendmsg([bytes(buffers[0])[:5]], ancillary)
        return self.sock.sendmsg(buffers, ancillary)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_two_pools_passed_before_one_message_arrive_whole_when_the_first_is_cut_short():
    ours, theirs = socket.socketpair()
    connection = _Connection(ours, select.epoll(), b"ROUTER", pools=PoolUse.FORWARD)
    connection.reader.properties, connection.reader.ready = {b"X-Pools": b"1"}, True
    connection.sock = _ShortFirstPass(ours)
    first, second = SharedPool(1 << 20), SharedPool(1 << 20)
    a, b = os.urandom(SMALLEST_SLOT), os.urandom(SMALLEST_SLOT + 7)
    connection.queue(encode([b"record", first.place(a)[0], second.place(b)[0]]))
    for _ in range(10):
        connection.write()
    reader, received = _Reader(PoolUse.COPY), b""
    theirs.setblocking(False)
    while True:
        try:
            data, ancillary, _, _ = theirs.recvmsg(1 << 20, socket.CMSG_SPACE(64))
        except BlockingIOError:
            break
        for level, kind, payload in ancillary:
            reader.descriptors.extend(struct.unpack(f"{len(payload) // 4}i", payload))
        received += data
    reader.feed(received)
    assert [bytes(part) for part in reader.messages.popleft()] == [b"record", a, b]
    connection.close()
    theirs.close()


def test_a_pool_the_system_cannot_give_is_said_and_large_tensors_go_as_bytes(caplog):
    assert request_slots(1 << 60, "full") is None   # far past any address space
    assert "no shared memory of 1.09951e+12 MiB for large tensors" in caplog.text


def test_a_request_pools_figures_count_its_held_slots_and_what_went_as_bytes(caplog):
    slots = RequestSlots(2 * SMALLEST_SLOT, "full")
    assert tuple(slots.usage()) == (2 * SMALLEST_SLOT, 0, 0, 0)
    slots.place(1, [bytes(SMALLEST_SLOT), b"small"])
    slots.place(2, [bytes(SMALLEST_SLOT), bytes(SMALLEST_SLOT)])   # room for one of the two
    assert tuple(slots.usage()) == (2 * SMALLEST_SLOT, 2 * SMALLEST_SLOT, 1, 0)
    slots.release(1)
    slots.place(3, [bytes(SMALLEST_SLOT + 1)])                   # needs two slots' room: none
    assert tuple(slots.usage()) == (2 * SMALLEST_SLOT, SMALLEST_SLOT, 2, 0)
    slots.release_all()
    assert slots.usage().used == 0


def test_the_slots_of_requests_below_a_number_are_freed_together_and_the_others_kept():
    slots = RequestSlots(4 * SMALLEST_SLOT, "full")
    for rid in (3, 5, 8):
        slots.place(rid, [bytes(SMALLEST_SLOT)])
    slots.release_below(8)   # 3 and 5 went to a broker process that is gone; 8 to the new one
    assert slots.usage().used == SMALLEST_SLOT
    slots.release(8)
    assert slots.usage().used == 0


def test_a_pool_that_fills_again_and_again_says_so_at_most_once_a_minute(caplog):
    now = [0.0]
    slots = RequestSlots(SMALLEST_SLOT, "full", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for rid in range(1, 6):   # under load: full, a slot freed, full again...
            slots.place(rid, [bytes(SMALLEST_SLOT), bytes(SMALLEST_SLOT)])
            slots.release(rid)
            now[0] += 10.0
        said_within_a_minute = len(caplog.records)
        now[0] += 60.0
        slots.place(9, [bytes(SMALLEST_SLOT), bytes(SMALLEST_SLOT)])
    assert said_within_a_minute == 1 and len(caplog.records) == 2
    assert slots.usage().overflows == 6
