"""Autoscaling (``tritium.autoscale``): instances follow the queue, idle models scale to zero.

Broker, two worker hosts and a gateway as separate processes (tests/cluster.py). The
models (tests/e2e/autoscale_repo) answer with their pid after DELAY_MS milliseconds:
``elastic`` (min 1, max 4, a 0.5 s cooldown, one request per execution), ``lazy`` (min 0, idle after 2 s)
and ``broken`` (min 0; its initialize raises).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import cluster
from tests.cluster import Load, failures, instance_pids, whoami
from tests.servers import free_port

REPO = Path(__file__).parent / "autoscale_repo"
HEARTBEAT = ("--heartbeat-interval-secs", "0.25")


@pytest.fixture(scope="module")
def world():
    metrics_port = free_port()
    broker = cluster.broker(REPO, *HEARTBEAT, "--allow-metrics", "true", "--metrics-port", str(metrics_port),
                            "--metrics-address", "127.0.0.1")
    broker.wait_ready()
    workers = [cluster.worker(broker.backend, REPO, *HEARTBEAT, "--max-cpu-instances", "3") for _ in range(2)]
    gateway = cluster.gateway(broker.frontend, *HEARTBEAT)
    parts = [broker, *workers, gateway]
    try:
        for part in parts[1:]:
            part.wait_ready()
        with httpclient.InferenceServerClient(gateway.url) as client:
            cluster.wait_until(lambda: client.is_model_ready("elastic"), what="elastic ready")
        broker.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield broker, workers, gateway
    finally:
        for part in reversed(parts):
            part.stop(timeout_s=20)


@pytest.fixture
def client(world):
    # Closed here, in the thread that made it: collected on another thread (a garbage collection
    # runs wherever it happens to start), its gevent pool fails in __del__.
    with httpclient.InferenceServerClient(world[2].url, network_timeout=60) as client:
        yield client


def running(workers, model: str) -> list[int]:
    return [len(instance_pids(w, model)) for w in workers]


def metric(broker, line_start: str) -> float:
    for line in urllib.request.urlopen(broker.metrics_url).read().decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start}")


def test_a_burst_grows_the_instances_over_both_hosts_and_idleness_shrinks_them_back(world):
    broker, workers, gateway = world
    assert sum(running(workers, "elastic")) == 1
    with Load(gateway.url, threads=6, delay_ms=100, model="elastic") as load:
        cluster.wait_until(lambda: sum(running(workers, "elastic")) >= 3, timeout_s=30,
                           what="more instances under load")
        grown = running(workers, "elastic")
        started = time.monotonic()
        time.sleep(2)
    assert not failures(load.outcomes)
    assert all(count >= 1 for count in grown), f"new instances go to both hosts: {grown}"
    late = load.since(started)
    assert len({o.pid for o in late}) >= 3, "the requests were served by the new instances"
    # One instance served 10 requests a second; the grown pool served more.
    assert len(late) / 2 > 15
    assert 'tritium_instances{host=' in urllib.request.urlopen(broker.metrics_url).read().decode()
    cluster.wait_until(lambda: sum(running(workers, "elastic")) == 1, timeout_s=40, what="back to the minimum")
    assert "instance(s), stopping" in broker.logs() and "the oldest request waited" in broker.logs()


def test_an_idle_model_scales_to_zero_stays_ready_and_wakes_on_the_next_request(world, client):
    broker, workers, _ = world
    whoami(client, 0, "lazy")
    assert sum(running(workers, "lazy")) == 1
    cluster.wait_until(lambda: sum(running(workers, "lazy")) == 0, timeout_s=20, what="scaled to zero")
    assert client.is_model_ready("lazy") and client.is_server_ready()
    before = metric(broker, 'tritium_cold_starts_total{model="lazy",version="1"}')
    pid = int(whoami(client, 0, "lazy")[0])
    assert pid in set().union(*(instance_pids(w, "lazy") for w in workers))
    assert metric(broker, 'tritium_cold_starts_total{model="lazy",version="1"}') == before + 1
    assert metric(broker, 'tritium_cold_start_duration_us{model="lazy",version="1"}') > 0
    stats = client.get_inference_statistics("lazy")["model_stats"][0]["inference_stats"]
    assert stats["queue"]["ns"] > 0   # the wait for the cold start is queue time


def test_a_failed_cold_start_answers_with_its_cause_and_is_tried_again_later(world, client):
    broker, _, _ = world
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    expected = ("cold start of model 'broken' version 1 failed: Internal: RuntimeError: the weights are not there; "
                "retrying after 5 s")
    for _ in range(2):   # the second is answered at once, within the retry delay
        with pytest.raises(InferenceServerException) as refused:
            client.infer("broken", [x])
        assert refused.value.status() == "503" and refused.value.message() == expected
    assert broker.logs().count("model broken version 1: 0 -> 1 instance(s)") == 1
    time.sleep(5.5)
    with pytest.raises(InferenceServerException):
        client.infer("broken", [x])
    assert broker.logs().count("model broken version 1: 0 -> 1 instance(s)") == 2
    assert client.is_model_ready("elastic")


def test_a_new_instance_runs_the_models_warmup_before_it_takes_traffic(client):
    delay = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
    delay.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    executions = client.infer("warm", [delay]).as_numpy("EXECUTIONS")
    assert executions.tolist() == [[4]], "three warmup executions ran before the first request"


def test_a_host_that_joins_later_receives_new_instances(world):
    broker, workers, gateway = world
    newcomer = cluster.worker(broker.backend, REPO, *HEARTBEAT, "--max-cpu-instances", "3")
    try:
        newcomer.wait_ready()
        cluster.wait_until(lambda: sum(running(workers, "elastic")) == 1, timeout_s=40, what="at the minimum")
        with Load(gateway.url, threads=6, delay_ms=100, model="elastic"):
            cluster.wait_until(lambda: instance_pids(newcomer, "elastic"), timeout_s=30,
                               what="an instance on the new host")
    finally:
        newcomer.stop()
