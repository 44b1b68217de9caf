"""The broker's polling before it sleeps (--broker-spin-us), through its loop in-process with scripted
peers (tests/broker/inprocess_world.py): it polls only while requests come one at a time (for the
answer while the one runs, and after it for the next), and never past a batching deadline."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from tests.broker.inprocess_world import CONFIG, World, answer, infer
from tritium.broker.server import Broker, BrokerSettings
from tritium.protocol import (PROTOCOL_VERSION, BatchDone, Cancel, Hello, Kind, Response, ResponsePart, Role)
from tritium.zmtp import ZmtpDealer

DELAYED = CONFIG.replace("dynamic_batching { }",
                         "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 20000 }")
SPIN_S = 1.0


def _answered(world: World, gateway, instance, *rids: int) -> None:
    """Send the requests ``rids``, answer their batch (one) and wait for the answers."""
    batches, records, responses = (len(instance.headers(Kind.BATCH)), len(instance.records(Kind.INFER)),
                                   len(gateway.headers(Kind.RESPONSE)))
    for rid in rids:
        infer(gateway, rid=rid)
    world.until(lambda: len(instance.headers(Kind.BATCH)) > batches)
    (batch,) = instance.headers(Kind.BATCH)[batches:]
    answer(instance, batch, instance.records(Kind.INFER)[records:])
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == responses + len(rids))


def _one_at_a_time(world: World, gateway, instance) -> None:
    """Two requests, one after the other, each answered alone: requests come one at a time."""
    _answered(world, gateway, instance, 1)
    _answered(world, gateway, instance, 2)
    assert world.broker.scheduler.one_at_a_time


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path, DELAYED, spin_s=SPIN_S)
    yield world
    world.close()


def test_polling_stops_at_a_batching_deadline(world, monkeypatch):
    # The polling also stops when another thread takes the CPU, which on a test machine may come at
    # any time: a CPU that always comes straight back leaves the deadline as the only limit.
    monkeypatch.setattr("tritium.broker.server.cpu_is_free", lambda: True)
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_at_a_time(world, gateway, instance)   # the broker polls (after an answer, for up to 1 s)
    start = time.monotonic()
    infer(gateway, rid=3)
    while len(instance.headers(Kind.BATCH)) < 3:   # turns of the broker's own loop: no cap on the wait but its own
        world.broker.turn()
        instance.collect()
        assert time.monotonic() - start < 2 * SPIN_S
    waited = time.monotonic() - start
    assert 0.02 <= waited < SPIN_S / 2   # the 20 ms queue delay, not the 1 s of polling


def test_nothing_running_nothing_polled(world, monkeypatch):
    monkeypatch.setattr("tritium.broker.server.cpu_is_free", lambda: True)
    world.gateway()
    world.serving_instance()
    assert world.broker.scheduler.requests_running == 0
    start = time.monotonic()
    assert world.broker._spin_for_message(10_000) == []
    assert time.monotonic() - start < SPIN_S / 2


def test_a_batch_sent_and_answered_counts_its_requests_running_then_not(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    infer(gateway, rid=1)
    infer(gateway, rid=2)
    world.until(lambda: instance.headers(Kind.BATCH))
    assert world.broker.scheduler.requests_running == 2
    (batch,) = instance.headers(Kind.BATCH)
    answer(instance, batch, instance.records(Kind.INFER))
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    assert world.broker.scheduler.requests_running == 0


def test_a_turn_with_a_timeout_polls_no_longer_than_it(world, monkeypatch):
    monkeypatch.setattr("tritium.broker.server.cpu_is_free", lambda: True)
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_at_a_time(world, gateway, instance)
    start = time.monotonic()
    world.broker.turn(5)
    assert time.monotonic() - start < SPIN_S / 2


@pytest.fixture
def short_polling_world(tmp_path, monkeypatch):
    monkeypatch.setattr("tritium.broker.server.cpu_is_free", lambda: True)
    world = World(tmp_path, spin_s=0.3)   # no queue delay: each request is a batch of its own
    yield world
    world.close()


def test_a_lone_request_answered_is_followed_by_polling_for_the_next(short_polling_world):
    world = short_polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_at_a_time(world, gateway, instance)
    assert world.broker.scheduler.requests_running == 0
    start = time.monotonic()
    assert world.broker._spin_for_message(10_000) == []   # nothing came: polled out the window
    assert 0.1 <= time.monotonic() - start < 1.0
    start = time.monotonic()
    assert world.broker._spin_for_message(10_000) == []   # the window is over: no polling
    assert time.monotonic() - start < 0.05


@pytest.fixture
def polling_world(world, monkeypatch):
    monkeypatch.setattr("tritium.broker.server.cpu_is_free", lambda: True)
    return world


def _one_running(world: World, gateway, instance) -> dict:
    """After a run of lone requests, a third one, running in the instance: its BATCH header."""
    _one_at_a_time(world, gateway, instance)
    infer(gateway, rid=3)
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 3)
    return instance.headers(Kind.BATCH)[-1]


def _found_by_polling(world: World, send, *args) -> list:
    """What the broker's polling finds while another thread calls ``send(*args)`` 50 ms in."""
    sender = threading.Timer(0.05, send, args)
    sender.start()
    start = time.monotonic()
    found = world.broker._spin_for_message(10_000)
    sender.join()
    assert time.monotonic() - start >= 0.04   # found by polling, not queued already
    return found


def test_a_message_in_the_window_after_a_lone_answer_is_found_by_polling(polling_world):
    world = polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_at_a_time(world, gateway, instance)
    assert _found_by_polling(world, infer, gateway, 3) == [world.broker.frontend]   # the client's next request


