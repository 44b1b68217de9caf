"""Memory and CPU of a model's instance processes, read from /proc (a server on this host).

Each instance process runs ``python -m tritium.workers.instance HOST/MODEL/VERSION/...``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessUsage:
    memory_mb: float
    cpu_seconds: float


def instance_pids(model: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tritium.workers.instance" in argv and argv.index(b"tritium.workers.instance") + 1 < len(argv):
            iid = argv[argv.index(b"tritium.workers.instance") + 1].decode(errors="replace").split("/")
            if len(iid) > 1 and iid[1] == model:
                pids.append(int(entry.name))
    return pids


def usage(models: list[str]) -> dict[int, ProcessUsage]:
    """Resident memory and CPU time so far of each instance process of ``models`` on this host."""
    found = {}
    for model in models:
        for pid in instance_pids(model):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                resident_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue   # the process ended meanwhile
            found[pid] = ProcessUsage(resident_pages * _PAGE / 2**20, (int(stat[11]) + int(stat[12])) / _TICKS)
    return found


def cpu_percent(before: dict[int, ProcessUsage], after: dict[int, ProcessUsage], elapsed_s: float) -> float:
    """CPU used between the two readings, counting only processes alive at both."""
    used = sum(after[pid].cpu_seconds - before[pid].cpu_seconds for pid in after if pid in before)
    return 100 * used / elapsed_s if elapsed_s else 0.0
