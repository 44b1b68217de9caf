"""Priorities, queue policies and the response cache, end to end through Triton's client.

The models (tests/e2e/scheduling_repo) answer with their pid after DELAY_MS milliseconds,
one request per execution, so that queues build up behind a single instance.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_text import scrape, value
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
    # Refused before entering the queue: Triton 2.51 does not count them (checked side by side).
    assert stats["inference_stats"]["fail"]["count"] == 0


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
    assert 'nv_inference_request_failure{model="deadline",reason="REJECTED",version="1"} 1\n' in metrics


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


def _give_up(server, how: str) -> None:
    """A request to ``plain`` whose client leaves it while it waits behind a running one."""
    if how == "http-reset":   # the connection torn down (RST), as by a client process that died
        body = json.dumps({"inputs": [{"name": "DELAY_MS", "datatype": "FP32", "shape": [1, 1], "data": [0]}]})
        host, port = server.url.split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(b"POST /v2/models/plain/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                               % (len(body), body.encode()))
            time.sleep(0.2)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return
    client = grpcclient.InferenceServerClient(server.grpc_url)
    if how == "grpc-deadline":
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            client.infer("plain", delay_input(grpcclient, 0), client_timeout=0.2)
    else:
        call = client.async_infer("plain", delay_input(grpcclient, 0), callback=lambda result, error: None)
        time.sleep(0.2)
        call.cancel()


@pytest.mark.parametrize("how", ["grpc-deadline", "grpc-cancel", "http-reset"])
def test_a_queued_request_its_client_gave_up_on_leaves_the_queue_counted_as_cancelled(server, how):
    """Triton 2.51 runs such a request anyway (seen side by side); tritium does no work nobody waits for."""
    http = httpclient.InferenceServerClient(server.url)

    def counts() -> tuple[int, int, int, float]:
        stats = http.get_inference_statistics("plain")["model_stats"][0]
        inference = stats["inference_stats"]
        cancelled = value(scrape(server)[1], "nv_inference_request_failure", model="plain", reason="CANCELED",
                          version="1")
        return int(inference["success"]["count"]), int(inference["fail"]["count"]), int(stats["execution_count"]), \
            cancelled

    before = counts()
    answered = []
    running = threading.Thread(target=lambda: answered.append(
        httpclient.InferenceServerClient(server.url).infer("plain", delay_input(httpclient, 800)).as_numpy("WAITED_MS")))
    running.start()
    time.sleep(0.2)   # the one instance is busy: the next request waits in the queue
    _give_up(server, how)
    running.join()
    assert len(answered) == 1
    deadline = time.monotonic() + 10
    while counts()[:3] == (before[0] + 1, before[1], before[2] + 1) and time.monotonic() < deadline:
        time.sleep(0.05)   # the running request's answer may come before the cancellation is counted
    after = counts()
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1, 1.0]   # success, fail, executions, CANCELED


@pytest.mark.parametrize("where", ["at-its-instance", "in-the-broker"])
def test_a_cancelled_request_of_a_sequence_ends_the_sequence_and_frees_its_slot(server, where):
    """As in Triton: the sequence's queued requests are cancelled, its correlation id forgotten (a
    request without START is refused) and its slot goes to the sequence waiting in the backlog,
    without waiting for the idle limit (5 s). A sequence's requests follow each other to its
    instance while it has credit (two batches): the second is sent on behind the busy first and,
    cancelled there, runs (its answer dropped) and ends the sequence; a third waits in the
    broker's queue and leaves it when cancelled."""
    def infer(delay_ms: float, sequence_id: int, start: bool = False, end: bool = False):
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        return client.infer("sequence", delay_input(httpclient, delay_ms), sequence_id=sequence_id,
                            sequence_start=start, sequence_end=end).as_numpy("WAITED_MS").tolist()

    answered: dict[str, list] = {}
    threads = [threading.Thread(target=lambda: answered.update(first=infer(800, 7, start=True)))]
    threads[0].start()
    time.sleep(0.2)   # sequence 7 holds the one slot; sequence 8 waits in the backlog
    if where == "in-the-broker":
        threads.append(threading.Thread(target=lambda: answered.update(second=infer(0, 7))))
        threads[-1].start()
        time.sleep(0.1)
    waiting = threading.Thread(target=lambda: answered.update(waiting=infer(1, 8, start=True, end=True)))
    waiting.start()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        grpc.infer("sequence", delay_input(grpcclient, 0), sequence_id=7, client_timeout=0.2)
    for thread in threads:
        thread.join()
    started = time.monotonic()
    waiting.join()
    expected = {"first": [[800.0]], "waiting": [[1.0]]}
    assert answered == (expected if where == "at-its-instance" else {**expected, "second": [[0.0]]})
    assert time.monotonic() - started < 2
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        infer(0, 7)