def test_the_answer_of_the_one_request_running_is_found_by_polling(polling_world):
    world = polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    batch = _one_running(world, gateway, instance)
    assert world.broker.scheduler.requests_running == 1
    assert _found_by_polling(world, answer, instance, batch, instance.records(Kind.INFER)[-1:]) == [world.broker.backend]


def test_a_batch_of_two_answered_ends_the_polling(polling_world):
    world = polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_at_a_time(world, gateway, instance)
    _answered(world, gateway, instance, 3, 4)   # one batch: the queue delay gathers both
    assert not world.broker.scheduler.one_at_a_time
    start = time.monotonic()
    assert world.broker._spin_for_message(10_000) == []
    assert time.monotonic() - start < SPIN_S / 2


def test_a_lone_answer_with_a_request_queued_behind_it_ends_the_polling(polling_world):
    world = polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _one_running(world, gateway, instance)
    infer(gateway, rid=4)   # waits in the broker: the instance is busy
    world.until(lambda: len(world.broker.registry.versions[("m", 1)].batcher) == 1)
    answer(instance, instance.headers(Kind.BATCH)[-1], instance.records(Kind.INFER)[-1:])
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 4)   # the queued one leaves
    assert not world.broker.scheduler.one_at_a_time


def test_a_single_lone_answer_is_not_followed_by_polling(short_polling_world):
    world = short_polling_world
    gateway = world.gateway()
    _, instance = world.serving_instance()
    _answered(world, gateway, instance, 1)   # the last of a burst, perhaps: not yet one at a time
    start = time.monotonic()
    assert world.broker._spin_for_message(10_000) == []
    assert time.monotonic() - start < 0.05


# -- a decoupled model's first response when requests come one at a time ----------------------

DECOUPLED = CONFIG + "model_transaction_policy { decoupled: true }\n"


def _streamed(world: World, gateway, instance, rid: int, responses: int = 3) -> tuple[dict, list[list[int]]]:
    """Send request ``rid``; its instance streams ``responses`` responses and the final flag, each
    a message of its own as an instance sends them, all waiting at the broker before it reads
    them. Returns the BATCH header the instance got, and the rids of each message the gateway got."""
    batches, received = len(instance.headers(Kind.BATCH)), len(gateway.messages)
    infer(gateway, rid=rid)
    world.until(lambda: len(instance.headers(Kind.BATCH)) > batches)
    batch = instance.headers(Kind.BATCH)[-1]
    for token in range(responses):
        instance.send(ResponsePart(batch["b"], 0).encode(),
                      Response(rid, [["Y", "FP32", [1], 4, False]], final=False).encode([bytes(4)]))
    instance.send(ResponsePart(batch["b"], 0).encode(), Response(rid, final=True, empty=True).encode())
    instance.send(BatchDone(batch["b"], [], [], (1_000, 2_000, 0), [0]).encode())
    time.sleep(0.05)   # all queued at the broker's socket before its next turn

    def answers() -> list[list[int]]:
        return [rids for message in gateway.messages[received:]
                if (rids := [header["rid"] for header, _ in message if header["k"] == Kind.RESPONSE])]

    world.until(lambda: sum(map(len, answers())) == responses + 1)
    return batch, answers()


def test_a_streams_first_response_leaves_alone_once_requests_come_one_at_a_time(tmp_path):
    """The batch tells its instance that requests come one at a time (it then gives up its CPU
    after the first response), and the broker sends that first response on at once, not with the
    responses read after it in the same turn; under load, a turn's responses go in one message."""
    world = World(tmp_path, DECOUPLED)
    try:
        gateway = world.gateway()
        _, instance = world.serving_instance()
        first, messages = _streamed(world, gateway, instance, rid=1)
        assert not first.get("lone") and messages == [[1, 1, 1, 1]]
        _streamed(world, gateway, instance, rid=2)
        assert world.broker.scheduler.one_at_a_time
        lone, messages = _streamed(world, gateway, instance, rid=3)
        assert lone["lone"] is True and messages == [[3], [3, 3, 3]]
    finally:
        world.close()


def test_a_backlog_on_one_local_link_leaves_the_other_read_every_turn(tmp_path):
    """A local link's socket reads all that arrived at once, more than a turn drains: a backlog of
    an instance's messages must not keep the broker from the gateways' (each turn drains both)."""
    context = zmq.Context()
    broker = Broker(BrokerSettings(model_repositories=(str(tmp_path),), frontend=f"ipc://{tmp_path}/front",
                                   backend=f"ipc://{tmp_path}/back", metrics=None, heartbeat_interval_s=1.0),
                    context)
    instance, gateway = ZmtpDealer(f"{tmp_path}/back", b"bls-1"), ZmtpDealer(f"{tmp_path}/front", b"gw-1")
    try:
        for _ in range(20):   # the handshakes
            broker.turn(1)
            instance.has_message()
            gateway.has_message()
        for rid in range(3 * 512):   # each a turn's whole drain ahead of the gateway
            instance.send_parts([Cancel(rid, "absent", 1).encode()])
        instance.has_message()   # (writes what waits)
        assert broker.backend.has_message()   # all read at once
        gateway.send_parts([Hello(Role.GATEWAY, PROTOCOL_VERSION, heartbeat_s=1.0).encode()])
        gateway.has_message()
        broker.turn(0)
        assert b"gw-1" in broker.gateways
    finally:
        instance.close()
        gateway.close()
        broker.close()
        context.destroy(0)
