"""The hosts' nv_cpu_* and nv_gpu_* families in /metrics: as the hosts report them, and left out
as Triton leaves them out (flags off, or no GPU anywhere)."""

from __future__ import annotations

import re

import pytest

from tritium.broker.exposition import number_text
from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import Registry
from tritium.protocol import HostMetrics

GPU = {"uuid": "GPU-0", "utilization": 0.5, "memory_total": 2, "memory_used": 1, "power_usage": 100.0,
       "power_limit": 300.0}


def collector_with(*reports: HostMetrics, **settings) -> TritonCollector:
    registry = Registry()
    registry.host_metrics.update({report.host: report for report in reports})
    return TritonCollector(registry, MetricsSettings(**settings))


def families(reports: dict[str, HostMetrics], **settings) -> dict[str, list[str]]:
    """Each nv_cpu_/nv_gpu_ family declared, with its sample lines."""
    text = render(collector_with(*reports.values(), **settings)).decode()
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE nv_")]
    return {name: [line for line in text.splitlines() if line.startswith(name + "{")]
            for name in declared if name.startswith(("nv_cpu_", "nv_gpu_"))}


def test_a_gpu_host_reports_each_gpu_family_per_gpu():
    found = families({"cpu-host": HostMetrics("cpu-host", 0.25, 8, 4, []),
                      "gpu-host": HostMetrics("gpu-host", 0.5, 2, 1, [GPU])})
    assert found["nv_gpu_power_limit"] == ['nv_gpu_power_limit{gpu_uuid="GPU-0"} 300']
    assert found["nv_cpu_utilization"] == ['nv_cpu_utilization{host="cpu-host"} 0.25',
                                           'nv_cpu_utilization{host="gpu-host"} 0.5']
    assert len([name for name in found if name.startswith("nv_gpu_")]) == 5


def test_without_a_gpu_anywhere_there_are_no_gpu_families():
    assert sorted(families({"cpu-host": HostMetrics("cpu-host", 0.25, 8, 4, [])})) == [
        "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes", "nv_cpu_utilization"]


@pytest.mark.parametrize("flag, kept", [("cpu", "nv_gpu_"), ("gpu", "nv_cpu_")])
def test_each_flag_leaves_its_families_out(flag, kept):
    found = families({"gpu-host": HostMetrics("gpu-host", 0.5, 2, 1, [GPU])}, **{flag: False})
    assert found and all(name.startswith(kept) for name in found)


def test_gpu_lines_read_as_perf_analyzer_reads_them():
    """perf_analyzer's --collect-metrics pattern: the UUID as the only label, the value as digits."""
    report = HostMetrics("gpu-host", 0.5, 2, 1, [{"uuid": "GPU-7", "utilization": 0.41, "memory_total": 85899345920,
                                                  "memory_used": 2000000000, "power_usage": 81.619,
                                                  "power_limit": 700.0}])
    text = render(collector_with(report)).decode()
    read = {name: float(value) for name, value in
            re.findall(r'\n(nv_gpu_\w+)\{gpu_uuid="GPU-7"\} (\d+\.?\d*)\n', text)}
    assert read == {"nv_gpu_utilization": 0.41, "nv_gpu_memory_total_bytes": 85899345920,
                    "nv_gpu_memory_used_bytes": 2000000000, "nv_gpu_power_usage": 81.619,
                    "nv_gpu_power_limit": 700}
    assert 'tritium_gpus{gpu_uuid="GPU-7",host="gpu-host"} 1\n' in text


@pytest.mark.parametrize("value, text", [(0, "0"), (7.0, "7"), (25324961792, "25324961792"), (1e6, "1000000"),
                                         (0.0075, "0.0075"), (5000014.5, "5000014.5"), (1e16, "1e+16"),
                                         (float("inf"), "+Inf"), (float("nan"), "Nan")])
def test_values_are_written_as_triton_writes_them(value, text):
    assert number_text(value) == text


def test_a_gpu_two_hosts_report_is_one_series():
    shared = {**GPU, "uuid": "GPU-S"}
    found = families({"a": HostMetrics("a", 0.5, 2, 1, [shared]), "b": HostMetrics("b", 0.5, 2, 1, [shared])})
    assert found["nv_gpu_utilization"] == ['nv_gpu_utilization{gpu_uuid="GPU-S"} 0.5']
