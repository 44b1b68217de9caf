"""CPU, memory and GPU figures of a host, for Triton's nv_cpu_* and nv_gpu_* metrics.

CPU and memory come from /proc; GPUs from NVML (the ``pynvml`` module of nvidia-ml-py)
when it is installed and a GPU is there, and are simply absent otherwise.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


class HostSampler:
    def __init__(self) -> None:
        self._last_cpu = self._cpu_times()
        self._nvml = self._start_nvml()

    @staticmethod
    def _cpu_times() -> tuple[int, int]:
        """(busy, total) jiffies of all CPUs."""
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return 0, 0
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        total = sum(values[:8])
        return total - idle, total

    @staticmethod
    def _memory() -> tuple[int, int]:
        info = {}
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return 0, 0
        total = info.get("MemTotal", 0)
        return total, total - info.get("MemAvailable", info.get("MemFree", 0))

    @staticmethod
    def _start_nvml():
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception:  # no library, no driver, or no GPU: no GPU metrics
            return None

    def sample(self) -> dict:
        busy, total = self._cpu_times()
        last_busy, last_total = self._last_cpu
        self._last_cpu = (busy, total)
        utilization = (busy - last_busy) / (total - last_total) if total > last_total else 0.0
        memory_total, memory_used = self._memory()
        return {"cpu_utilization": round(utilization, 4), "memory_total": memory_total,
                "memory_used": memory_used, "gpus": self._gpus()}

    def _gpus(self) -> list[dict]:
        nvml = self._nvml
        if nvml is None:
            return []
        gpus = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                gpus.append({
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "utilization": nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    "memory_total": memory.total, "memory_used": memory.used,
                    "power_usage": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "power_limit": nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                })
        except Exception as exc:
            log.warning("reading GPU metrics failed: %s", exc)
        return gpus
