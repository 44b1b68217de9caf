"""Facts about the host a process runs on: its name and the GPUs it can use."""

from __future__ import annotations

import os
import socket
from pathlib import Path

# Declares the GPUs of a host by id ("0,1"; "" for none), overriding detection. Used where
# detection is impossible or unwanted: tests of GPU placement on machines without GPUs.
GPUS_ENV = "TRITIUM_GPUS"


def host_name() -> str:
    return socket.gethostname()


def detect_gpus() -> tuple[int, ...]:
    """GPU ids usable on this host, without importing any CUDA library."""
    declared = os.environ.get(GPUS_ENV)
    if declared is not None:
        return tuple(int(g) for g in declared.replace(" ", "").split(",") if g != "")
    try:
        count = len([p for p in Path("/proc/driver/nvidia/gpus").iterdir() if p.is_dir()])
    except OSError:
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() != ""]
        count = min(count, len(ids))
    return tuple(range(count))
