"""Per model-version statistics with the meaning of Triton's statistics extension (reference 2.4)."""

from __future__ import annotations

import json
import time

import pytest

from tritium.broker.stats import Duration, ModelVersionStats

DURATION_KEYS = {"count", "ns"}
INFERENCE_STATS_KEYS = {"success", "fail", "queue", "compute_input", "compute_infer",
                        "compute_output", "cache_hit", "cache_miss"}


def run_batch(stats: ModelVersionStats, requests: list[tuple[int, int, int]],
              timings: tuple[int, int, int], ok: list[bool] | None = None) -> None:
    """Record one execution the way the scheduler does: requests are (total_ns, queue_ns, batch_size)."""
    ok = ok or [True] * len(requests)
    if any(ok):
        stats.record_execution(sum(bs for _, _, bs in requests), timings)
    for (total_ns, queue_ns, batch_size), good in zip(requests, ok):
        if good:
            stats.record_success(total_ns, queue_ns, batch_size, timings)
        else:
            stats.record_failure(total_ns)


def all_numbers(value) -> bool:
    """True when every leaf of a stats document is a JSON number (never a string or null)."""
    if isinstance(value, dict):
        return all(all_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(all_numbers(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def test_duration_accumulates():
    d = Duration()
    d.add(5)
    d.add(7, count=3)
    assert (d.count, d.ns) == (4, 12)
    assert d.as_dict() == {"count": 4, "ns": 12}


def test_fresh_stats_are_all_zero():
    doc = ModelVersionStats().as_dict("m", 1)
    assert doc["inference_count"] == 0
    assert doc["execution_count"] == 0
    assert doc["last_inference"] == 0
    assert doc["batch_stats"] == []
    for key in INFERENCE_STATS_KEYS:
        assert doc["inference_stats"][key] == {"count": 0, "ns": 0}


def test_success_and_queue_count_requests_inference_count_sums_batch_sizes():
    stats = ModelVersionStats()
    # One execution of 3 requests with batch sizes 2, 1, 5 (executed batch size 8).
    run_batch(stats, [(1000, 100, 2), (2000, 200, 1), (3000, 300, 5)], (10, 20, 30))
    doc = stats.as_dict("m", 1)
    inference = doc["inference_stats"]
    assert inference["success"] == {"count": 3, "ns": 6000}
    assert inference["queue"] == {"count": 3, "ns": 600}
    assert inference["queue"]["count"] == inference["success"]["count"]
    assert doc["inference_count"] == 8
    assert doc["execution_count"] == 1


def test_compute_stats_are_per_request_and_add_the_batch_interval_for_each():
    stats = ModelVersionStats()
    run_batch(stats, [(1000, 100, 1), (1000, 100, 1)], (10, 20, 30))
    inference = stats.as_dict("m", 1)["inference_stats"]
    assert inference["compute_input"] == {"count": 2, "ns": 20}
    assert inference["compute_infer"] == {"count": 2, "ns": 40}
    assert inference["compute_output"] == {"count": 2, "ns": 60}
    # compute_*.count == success.count - cache_hit.count
    assert inference["compute_infer"]["count"] == (
        inference["success"]["count"] - inference["cache_hit"]["count"])


def test_batch_stats_count_executions_per_executed_batch_size_sorted():
    stats = ModelVersionStats()
    run_batch(stats, [(1, 0, 1), (1, 0, 3)], (1, 2, 3))      # batch size 4
    run_batch(stats, [(1, 0, 1)], (4, 5, 6))                 # batch size 1
    run_batch(stats, [(1, 0, 2), (1, 0, 2)], (7, 8, 9))      # batch size 4 again
    doc = stats.as_dict("m", 1)
    assert doc["execution_count"] == 3
    assert doc["inference_count"] == 9
    assert doc["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 4},
         "compute_infer": {"count": 1, "ns": 5}, "compute_output": {"count": 1, "ns": 6}},
        {"batch_size": 4, "compute_input": {"count": 2, "ns": 8},
         "compute_infer": {"count": 2, "ns": 10}, "compute_output": {"count": 2, "ns": 12}},
    ]
    # Triton emits no top-level "count" in a batch_stats entry.
    assert all("count" not in entry for entry in doc["batch_stats"])
    # Executions times batch sizes give back the inferences.
    assert sum(e["batch_size"] * e["compute_infer"]["count"] for e in doc["batch_stats"]) == 9


def test_failures_count_in_fail_only():
    stats = ModelVersionStats()
    stats.record_failure(500)
    stats.record_failure(700)
    doc = stats.as_dict("m", 1)
    inference = doc["inference_stats"]
    assert inference["fail"] == {"count": 2, "ns": 1200}
    assert inference["success"] == {"count": 0, "ns": 0}
    assert inference["queue"] == {"count": 0, "ns": 0}
    assert inference["compute_infer"] == {"count": 0, "ns": 0}
    assert doc["inference_count"] == 0
    assert doc["execution_count"] == 0
    assert doc["batch_stats"] == []


def test_a_batch_with_a_failed_request_counts_successes_and_failures_apart():
    stats = ModelVersionStats()
    run_batch(stats, [(1000, 10, 2), (2000, 20, 3)], (1, 2, 3), ok=[True, False])
    doc = stats.as_dict("m", 1)
    inference = doc["inference_stats"]
    assert inference["success"] == {"count": 1, "ns": 1000}
    assert inference["fail"] == {"count": 1, "ns": 2000}
    assert inference["queue"]["count"] == 1
    assert doc["inference_count"] == 2
    assert doc["execution_count"] == 1


def test_last_inference_is_milliseconds_since_the_epoch():
    stats = ModelVersionStats()
    before = time.time_ns() // 1_000_000
    stats.record_success(1, 0, 1, (0, 0, 0))
    after = time.time_ns() // 1_000_000
    assert before <= stats.as_dict("m", 1)["last_inference"] <= after
    failed = ModelVersionStats()
    failed.record_failure(1)
    assert failed.as_dict("m", 1)["last_inference"] >= before


def test_values_are_cumulative_and_monotonic():
    stats = ModelVersionStats()
    run_batch(stats, [(100, 10, 1)], (1, 2, 3))
    first = stats.as_dict("m", 1)
    run_batch(stats, [(100, 10, 1)], (1, 2, 3))
    second = stats.as_dict("m", 1)
    for key in INFERENCE_STATS_KEYS:
        for field in ("count", "ns"):
            assert second["inference_stats"][key][field] >= first["inference_stats"][key][field]
    assert second["inference_stats"]["success"] == {"count": 2, "ns": 200}
    # An earlier document is not changed by later records.
    assert first["inference_stats"]["success"] == {"count": 1, "ns": 100}


def test_as_dict_has_triton_shape_and_only_numbers():
    stats = ModelVersionStats()
    run_batch(stats, [(1000, 100, 2)], (10, 20, 30))
    stats.record_failure(5)
    doc = stats.as_dict("my_model", 3)
    assert list(doc) == ["name", "version", "last_inference", "inference_count", "execution_count",
                         "inference_stats", "response_stats", "batch_stats", "memory_usage"]
    assert doc["name"] == "my_model"
    assert doc["version"] == "3"
    assert isinstance(doc["version"], str)
    assert set(doc["inference_stats"]) == INFERENCE_STATS_KEYS
    for value in doc["inference_stats"].values():
        assert set(value) == DURATION_KEYS
    for entry in doc["batch_stats"]:
        assert set(entry) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
    assert doc["response_stats"] == {}
    assert doc["memory_usage"] == []
    numeric = {k: v for k, v in doc.items() if k not in ("name", "version")}
    assert all_numbers(numeric)
    # It survives a JSON round trip unchanged (what the gateway sends).
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize("version", [1, 42])
def test_version_is_a_decimal_string(version):
    assert ModelVersionStats().as_dict("m", version)["version"] == str(version)
