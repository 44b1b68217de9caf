"""Prometheus metrics with Triton's names and labels, moving with traffic."""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_text import scrape, value
from tests.models import add_sub_model
from tests.servers import TritiumServer

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8, extra='metric_tags { key: "team" value: "vision" }')
    shutil.copytree(Path(__file__).parent / "python_repo" / "py_errors", repo / "py_errors")
    shutil.copytree(Path(__file__).parent / "autoscale_repo" / "lazy", repo / "lazy")   # min 0, idle after 2 s
    with TritiumServer(repo, "--metrics-config", "histogram_latencies=true", "--metrics-config", "summary_latencies=true",
                       "--metrics-interval-ms", "200") as running:
        yield running


def test_triton_families_with_help_and_type(server):
    text, _ = scrape(server)
    for name, kind, help_text in [
        ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
        ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
        ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
        ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
        ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)"),
        ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)"),
        ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
        ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model."),
        ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ]:
        assert f"# HELP {name} {help_text}\n" in text, name
        assert f"# TYPE {name} {kind}\n" in text, name


def test_counters_move_with_traffic(server):
    _, before = scrape(server)
    client = httpclient.InferenceServerClient(server.url)
    a = np.ones((3, 16), dtype=np.float32)
    inputs = [httpclient.InferInput(n, [3, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    for _ in range(4):
        client.infer("add_sub", inputs)
    _, after = scrape(server)
    labels = {"model": "add_sub", "version": "1", "_team": "vision"}
    assert value(after, "nv_inference_request_success", **labels) - value(before, "nv_inference_request_success", **labels) == 4
    assert value(after, "nv_inference_count", **labels) - value(before, "nv_inference_count", **labels) == 12
    assert value(after, "nv_inference_exec_count", **labels) - value(before, "nv_inference_exec_count", **labels) == 4
    assert value(after, "nv_inference_request_duration_us", **labels) > value(before, "nv_inference_request_duration_us", **labels)
    assert value(after, "nv_inference_first_response_histogram_ms_count", **labels) - \
        value(before, "nv_inference_first_response_histogram_ms_count", **labels) == 4
    assert value(after, "nv_inference_first_response_histogram_ms_bucket", **labels, le="100") >= 4
    assert ("nv_model_load_duration_secs", tuple(sorted(labels.items()))) in after


def test_latency_summaries_as_triton_writes_them(server):
    text, before = scrape(server)
    assert "# TYPE nv_inference_request_summary_us summary\n" in text
    assert "# TYPE nv_inference_compute_infer_summary_us summary\n" in text
    assert "nv_cache_hit_summary_per_model" not in text   # no model caches
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    for _ in range(5):
        client.infer("add_sub", inputs)
    text, after = scrape(server)
    labels = {"model": "add_sub", "version": "1", "_team": "vision"}
    for family in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                   "nv_inference_compute_infer_summary_us"):
        assert value(after, f"{family}_count", **labels) - value(before, f"{family}_count", **labels) == 5, family
    median = value(after, "nv_inference_request_summary_us", **labels, quantile="0.5")
    assert 0 < median <= value(after, "nv_inference_request_summary_us", **labels, quantile="0.999")
    assert value(after, "nv_inference_request_summary_us_sum", **labels) >= 5 * median / 2
    # the quantile label last, as Triton writes it
    assert 'nv_inference_request_summary_us{_team="vision",model="add_sub",version="1",quantile="0.99"} ' in text


def test_failures_count_by_reason(server):
    client = httpclient.InferenceServerClient(server.url)
    code = httpclient.InferInput("CODE", [1], "INT32")
    code.set_data_from_numpy(np.array([1], dtype=np.int32))
    _, before = scrape(server)
    with pytest.raises(InferenceServerException):
        client.infer("py_errors", [code])
    _, after = scrape(server)
    labels = {"model": "py_errors", "version": "1"}
    assert value(after, "nv_inference_request_failure", **labels, reason="BACKEND") - \
        value(before, "nv_inference_request_failure", **labels, reason="BACKEND") == 1
    assert value(after, "nv_inference_request_failure", **labels, reason="REJECTED") == 0


def test_host_cpu_and_memory_come_from_the_agents(server):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, samples = scrape(server)
        memory = [v for (name, _), v in samples.items() if name == "nv_cpu_memory_total_bytes"]
        if memory:
            break
        time.sleep(0.2)
    assert memory and memory[0] > 0
    used = [v for (name, _), v in samples.items() if name == "nv_cpu_memory_used_bytes"]
    assert 0 < used[0] <= memory[0]


def test_other_paths_and_methods_as_triton(server):
    base = server.metrics_url.rsplit("/", 1)[0]
    with urllib.request.urlopen(base + "/other") as response:
        assert response.status == 200 and response.read() == b""
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(urllib.request.Request(server.metrics_url, data=b"x", method="POST"))
    assert error.value.code == 405


def instances(samples, model: str) -> dict[str, float]:
    """tritium_instances of a model, by host."""
    return {dict(labels)["host"]: count for (name, labels), count in samples.items()
            if name == "tritium_instances" and ("model", model) in labels}


def test_an_autoscaled_model_scaled_to_zero_keeps_its_instances_series_at_zero(server):
    _, samples = scrape(server)
    assert list(instances(samples, "lazy").values()) == [0], "no instance before the first request"
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    delay = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
    delay.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    client.infer("lazy", [delay])
    _, samples = scrape(server)
    assert list(instances(samples, "lazy").values()) == [1]
    assert value(samples, "tritium_cold_starts_total", model="lazy", version="1") == 1
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and list(instances(samples, "lazy").values()) != [0]:
        time.sleep(0.2)
        _, samples = scrape(server)
    assert list(instances(samples, "lazy").values()) == [0], "scaled back to zero, its series still there"
    assert list(instances(samples, "add_sub").values()) == [1]


def test_host_families_can_be_turned_off_as_in_triton(tmp_path):
    """--allow-cpu-metrics=false and --allow-gpu-metrics=false drop the nv_cpu_* and nv_gpu_* families."""
    add_sub_model(tmp_path, "add_sub", max_batch_size=8)
    with TritiumServer(tmp_path, "--allow-cpu-metrics=false", "--allow-gpu-metrics=false",
                       "--metrics-interval-ms", "200") as quiet:
        time.sleep(0.5)   # a host report has come in by now
        text, _ = scrape(quiet)
    assert "# TYPE nv_inference_count counter\n" in text
    assert "nv_cpu_" not in text and "nv_gpu_" not in text
