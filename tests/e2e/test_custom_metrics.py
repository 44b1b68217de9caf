"""A Python model's own metrics (``pb_utils.MetricFamily``) on /metrics, over both of its instances."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.metrics_text import scrape, value
from tests.servers import TritiumServer

LABELS = {"model": "py_metrics", "version": "1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(Path(__file__).parent / "python_repo" / "py_metrics", repo / "py_metrics")   # two instances
    with TritiumServer(repo, "--model-control-mode", "explicit", "--load-model", "py_metrics") as running:
        yield running


def infer(client, x: float) -> float:
    return float(client.infer("py_metrics", [_input(x)]).as_numpy("VALUE")[0])


def scraped_when(server, ready, timeout_s: float = 10.0):
    """The samples once ``ready(samples)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        text, samples = scrape(server)
        if ready(samples) or time.monotonic() > deadline:
            return text, samples
        time.sleep(0.1)


def test_counters_gauges_and_histograms_add_up_over_the_instances(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    xs = [0.5, 2, 3, 20, 1, 2.5, 9, 10]
    futures = [client.async_infer("py_metrics", [_input(x)]) for x in xs]   # both instances get some
    for future in futures:
        future.get_result()
    # A scrape asks the instances first: it shows every update made before it, as Triton's does.
    text, samples = scrape(server)
    assert value(samples, "py_metrics_requests", **LABELS) == len(xs)
    assert "# HELP py_metrics_requests Requests the model answered\n# TYPE py_metrics_requests counter\n" in text
    assert "# TYPE py_metrics_last_x gauge\n" in text and "# TYPE py_metrics_x histogram\n" in text
    assert value(samples, "py_metrics_last_x", **LABELS) in xs
    assert value(samples, "py_metrics_x_count", **LABELS) == len(xs)
    assert value(samples, "py_metrics_x_sum", **LABELS) == sum(xs)
    assert [value(samples, "py_metrics_x_bucket", **LABELS, le=le) for le in ("1", "2.5", "10", "+Inf")] == [2, 4, 7, 8]
    for _ in range(4):
        infer(client, 7)
    _, samples = scrape(server)
    assert value(samples, "py_metrics_requests", **LABELS) == len(xs) + 4
    assert value(samples, "py_metrics_last_x", **LABELS) == 7   # every instance's latest set


def test_an_update_triton_refuses_is_refused_with_its_words(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as caught:
        infer(client, -1)
    assert re.fullmatch(r"Failed to increment metric value: Failed to process the request for model "
                        r"'py_metrics_0_[01]', message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                        r"monotonically by non-negative values\.", caught.value.message())
    assert infer(client, 1) >= 1   # the model serves on


def test_the_series_go_with_the_model(server):
    client = httpclient.InferenceServerClient(server.url)
    client.unload_model("py_metrics")
    text, _ = scraped_when(server, lambda s: not any(name.startswith("py_metrics_") for name, _ in s))
    assert "py_metrics_" not in text.replace('model="py_metrics"', "")
    client.load_model("py_metrics")
    infer(client, 4)
    _, samples = scraped_when(server, lambda s: value(s, "py_metrics_requests", **LABELS) == 1)
    assert value(samples, "py_metrics_requests", **LABELS) == 1   # a new load counts from zero


def _input(x: float):
    tensor = httpclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    return tensor
