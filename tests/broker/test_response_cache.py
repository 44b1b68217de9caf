"""The response cache's entries and the summary of its use that the metrics page shows, as Triton's."""

from __future__ import annotations

from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import Registry
from tritium.broker.response_cache import CachedResponse, ResponseCache
from tritium.protocol import Response


def entry(size: int) -> CachedResponse:
    return CachedResponse(Response(1), b"", (), size)


def test_the_least_recently_used_entry_is_evicted_and_every_lookup_counted():
    cache = ResponseCache(1000)
    assert cache.lookup(b"a") is None
    cache.insert(b"a", entry(400))
    cache.insert(b"b", entry(400))
    assert cache.lookup(b"a") is not None     # a is now the most recently used
    cache.insert(b"c", entry(400))            # room for it: b goes
    assert cache.lookup(b"b") is None and cache.lookup(b"c") is not None
    assert (len(cache), cache.used_bytes) == (2, 800)
    assert (cache.hits, cache.misses, cache.evictions) == (2, 2, 1)
    cache.insert(b"d", entry(1001))           # larger than the whole cache: not kept, nothing evicted
    assert (len(cache), cache.evictions) == (2, 1)


def test_the_metrics_page_shows_the_cache_s_summary_only_when_there_is_a_cache():
    cache = ResponseCache(1000)
    cache.insert(b"a", entry(250))
    cache.lookup(b"a")
    cache.lookup(b"b")
    text = render(TritonCollector(Registry(), MetricsSettings(), cache=cache)).decode()
    for line in ("nv_cache_util 0.25", "nv_cache_num_entries 1", "nv_cache_num_hits 1", "nv_cache_num_misses 1",
                 "nv_cache_num_lookups 2", "nv_cache_num_evictions 0"):
        assert f"\n{line}\n" in text, line
    assert "# TYPE nv_cache_lookup_duration gauge\n" in text and "# TYPE nv_cache_insertion_duration gauge\n" in text
    assert "nv_cache" not in render(TritonCollector(Registry(), MetricsSettings())).decode()
