"""The broker's view of the Python models' custom metrics: what instances report in their
heartbeats, added up into one series per family and labels as Triton shows it on /metrics."""

from __future__ import annotations

import logging
import threading

import pytest

from tritium.broker.custom_metrics import CustomMetrics
from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import Registry

LABELS = [["model", "m"], ["version", "1"]]


def counter(total: float, name: str = "requests", description: str = "Requests answered") -> list:
    return [name, description, 0, [[LABELS, [total]]]]


def gauge(sets: int, last_set: float | None, increments: float) -> list:
    return ["queue", "Requests waiting", 1, [[LABELS, [sets, last_set, increments]]]]


def histogram(bounds: list, counts: list, total: float) -> list:
    return ["sizes", "Batch sizes", 2, [[LABELS, [bounds, counts, total]]]]


def lines(registry: Registry, name: str) -> list[str]:
    text = render(TritonCollector(registry, MetricsSettings())).decode()
    samples = {name, f"{name}_count", f"{name}_sum", f"{name}_bucket"}
    return [line for line in text.splitlines() if line.split("{")[0].split(" ")[0] in samples
            or line.startswith((f"# HELP {name} ", f"# TYPE {name} "))]


def test_a_counter_is_the_sum_over_instances_and_keeps_what_a_gone_instance_counted():
    registry = Registry()
    metrics = registry.custom_metrics
    metrics.report(b"a", [counter(3)])
    metrics.report(b"b", [counter(4, description="a later description")])
    assert lines(registry, "requests") == [
        "# HELP requests Requests answered", "# TYPE requests counter", 'requests{model="m",version="1"} 7']
    metrics.forget(b"a")
    metrics.report(b"b", [counter(5)])
    assert lines(registry, "requests")[-1] == 'requests{model="m",version="1"} 8'
    metrics.forget(b"b")   # the last instance holding it: the series and its family go
    assert lines(registry, "requests") == []


def test_a_gauge_is_the_latest_set_plus_the_increments_made_since():
    registry = Registry()
    metrics = registry.custom_metrics
    metrics.report(b"a", [gauge(0, None, 2)])
    metrics.report(b"b", [gauge(0, None, 3)])
    assert lines(registry, "queue")[-1] == 'queue{model="m",version="1"} 5'
    metrics.report(b"a", [gauge(1, 10, 0)])          # a sets 10: b's earlier increments are behind it
    metrics.report(b"b", [gauge(0, None, 4)])        # b adds 1 more since
    assert lines(registry, "queue")[-1] == 'queue{model="m",version="1"} 11'
    metrics.report(b"b", [gauge(1, 1, 0.5)])         # b sets 1 and adds a half
    metrics.report(b"a", [gauge(1, 10, 2)])          # a adds 2 after its own set
    assert lines(registry, "queue")[-1] == 'queue{model="m",version="1"} 3.5'
    metrics.forget(b"b")                              # its set stays, and its increments
    assert lines(registry, "queue")[-1] == 'queue{model="m",version="1"} 3.5'


def test_a_histogram_adds_up_its_buckets_as_triton_writes_them():
    registry = Registry()
    metrics = registry.custom_metrics
    metrics.report(b"a", [histogram([0.5, 1, 1e6], [1, 0, 1, 1], 5000002.5)])
    metrics.report(b"b", [histogram([0.5, 1, 1e6], [0, 2, 0, 0], 2)])
    metrics.report(b"c", [histogram([2], [1, 1], 10)])   # other buckets: each count in the first that holds it
    assert lines(registry, "sizes") == [
        "# HELP sizes Batch sizes", "# TYPE sizes histogram",
        'sizes_count{model="m",version="1"} 7',
        'sizes_sum{model="m",version="1"} 5000014.5',
        'sizes_bucket{model="m",version="1",le="0.5"} 1',
        'sizes_bucket{model="m",version="1",le="1"} 3',
        'sizes_bucket{model="m",version="1",le="1000000"} 5',
        'sizes_bucket{model="m",version="1",le="+Inf"} 7',
    ]


def test_a_series_an_instance_reports_no_more_is_forgotten_for_it():
    registry = Registry()
    metrics = registry.custom_metrics
    metrics.report(b"a", [counter(3)])
    metrics.report(b"b", [counter(4)])
    metrics.report(b"a", [])   # its Metric objects deleted: what it counted stays while b holds the series
    assert lines(registry, "requests")[-1] == 'requests{model="m",version="1"} 7'
    metrics.report(b"b", [])
    assert lines(registry, "requests") == []


@pytest.mark.parametrize("family", [
    counter("3"), ["requests", 7, 0, [[LABELS, [3]]]], ["requests", "d", True, [[LABELS, [3]]]],
    ["requests", "d", -1, [[LABELS, [3]]]], ["queue", "d", 1, [[LABELS, [1]]]],
    ["queue", "d", 1, [[LABELS, [1.5, None, 0]]]], ["sizes", "d", 2, [[LABELS, [[1.0], [1], 1.0]]]],
    ["sizes", "d", 2, [[[["k", 1]], [[1.0], [1, 0], 1.0]]]], ["requests", "d", 0, [[LABELS, []]]], "not a family",
])
def test_a_report_that_cannot_be_read_is_left_out_whole(family, caplog):
    registry = Registry()
    metrics = registry.custom_metrics
    with caplog.at_level(logging.WARNING):
        metrics.report(b"a", [family, counter(1, name="readable")])
    assert "cannot be read" in caplog.text
    text = render(TritonCollector(registry, MetricsSettings())).decode()
    assert 'readable{model="m",version="1"} 1' in text
    assert [line for line in text.splitlines() if line.startswith(("requests", "queue", "sizes", "# HELP requests",
                                                                  "# HELP queue", "# HELP sizes"))] == []
    metrics.forget(b"a")
    assert "readable" not in render(TritonCollector(registry, MetricsSettings())).decode()


def test_a_family_made_another_kind_elsewhere_or_named_as_tritons_own_is_left_out(caplog):
    registry = Registry()
    metrics = registry.custom_metrics
    metrics.report(b"a", [counter(3)])
    metrics.report(b"b", [["requests", "made a gauge", 1, [[LABELS, [0, None, 9]]]]])
    metrics.report(b"b", [counter(1, name="nv_inference_request_success")])
    metrics.report(b"c", [["broken", "d", 7, []], counter(1, name="after_the_broken_one")])
    with caplog.at_level(logging.WARNING):
        text = render(TritonCollector(registry, MetricsSettings())).decode()
    assert "nv_inference_request_success is named as one of the server's own" in caplog.text
    assert 'requests{model="m",version="1"} 3' in text and "made a gauge" not in text
    assert text.count("# HELP nv_inference_request_success ") == 1
    assert 'after_the_broken_one{model="m",version="1"} 1' in text and "broken " not in text


def test_a_scrape_waits_until_every_instance_it_asked_answered_that_ask():
    metrics = CustomMetrics()
    done, nobody, joined = threading.Event(), threading.Event(), threading.Event()
    metrics.asked(1, set(), nobody)
    assert nobody.is_set() and not metrics.waiting(joined)
    metrics.asked(2, {b"i0", b"i1"}, done)
    assert metrics.waiting(joined)   # a scrape meanwhile waits for the same answers
    metrics.heard(b"i0", None)        # a periodic heartbeat, perhaps made before the ask
    metrics.heard(b"i0", 1)           # the answer to an older ask
    assert not done.is_set()
    metrics.heard(b"i0", 2)
    assert not done.is_set()
    metrics.forget(b"i1")   # gone: it will not answer
    assert done.is_set() and joined.is_set() and not metrics.waiting(threading.Event())
