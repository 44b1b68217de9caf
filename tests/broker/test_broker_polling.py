"""The broker's polling before it sleeps (--broker-spin-us), through its loop in-process with scripted
peers (the harness of test_broker_inprocess): it polls only while instances run a single request,
and never past a batching deadline."""

from __future__ import annotations

import time

import pytest

from tests.broker.test_broker_inprocess import CONFIG, World, answer, infer
from tritium.protocol import Kind

DELAYED = CONFIG.replace("dynamic_batching { }",
                         "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 20000 }")
SPIN_S = 1.0


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
    world.broker.scheduler.requests_running = 1   # as if another instance ran a request: the broker polls
    start = time.monotonic()
    infer(gateway, rid=1)
    while not instance.headers(Kind.BATCH):   # turns of the broker's own loop: no cap on the wait but its own
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
    world.gateway()
    world.serving_instance()
    world.broker.scheduler.requests_running = 1
    start = time.monotonic()
    world.broker.turn(5)
    assert time.monotonic() - start < SPIN_S / 2
