"""A broker restarted under load keeps every model loaded: the worker host's instances are adopted.

Broker, worker host and gateway run as separate processes over tcp:// (tests/cluster.py).
The repository has a model with two instances, an autoscaled one grown to two, a
stateful one and one autoscaled at zero (its instance started by the last test). After
the broker is killed (SIGKILL) or drained (SIGTERM) and started again, the same instance
processes serve: none restarts, no model loads again, and the autoscaled model keeps its
count. The gateway heartbeats at the default interval, so that it does not call the broker
lost during its restart: a killed broker's requests fail, those sent meanwhile wait for the
new broker while it takes the instances over; a drained broker loses nothing (the gateway
holds the requests sent during the drain for the new one).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.broker_restart import restart_under_load, start_cluster
from tests import cluster
from tests.cluster import failures, instance_pids, served_by, whoami

LOST = "the broker at {} restarted; the request was lost"


@pytest.fixture(scope="module")
def world():
    broker, workers, gateway = start_cluster(gateway_heartbeat_s=1.0)
    try:
        yield broker, workers, gateway
    finally:
        for part in [gateway, *workers, broker]:
            part.stop(timeout_s=20)


def check(run, broker, workers, gateway) -> None:
    assert all(o.ended - o.started < 10 for o in run.outcomes), "every request is answered, none hangs"
    assert run.first_answer_s < 3, f"back {run.first_answer_s:.2f} s after the broker's start"
    assert run.pids_after == run.pids_before and len(run.pids_before) == 5, "the same instance processes serve"
    assert not run.failed_after_back(), run.failed_after_back()[:3]
    late = [o for o in run.outcomes if o.started >= run.back_at]
    assert late and served_by(late) <= run.pids_before
    failed = failures(run.outcomes)
    assert {(o.status, o.message) for o in failed} <= {("503", LOST.format(broker.frontend))}
    assert len(failed) <= 2, "only the requests out at the killed broker (one per client thread) are lost"
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
    assert failures(run.outcomes) == [], "a drained broker's restart loses no request"


def add(client, value: float, sequence: int, start: bool = False) -> float:
    """One request of a py_state sequence: its running sum, kept as implicit state."""
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return float(client.infer("py_state", [tensor], sequence_id=sequence, sequence_start=start)
                 .as_numpy("OUTPUT").reshape(-1)[0])


def test_a_sequence_open_across_a_broker_restart_starts_again_on_the_kept_instance(world):
    broker, workers, gateway = world
    client = httpclient.InferenceServerClient(gateway.url)
    assert add(client, 2.0, 41, start=True) == 2.0 and add(client, 3.0, 41) == 5.0
    before = instance_pids(workers[0], "py_state")
    broker.kill()
    broker.start()
    broker.wait_ready()
    cluster.wait_until(lambda: _answers(client), what="py_state answering again")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        add(client, 1.0, 41)
    assert add(client, 4.0, 41, start=True) == 4.0 and add(client, 1.0, 41) == 5.0
    assert instance_pids(workers[0], "py_state") == before and len(before) == 1


def _answers(client) -> bool:
    """Whether the new broker serves py_state (a sequence of its own, so that 41 stays unknown to it)."""
    try:
        return add(client, 1.0, 99, start=True) == 1.0
    except InferenceServerException:
        return False


def test_a_request_sent_during_the_restart_to_a_model_at_zero_is_served_by_the_instance_kept(world):
    """It is ready in the new broker before the host registers again; the request waits for the
    host instead of failing 'no instance', and no cold start is made. Last: it leaves a sixth
    instance running, which the restarts above do not count."""
    broker, workers, gateway = world
    client = httpclient.InferenceServerClient(gateway.url, network_timeout=30)
    (cold_started,) = whoami(client, model="whoami_zero")
    broker.kill()
    broker.start()   # the request below reaches it through the gateway as soon as it binds
    (served,) = whoami(client, model="whoami_zero")
    assert served == cold_started
    assert instance_pids(workers[0], "whoami_zero") == {cold_started}
    assert broker.logs().count("cold start: a request found no instance") == 1
