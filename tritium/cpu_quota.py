"""Whether this process runs under a CPU quota: a container's CPU limit, read from its cgroup.

Under a quota (Kubernetes ``resources.limits.cpu``, ``docker run --cpus``) every microsecond
spent polling counts against the limit, and a process that reaches it is stopped until the
next period (100 ms by default): the broker and the gateways do not poll there unless told to
(``--broker-spin-us``, ``--gateway-spin-us``). Both cgroup versions are read: v2's ``cpu.max``
and v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, in the process's own cgroup and in each
cgroup above it, since a limit anywhere above applies.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs' worth of time the tightest limit over this process allows (0.5: half a CPU), or
    None when there is none, or none that can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            limits += (limit for folder in _folders(root, path) if (limit := _v2_limit(folder)) is not None)
        elif "cpu" in controllers.split(","):
            mount = root / "cpu" if (root / "cpu").is_dir() else root / controllers
            limits += (limit for folder in _folders(mount, path) if (limit := _v1_limit(folder)) is not None)
    return min(limits, default=None)


def usable_cpus() -> int:
    """The CPUs' worth of time this process can have: the CPUs it may run on (its affinity),
    fewer under a CPU quota (rounded up). What the defaults that scale with the machine (gateway
    processes, autoscaled instances, a library's threads) should count, not the machine's cores."""
    return _within(cpu_quota())


def threads_within_quota() -> int | None:
    """How many threads a compute library (onnxruntime, torch) should start when its model does
    not say: ``usable_cpus`` under a CPU quota; None when there is none (the library's own
    default, one per core, is right then). Its default counts the machine's cores, not the
    container's limit, and threads past the limit only queue for it."""
    quota = cpu_quota()
    return None if quota is None else _within(quota)


def _within(quota: float | None) -> int:
    cpus = len(os.sched_getaffinity(0))
    return cpus if quota is None else max(1, min(math.ceil(quota), cpus))


def _folders(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder under ``mount`` and each folder above it, up to the mount."""
    folder = mount / path.strip("/")
    folders = [folder]
    while folder != mount and folder.parent != folder:
        folder = folder.parent
        folders.append(folder)
    return folders


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota < 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
