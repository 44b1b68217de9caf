"""Prometheus metrics with Triton's names, labels and help texts, served by the broker.

The broker sees every request, so its statistics are the source: a collector reads them
at scrape time, and the request path pays nothing for metrics. Per-model families carry
``model`` and ``version`` labels, plus ``_<key>`` for each ``metric_tags`` entry; host
families (CPU, memory, GPUs) come from the host agents and carry a ``host`` label.

The endpoint follows Triton: GET /metrics (or /metrics/) answers the text format, another
path answers 200 with an empty body, another method 405.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.core import Metric

from tritium.broker.exposition import number_text, text_format
from tritium.broker.latency_summary import DEFAULT_QUANTILES, WindowedQuantiles
from tritium.broker.registry import ModelVersion, Registry, VersionState
from tritium.broker.response_cache import ResponseCache

log = logging.getLogger(__name__)

DEFAULT_HISTOGRAM_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)

# (name, help, kind, what of ModelVersionStats) of the per-model families, as Triton names them.
_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s.compute_output.ns // 1000),
)
# Triton's per-model response cache families, exported for the models that cache.
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.cache_hit.count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.cache_miss.count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss.ns // 1000),
)
# Triton's summary of the response cache, exported while the server has one (values read as a scrape comes).
_CACHE_SUMMARY = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]", lambda c: c.used_bytes / c.capacity_bytes),
    ("nv_cache_num_entries", "Number of responses stored in response cache", len),
    ("nv_cache_num_hits", "Number of cache hits in response cache", lambda c: c.hits),
    ("nv_cache_num_misses", "Number of cache misses in response cache", lambda c: c.misses),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache", lambda c: c.hits + c.misses),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache", lambda c: c.evictions),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
     lambda c: c.lookup_ns // 1000),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
     lambda c: c.insertion_ns // 1000),
)
# Triton's latency summaries, (name, help, the summary of a version's LatencySummaries); the
# request summary is left out for a model that caches, and the cache's two are only for those.
_SUMMARIES = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)", "request"),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output"),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss"),
)
_FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
_FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")   # in the order Triton 2.51 writes them


@dataclass(frozen=True)
class MetricsSettings:
    address: str = "0.0.0.0"
    port: int = 8002
    histogram_latencies: bool = False
    counter_latencies: bool = True   # Triton's counter_latencies: the *_duration_us counters
    summary_latencies: bool = False  # Triton's summary_latencies: the *_summary_us families
    summary_quantiles: tuple[float, ...] = tuple(rank for rank, _ in DEFAULT_QUANTILES)
    cpu: bool = True   # Triton's --allow-cpu-metrics: the hosts' nv_cpu_* families
    gpu: bool = True   # Triton's --allow-gpu-metrics: the hosts' nv_gpu_* families


def _counter(name: str, documentation: str) -> Metric:
    """A counter family declared as ``name``, ``_total`` included (prometheus_client's Metric
    keeps a counter's name without it, and a family without samples is declared by it)."""
    family = Metric(name, documentation, "counter")
    family.name = name
    return family


def version_labels(version) -> dict[str, str]:
    labels = {"model": version.name, "version": str(version.version)}
    for key, value in version.definition.config.metric_tags.items():
        labels[f"_{key}"] = value
    return labels


def _counter_families(table, versions):
    """One counter family per (name, help, value) row, with a sample per version."""
    for name, documentation, value in table:
        family = Metric(name, documentation, "counter")
        for version in versions:
            family.add_sample(name, version_labels(version), value(version.stats))
        yield family


def _has_summary(version, which: str) -> bool:
    """As Triton: no request summary for a model that caches, cache summaries only for those."""
    if which == "request":
        return not version.caches
    return version.caches or not which.startswith("cache")


class TritonCollector:
    def __init__(self, registry: Registry, settings: MetricsSettings,
                 before_scrape: Callable[[], None] = lambda: None, cache: ResponseCache | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.cache = cache   # the broker's response cache, if the server has one
        self.before_scrape = before_scrape   # in the metrics server's thread: brings the custom metrics up to date

    def collect(self):
        """Triton's families and tritium's own, then the models' custom families."""
        own = list(self._own_families())
        yield from own
        yield from self.registry.custom_metrics.families({family.name for family in own})

    def _own_families(self):
        versions = [v for v in list(self.registry.versions.values()) if v.state == VersionState.READY]
        counters = _COUNTERS if self.settings.counter_latencies else \
            tuple(row for row in _COUNTERS if not row[0].endswith("_duration_us"))
        yield from _counter_families(counters, versions)
        failure = Metric(_FAILURE[0], _FAILURE[1], "counter")
        for version in versions:
            for reason in _FAILURE_REASONS:
                failure.add_sample(_FAILURE[0], {**version_labels(version), "reason": reason},
                                   version.stats.failures.get(reason, 0))
        yield failure
        pending = Metric("nv_inference_pending_request_count",
                         "Instantaneous number of pending requests awaiting execution per-model.", "gauge")
        load = Metric("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        for version in versions:
            pending.add_sample("nv_inference_pending_request_count", version_labels(version),
                               version.pending_requests())
            if version.load_seconds is not None:
                load.add_sample("nv_model_load_duration_secs", version_labels(version), version.load_seconds)
        yield pending
        yield load
        caching = [v for v in versions if v.caches]
        if caching:   # the cache families exist only where a model caches, as in Triton
            yield from _counter_families(_CACHE_COUNTERS, caching)
        yield from self._scaling(versions)
        if self.settings.histogram_latencies:
            yield self._histogram(versions)
        if self.settings.summary_latencies:
            yield from self._summaries(versions)
        yield from self._hosts()
        yield from self._cache_summary()
        yield from self._tensor_pools()

    def _cache_summary(self):
        if self.cache is None:
            return
        for name, documentation, value in _CACHE_SUMMARY:
            family = Metric(name, documentation, "gauge")
            family.add_sample(name, {}, value(self.cache))
            yield family

    def _scaling(self, versions):
        """tritium's own: instances per host, and the cold starts of autoscaled models."""
        instances = Metric("tritium_instances", "Instance processes serving a model version, per host", "gauge")
        counts = self._no_instances(versions)
        for version in versions:
            for instance in version.instances:
                if instance.passive:   # never given work: not serving
                    continue
                agent = self.registry.agents.get(instance.agent)
                key = (version.name, version.version, agent.host if agent else "?")
                counts[key] = counts.get(key, 0) + 1
        for (model, number, host), count in sorted(counts.items()):
            instances.add_sample("tritium_instances", {"model": model, "version": str(number), "host": host}, count)
        yield instances
        scaled = [v for v in versions if v.scale is not None]
        if not scaled:
            return
        starts = _counter("tritium_cold_starts_total", "Cold starts: a request found no instance of the model")
        duration = Metric("tritium_cold_start_duration_us",
                          "Cumulative time from a cold start's first request to its instance being ready, in "
                          "microseconds", "counter")
        for version in scaled:
            labels = {"model": version.name, "version": str(version.version)}
            starts.add_sample("tritium_cold_starts_total", labels, version.scale.cold_starts)
            duration.add_sample("tritium_cold_start_duration_us", labels, version.scale.cold_start_ns_total // 1000)
        yield starts
        yield duration

    def _no_instances(self, versions) -> dict[tuple, int]:
        """0 for each (version, host that serves its model): a model scaled to zero keeps its series."""
        agents = list(self.registry.agents.values())
        return {(version.name, version.version, agent.host): 0
                for version in versions if not version.ensemble
                for agent in agents if agent.serves(version.name)}

    @staticmethod
    def _histogram(versions) -> Metric:
        name = "nv_inference_first_response_histogram_ms"
        family = Metric(name, "Duration from request to first response in milliseconds", "histogram")
        for version in versions:
            stats, labels = version.stats, version_labels(version)
            cumulative = 0
            for bound, count in zip(stats.histogram_bounds_ms + (float("inf"),), stats.histogram_counts):
                cumulative += count
                family.add_sample(f"{name}_bucket", {**labels, "le": number_text(bound)}, cumulative)
            family.add_sample(f"{name}_count", labels, cumulative)
            family.add_sample(f"{name}_sum", labels, stats.histogram_sum_ms)
        return family

    def _summaries(self, versions: list[ModelVersion]) -> Iterator[Metric]:
        now = time.monotonic_ns()
        ranks = self.settings.summary_quantiles
        for name, documentation, which in _SUMMARIES:
            family = Metric(name, documentation, "summary")
            for version in versions:
                summaries = version.stats.summaries
                if summaries is None or not _has_summary(version, which):
                    continue
                summary: WindowedQuantiles = getattr(summaries, which)
                labels = version_labels(version)
                family.add_sample(f"{name}_count", labels, summary.count)
                family.add_sample(f"{name}_sum", labels, summary.total)
                for rank, value in zip(ranks, summary.quantiles(ranks, now)):
                    family.add_sample(name, {**labels, "quantile": number_text(rank)}, value)
            if family.samples:   # (as prometheus-cpp, which writes no family without one)
                yield family

    def _hosts(self):
        hosts = dict(self.registry.host_metrics)
        gauges = {
            "nv_cpu_utilization": ("CPU utilization rate [0.0 - 1.0]", "cpu_utilization"),
            "nv_cpu_memory_total_bytes": ("CPU total memory (RAM), in bytes", "memory_total"),
            "nv_cpu_memory_used_bytes": ("CPU used memory (RAM), in bytes", "memory_used"),
        }
        for name, (documentation, key) in gauges.items() if self.settings.cpu else ():
            family = Metric(name, documentation, "gauge")
            for host, sample in hosts.items():
                family.add_sample(name, {"host": host}, getattr(sample, key))
            yield family
        gpu_gauges = {
            "nv_gpu_utilization": ("GPU utilization rate [0.0 - 1.0)", "utilization"),
            "nv_gpu_memory_total_bytes": ("GPU total memory, in bytes", "memory_total"),
            "nv_gpu_memory_used_bytes": ("GPU used memory, in bytes", "memory_used"),
            "nv_gpu_power_usage": ("GPU power usage in watts", "power_usage"),
            "nv_gpu_power_limit": ("GPU power management limit in watts", "power_limit"),
        }
        # Like Triton, no GPU families at all where no host has a GPU (not families without samples).
        with_gpus = self.settings.gpu and any(sample.gpus for sample in hosts.values())
        # Labelled by gpu_uuid alone, as in Triton (perf_analyzer's --collect-metrics matches
        # exactly `{gpu_uuid="..."} `); a UUID names one GPU of one host, tritium_gpus says which.
        gpus = {}   # by UUID, once: hosts that share a GPU (containers of one machine) report it each
        for sample in hosts.values():
            for gpu in sample.gpus:
                gpus.setdefault(gpu["uuid"], gpu)
        for name, (documentation, key) in gpu_gauges.items() if with_gpus else ():
            family = Metric(name, documentation, "gauge")
            for uuid, gpu in gpus.items():
                family.add_sample(name, {"gpu_uuid": uuid}, gpu.get(key, 0))
            yield family
        if with_gpus:
            where = Metric("tritium_gpus", "A worker host's GPUs: 1 for each, labelled by host and gpu_uuid", "gauge")
            for host, sample in hosts.items():
                for gpu in sample.gpus:
                    where.add_sample("tritium_gpus", {"gpu_uuid": gpu["uuid"], "host": host}, 1)
            yield where

    def _tensor_pools(self):
        """tritium's own: each gateway's and instance's shared memory for large tensors (kind
        ``request`` for a gateway's inputs, ``answer`` for an instance's outputs, ``bls`` for the
        inputs of its model's BLS calls)."""
        pools = list(self.registry.tensor_pools.items())
        size = Metric("tritium_tensor_pool_bytes", "Size of a process's shared memory pool for large tensors, "
                      "in bytes", "gauge")
        used = Metric("tritium_tensor_pool_used_bytes", "Bytes of a process's tensor pool held by tensors in flight",
                      "gauge")
        overflows = _counter("tritium_tensor_pool_overflows_total",
                             "Large tensors a process sent as bytes because its tensor pool had no room")
        renewals = _counter("tritium_tensor_pool_renewals_total",
                            "Times a process replaced its tensor pool by a new one, the slots of the old given up for lost")
        for peer, reported in pools:
            for kind, total, in_use, overflowed, renewed in reported:
                labels = {"process": peer.decode(errors="replace"), "kind": kind}
                size.add_sample("tritium_tensor_pool_bytes", labels, total)
                used.add_sample("tritium_tensor_pool_used_bytes", labels, in_use)
                overflows.add_sample("tritium_tensor_pool_overflows_total", labels, overflowed)
                renewals.add_sample("tritium_tensor_pool_renewals_total", labels, renewed)
        yield size
        yield used
        yield overflows
        yield renewals


def render(collector: TritonCollector) -> bytes:
    return text_format(collector.collect()).encode()


def start_metrics_server(collector: TritonCollector, settings: MetricsSettings) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = b""
            if self.path.split("?", 1)[0] in ("/metrics", "/metrics/"):
                try:
                    collector.before_scrape()
                    body = render(collector)
                except Exception:
                    log.exception("rendering metrics failed")
                    self.send_error(500)
                    return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _not_allowed(self) -> None:
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's signature)
            pass

    server = ThreadingHTTPServer((settings.address, settings.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", settings.address, server.server_address[1])
    return server