def test_a_running_request_s_cancellation_leaves_its_sequence_running(server):
    """As in Triton, which checks only the requests waiting in a slot's queue."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        grpc.infer("sequence", delay_input(grpcclient, 500), sequence_id=9, sequence_start=True, client_timeout=0.2)
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    later = client.infer("sequence", delay_input(httpclient, 2), sequence_id=9, sequence_end=True)
    assert later.as_numpy("WAITED_MS").tolist() == [[2.0]]


def test_a_cancelled_ensemble_request_takes_its_queued_step_out_of_the_step_model_s_queue(server):
    """The ensemble's request is answered at once; its step, queued behind a busy instance of
    plain, leaves the queue and never runs."""
    http = httpclient.InferenceServerClient(server.url)

    def counts(model: str) -> tuple[int, int, int]:
        stats = http.get_inference_statistics(model)["model_stats"][0]
        return (int(stats["inference_stats"]["success"]["count"]), int(stats["inference_stats"]["fail"]["count"]),
                int(stats["execution_count"]))

    before = counts("plain"), counts("through_ensemble")
    running = threading.Thread(target=lambda: httpclient.InferenceServerClient(server.url).infer(
        "plain", delay_input(httpclient, 800)))
    running.start()
    time.sleep(0.2)   # the one instance of plain is busy: the ensemble's step waits in its queue
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        grpc.infer("through_ensemble", delay_input(grpcclient, 0), client_timeout=0.2)
    running.join()
    time.sleep(0.3)
    after = counts("plain"), counts("through_ensemble")
    assert [a - b for a, b in zip(after[0], before[0])] == [1, 1, 1]   # the step failed, never executed
    assert [a - b for a, b in zip(after[1], before[1])] == [0, 1, 0]
    assert value(scrape(server)[1], "nv_inference_request_failure", model="through_ensemble", reason="OTHER",
                 version="1") == 1.0   # an ensemble's failures count as OTHER, its cancellation too, as in Triton


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
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 1\n' in metrics
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 2\n' in metrics


def test_an_ensemble_that_caches_answers_a_repeated_request_without_running_its_steps(server):
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = http.get_inference_statistics("plain")["model_stats"][0]["inference_count"]
    first = http.infer("cached_ensemble", delay_input(httpclient, 3)).as_numpy("WAITED_MS")
    again = grpc.infer("cached_ensemble", delay_input(grpcclient, 3)).as_numpy("WAITED_MS")
    other = http.infer("cached_ensemble", delay_input(httpclient, 4)).as_numpy("WAITED_MS")
    assert first.tolist() == again.tolist() == [[3.0]] and other.tolist() == [[4.0]]
    assert http.get_inference_statistics("plain")["model_stats"][0]["inference_count"] == before + 2
    stats = http.get_inference_statistics("cached_ensemble")["model_stats"][0]
    inference = stats["inference_stats"]   # as Triton 2.51 counts them
    assert inference["cache_hit"]["count"] == 1 and inference["cache_miss"]["count"] == 2
    assert inference["success"]["count"] == 3 and inference["queue"]["count"] == 3
    assert stats["inference_count"] == 2 and stats["execution_count"] == 2
    assert inference["compute_infer"]["count"] == 2
    families = scrape(server)[1]
    assert value(families, "nv_cache_num_hits_per_model", model="cached_ensemble", version="1") == 1.0
    assert value(families, "nv_cache_num_misses_per_model", model="cached_ensemble", version="1") == 2.0
    # the cache's summary, shared with the other models that cache
    lookups, hits, misses = (value(families, name) for name in
                             ("nv_cache_num_lookups", "nv_cache_num_hits", "nv_cache_num_misses"))
    assert lookups == hits + misses and hits >= 1 and misses >= 2
    assert value(families, "nv_cache_num_entries") >= 2 and 0 < value(families, "nv_cache_util") < 1


def test_a_bad_cache_config_stops_serve_with_a_clear_message(tmp_path):
    from tests.servers import run_serve

    done = run_serve(REPO, "--cache-config", "redis,host=x")
    assert done.returncode == 2
    assert b"cache 'redis' is not supported; tritium has the 'local' cache only" in done.stderr
