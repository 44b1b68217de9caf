"""A child process that must not outlive the process that started it.

``tritium serve`` starts the broker, the host agent and the gateways, and the agent starts
the instances. If the parent is killed outright (SIGKILL, the OOM killer), nothing of it
runs to stop them: orphaned, they would keep the ports and the GPUs, and the next start
would find them taken. The kernel's parent-death signal stops them instead: Triton is one
process, and a killed tritium goes away as wholly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Callable

_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None
try:   # looked up here, in the parent: a child between fork and exec only calls it
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except OSError:   # not Linux: no such signal
    _prctl = None


def die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when ``parent`` dies; exit now if it already has.

    Called in the child before anything else (as ``preexec_fn``, or first thing): the parent
    may die before the call, which the kernel then never reports.
    """
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def own_process_group() -> dict:
    """Popen's arguments for a child that leads a process group of its own: Python 3.11's
    ``process_group``, or on 3.10 a preexec function (which gives up Popen's vfork)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": _lead_a_group}


def _lead_a_group() -> None:
    os.setpgid(0, 0)


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (children, theirs, ...). serve's children and the
    instances lead process groups of their own, so the process tree, not a process group, says
    which processes are a server's."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def is_alive(pid: int) -> bool:
    """Whether a process of that id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, T for stopped...); None once it is gone."""
    stat = _stat(pid)
    return stat[0] if stat is not None else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def stop_with_descendants() -> None:
    """Ctrl-Z (SIGTSTP) of a process whose children lead process groups of their own, so that the
    terminal's signal reaches it alone: it stops every process below it, then itself, and once
    continued, continues what it stopped. A second Ctrl-Z while the first is at work is the same stop."""
    if _stopping:
        return
    _stopping.append(True)
    try:
        stopped = _stop_tree(os.getpid())
        os.kill(os.getpid(), signal.SIGSTOP)
        _signal_each(stopped, signal.SIGCONT)
    finally:
        _stopping.clear()


_stopping: list[bool] = []   # a stop_with_descendants in progress (a signal handler may run within it)


def _stop_tree(root: int) -> set[int]:
    """SIGSTOP every running process below ``root``; the ones it stopped. Scanned again until no new
    process shows (one may fork between a scan and its parent's stop); one stopped before is left be."""
    seen: set[int] = set()
    stopped: set[int] = set()
    while new := descendants(root) - seen:
        seen |= new
        running = {pid for pid in new if process_state(pid) not in (None, "T", "t")}
        _signal_each(running, signal.SIGSTOP)
        stopped |= running
    return stopped


def _signal_each(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
