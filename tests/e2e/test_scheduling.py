"""Priorities, queue policies and the response cache, end to end through Triton's client.

The models (tests/e2e/scheduling_repo) answer with their pid after DELAY_MS milliseconds,
one request per execution, so that queues build up behind a single instance.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import TritiumServer

REPO = Path(__file__).parent / "scheduling_repo"


@pytest.fixture(scope="module")
def server():
    with TritiumServer(REPO, "--cache-config", "local,size=1048576") as running:
        yield running


def delay_input(module, delay_ms: float):
    tensor = module.InferInput("DELAY_MS", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[delay_ms]], dtype=np.float32))
    return [tensor]


def timed_infer(client, model: str, delay_ms: float, **options) -> float:
    started = time.monotonic()
    client.infer(model, delay_input(httpclient, delay_ms), **options)
    return time.monotonic() - started


def test_high_priority_requests_overtake_a_queue_of_low_priority_ones(server):
    low_latencies, stop = [], threading.Event()

    def low_priority_traffic():
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        while not stop.is_set():
            low_latencies.append(timed_infer(client, "prio", 50))   # default level 2

    threads = [threading.Thread(target=low_priority_traffic) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1)   # six requests queue behind one instance
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        high = [timed_infer(client, "prio", 50, priority=1) for _ in range(5)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    low = sorted(low_latencies)[len(low_latencies) // 2]
    assert max(high) < low, f"high priority {high} vs low median {low}"


def test_a_full_queue_answers_503_with_tritons_message(server):
    outcomes, lock = [], threading.Lock()

    def send():
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            client.infer("bounded", delay_input(httpclient, 300))
            result = "ok"
        except InferenceServerException as exc:
            result = (exc.status(), exc.message())
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = [o for o in outcomes if o != "ok"]
    assert len(outcomes) == 8 and refused and outcomes.count("ok") >= 3
    assert set(refused) == {("503", "[request id: <id_unknown>] Exceeds maximum queue size")}
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("bounded")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == len(refused)


def test_a_queue_timeout_is_enforced_while_the_request_waits_behind_a_long_execution(server):
    blocker = threading.Thread(target=lambda: timed_infer(
        httpclient.InferenceServerClient(server.url, network_timeout=60), "deadline", 1500))
    blocker.start()
    time.sleep(0.3)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as refused:
        # lowers 5 s to 200 ms; the scheduler's error carries no request id, as in Triton
        client.infer("deadline", delay_input(httpclient, 0), timeout=200_000, request_id="late-1")
    waited = time.monotonic() - started
    blocker.join(30)
    assert refused.value.status() == "503" and refused.value.message() == "Request timeout expired"
    assert waited < 1.0, "the timeout must not wait for the running execution to end"
    metrics = urllib.request.urlopen(server.metrics_url).read().decode()
    assert 'nv_inference_request_failure{model="deadline",reason="REJECTED",version="1"} 1.0' in metrics


def test_a_request_past_a_delay_timeout_runs_after_the_requests_still_in_time(server):
    finished = {}

    def send(name: str, delay_ms: float) -> None:
        timed_infer(httpclient.InferenceServerClient(server.url, network_timeout=60), "delayed", delay_ms)
        finished[name] = time.monotonic()

    blocker = threading.Thread(target=send, args=("blocker", 2000))
    # Each runs 100 ms, so that the order they ran in shows in when their answers come back.
    late = threading.Thread(target=send, args=("late", 100))     # waits past its 500 ms: delayed
    timely = threading.Thread(target=send, args=("timely", 100))  # arrives later, still in time at 2 s
    blocker.start()
    time.sleep(0.3)
    late.start()
    time.sleep(1.4)
    timely.start()
    for thread in (blocker, late, timely):
        thread.join(30)
    assert set(finished) == {"blocker", "late", "timely"}, "DELAY never rejects"
    assert finished["timely"] < finished["late"]


def test_identical_requests_are_answered_from_the_cache_on_http_and_grpc(server):
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    first = http.infer("cached", delay_input(httpclient, 7)).as_numpy("PID")
    again = grpc.infer("cached", delay_input(grpcclient, 7)).as_numpy("PID")
    other = http.infer("cached", delay_input(httpclient, 8)).as_numpy("PID")
    np.testing.assert_array_equal(first, again)
    assert other.shape == (1, 1)
    stats = http.get_inference_statistics("cached")["model_stats"][0]
    inference = stats["inference_stats"]
    assert inference["cache_hit"]["count"] == 1 and inference["cache_miss"]["count"] == 2
    assert inference["success"]["count"] == 3 and stats["execution_count"] == 2
    assert inference["compute_infer"]["count"] == 2   # success minus cache hits, as Triton counts
    metrics = urllib.request.urlopen(server.metrics_url).read().decode()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 1.0' in metrics
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 2.0' in metrics


def test_a_bad_cache_config_stops_serve_with_a_clear_message(tmp_path):
    from tests.servers import run_serve

    done = run_serve(REPO, "--cache-config", "redis,host=x")
    assert done.returncode == 2
    assert b"cache 'redis' is not supported; tritium has the 'local' cache only" in done.stderr
