"""A broker restarted under load keeps every model loaded: the worker host's instances are adopted.

Broker, worker host and gateway run as separate processes over tcp:// (tests/cluster.py).
The repository has a model with two instances and an autoscaled one grown to two. After
the broker is killed (SIGKILL) or drained (SIGTERM) and started again, the same instance
processes serve: none restarts, no model loads again, and the autoscaled model keeps its
count.
"""

from __future__ import annotations

import pytest

from bench.broker_restart import restart_under_load, start_cluster
from tests.cluster import failures, served_by

LOST = {"lost contact with the broker at {}; the request was not answered",
        "the broker at {} restarted; the request was lost",
        "the server is shutting down"}
# Between the new broker's model table and the instances' HELLO (milliseconds): Triton's answer.
NOT_YET_READY = {("400", "Model version not ready")}


@pytest.fixture(scope="module")
def world():
    broker, workers, gateway = start_cluster()
    try:
        yield broker, workers, gateway
    finally:
        for part in [gateway, *workers, broker]:
            part.stop(timeout_s=20)


def check(run, broker, workers, gateway) -> None:
    assert all(o.ended - o.started < 10 for o in run.outcomes), "every request is answered, none hangs"
    assert run.first_answer_s < 3, f"back {run.first_answer_s:.2f} s after the broker's start"
    assert run.pids_after == run.pids_before and len(run.pids_before) == 4, "the same instance processes serve"
    assert not run.failed_after_back(), run.failed_after_back()[:3]
    late = [o for o in run.outcomes if o.started >= run.back_at]
    assert late and served_by(late) <= run.pids_before
    allowed = {("503", message.format(broker.frontend)) for message in LOST} | NOT_YET_READY
    assert {(o.status, o.message) for o in failures(run.outcomes)} <= allowed
    assert gateway.process.poll() is None and all(w.process.poll() is None for w in workers)


def test_a_broker_killed_under_load_keeps_every_instance_and_serves_within_3_s(world):
    broker, workers, gateway = world
    started_before = workers[0].logs().count("started instance")
    run = restart_under_load(broker, gateway, workers, planned=False)
    check(run, broker, workers, gateway)
    assert workers[0].logs().count("started instance") == started_before, "no instance process was started"
    assert broker.logs().count("adopting running instance") >= 4
    assert "keeping 2 running instance(s)" in broker.logs(), "the autoscaled model keeps its count"


def test_a_planned_broker_restart_keeps_every_instance(world):
    broker, workers, gateway = world
    run = restart_under_load(broker, gateway, workers, planned=True)
    check(run, broker, workers, gateway)
