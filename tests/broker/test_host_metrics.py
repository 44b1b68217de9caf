"""The hosts' nv_cpu_* and nv_gpu_* families in /metrics: as the hosts report them, and left out
as Triton leaves them out (flags off, or no GPU anywhere)."""

from __future__ import annotations

import pytest

from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tritium.broker.registry import Registry
from tritium.protocol import HostMetrics

GPU = {"uuid": "GPU-0", "utilization": 0.5, "memory_total": 2, "memory_used": 1, "power_usage": 100.0,
       "power_limit": 300.0}


def families(reports: dict[str, HostMetrics], **settings) -> dict[str, list[str]]:
    """Each nv_cpu_/nv_gpu_ family declared, with its sample lines."""
    registry = Registry()
    registry.host_metrics.update(reports)
    text = render(TritonCollector(registry, MetricsSettings(**settings))).decode()
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE nv_")]
    return {name: [line for line in text.splitlines() if line.startswith(name + "{")]
            for name in declared if name.startswith(("nv_cpu_", "nv_gpu_"))}


def test_a_gpu_host_reports_each_gpu_family_per_gpu():
    found = families({"cpu-host": HostMetrics("cpu-host", 0.25, 8, 4, []),
                      "gpu-host": HostMetrics("gpu-host", 0.5, 2, 1, [GPU])})
    assert found["nv_gpu_power_limit"] == ['nv_gpu_power_limit{gpu_uuid="GPU-0",host="gpu-host"} 300.0']
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
