"""Triton's latency summaries: counts and sums of everything, quantiles of about the last minute."""

from __future__ import annotations

import math

from tritium.broker import latency_summary
from tritium.broker.latency_summary import WindowedQuantiles, parse_quantiles
from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.latency_summary import LatencySummaries
from tests.broker.test_exposition import _one_model

SECOND = 1_000_000_000


def test_quantiles_are_values_observed_at_those_ranks():
    summary = WindowedQuantiles()
    for value in range(1, 101):
        summary.observe(value, 5 * SECOND)
    assert summary.quantiles((0.5, 0.9, 0.99, 1.0), 5 * SECOND) == [50.0, 90.0, 99.0, 100.0]
    assert (summary.count, summary.total) == (100, 5050.0)


def test_an_empty_summary_has_no_quantiles_but_its_count_and_sum():
    summary = WindowedQuantiles()
    assert all(math.isnan(q) for q in summary.quantiles((0.5, 0.99), 0))
    assert (summary.count, summary.total) == (0, 0.0)


def test_observations_leave_the_quantiles_after_the_window_and_stay_in_count_and_sum():
    summary = WindowedQuantiles(max_age_ns=60 * SECOND, age_buckets=5)   # slices of 12 s
    summary.observe(1000, 1 * SECOND)
    summary.observe(1, 30 * SECOND)
    assert summary.quantiles((1.0,), 59 * SECOND) == [1000.0]
    assert summary.quantiles((1.0,), 61 * SECOND) == [1.0]      # the first slice has left the window
    assert all(math.isnan(q) for q in summary.quantiles((0.5,), 100 * SECOND))
    assert (summary.count, summary.total) == (2, 1001.0)


def test_a_slice_keeps_a_bounded_sample_of_what_it_saw(monkeypatch):
    monkeypatch.setattr(latency_summary, "SLICE_CAPACITY", 100)
    summary = WindowedQuantiles()
    for value in range(10_000):
        summary.observe(value, SECOND)
    assert summary.count == 10_000
    median = summary.quantiles((0.5,), SECOND)[0]
    assert 2_500 < median < 7_500   # a sample of 100 from a uniform spread


def test_a_busy_slice_s_sample_weighs_for_every_observation_it_stands_for(monkeypatch):
    monkeypatch.setattr(latency_summary, "SLICE_CAPACITY", 1000)
    summary = WindowedQuantiles()
    for _ in range(10_000):
        summary.observe(100, 1 * SECOND)    # a busy slice: 1,000 of its 10,000 kept
    for _ in range(1_000):
        summary.observe(1, 13 * SECOND)     # a quiet one: all kept
    assert summary.quantiles((0.05, 0.5, 0.95), 13 * SECOND) == [1.0, 100.0, 100.0]


def test_summary_quantiles_are_read_as_triton_reads_them():
    assert parse_quantiles("0.5:0.05,0.9:0.01") == (((0.5, 0.05), (0.9, 0.01)), [])
    assert parse_quantiles("0.5:0.05,bad,0.99:x,1.5:0.1,0.999:0.001") == (
        ((0.5, 0.05), (0.999, 0.001)), ["bad", "0.99:x", "1.5:0.1"])


def test_the_metrics_page_writes_summaries_as_triton_does():
    registry = _one_model()
    (version,) = registry.versions.values()
    version.stats.summaries = LatencySummaries()
    for total_us in (100, 200, 300):
        version.stats.record_success(total_us * 1000, 10_000, 1, (1000, 2000, 3000))
    settings = MetricsSettings(summary_latencies=True, summary_quantiles=(0.5, 0.9))
    text = render(TritonCollector(registry, settings)).decode()
    assert ("# HELP nv_inference_request_summary_us Summary of inference request duration in microseconds "
            "(includes cached requests)\n# TYPE nv_inference_request_summary_us summary\n"
            'nv_inference_request_summary_us_count{model="m",version="1"} 3\n'
            'nv_inference_request_summary_us_sum{model="m",version="1"} 600\n'
            'nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 200\n'
            'nv_inference_request_summary_us{model="m",version="1",quantile="0.9"} 300\n') in text
    assert 'nv_inference_compute_output_summary_us{model="m",version="1",quantile="0.5"} 3\n' in text
    assert "nv_cache_hit_summary_per_model" not in text
    assert "summary" not in render(TritonCollector(registry, MetricsSettings())).decode()


def test_an_observation_made_while_a_scrape_reads_the_slices_succeeds(monkeypatch):
    """The broker's loop observes on its own thread while the metrics thread scrapes: the scrape
    must hold no view of a slice, which the loop's append would then be refused to grow."""
    summary = WindowedQuantiles()
    summary.observe(1, SECOND)
    concatenate = latency_summary.np.concatenate

    def observing_meanwhile(arrays, *args, **kwargs):
        if summary.count == 1:
            summary.observe(2, SECOND)   # the loop, between the scrape's reads (BufferError, were a view held)
        return concatenate(arrays, *args, **kwargs)

    monkeypatch.setattr(latency_summary.np, "concatenate", observing_meanwhile)
    assert summary.quantiles((1.0,), SECOND) == [1.0]
    assert summary.count == 2
