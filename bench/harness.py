"""What the benchmarks share: servers to measure, CPU accounting per process, reporting."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.servers import TritiumServer, free_port  # noqa: E402,F401  (re-exported: dev-only helpers shared with the tests)

ANCHORS = Path(os.environ.get("TRITIUM_ANCHORS", ROOT.parent / "shared" / "anchors"))
OUT = ROOT / "bench" / "out"

# Process roles, told apart by their command lines.
ROLES = {"gateway": b"tritium.cli gateway", "broker": b"tritium.cli broker", "instance": b"tritium.workers.instance",
         "triton": b"tritonserver", "triton stub": b"triton_python_backend_stub"}


def wait_ready(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} was not ready within {timeout_s} s")


class TritonServer:
    """The real Triton (Python backend only), installed by ../shared/anchors."""

    def __init__(self, repository: Path) -> None:
        script = ANCHORS / "triton.sh"
        if not script.exists():
            raise FileNotFoundError(f"{script} not found: set TRITIUM_ANCHORS to the anchors folder")
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{free_port()}"
        OUT.mkdir(parents=True, exist_ok=True)
        self.log = open(OUT / "triton.log", "wb")
        self.process = subprocess.Popen(
            [str(script), str(repository), str(self.port), self.grpc_url.rsplit(":", 1)[1], str(free_port())],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.url)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def role_pids(roots: tuple[int, ...] = ()) -> dict[int, str]:
    """Processes of each role; with ``roots``, only those descending from these processes."""
    found, parents = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        for role, marker in ROLES.items():
            if marker in command:
                found[int(entry.name)] = role
    if roots:
        found = {pid: role for pid, role in found.items() if _descends(pid, set(roots), parents)}
    return found


def _descends(pid: int, roots: set[int], parents: dict[int, int]) -> bool:
    while pid > 1:
        if pid in roots:
            return True
        pid = parents.get(pid, 0)
    return False


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_slices(pid: int) -> int:
    """How many times the kernel has put the process's threads on a CPU (each wake-up or
    preemption starts one): the third field of every ``/proc/PID/task/*/schedstat``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[2])
        except (OSError, IndexError):
            pass
    return total


def system_cpu_times() -> tuple[int, int]:
    """(idle, all) clock ticks of every CPU since boot, from ``/proc/stat``."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


@dataclass
class CpuMeter:
    """CPU seconds used by each process role between start() and stop() (of the processes
    below ``roots`` when given, so that other servers on the machine do not count)."""

    roots: tuple[int, ...] = ()

    def start(self) -> None:
        self.pids = role_pids(self.roots)
        self.before = {pid: cpu_seconds(pid) for pid in self.pids}
        self.slices_before = {pid: time_slices(pid) for pid in self.pids}

    def stop(self) -> dict[str, float]:
        """CPU seconds per role; ``self.slices`` gets the time slices of all the processes."""
        used: dict[str, float] = {}
        self.slices = 0
        for pid, role in self.pids.items():
            try:
                used[role] = used.get(role, 0.0) + cpu_seconds(pid) - self.before[pid]
                self.slices += time_slices(pid) - self.slices_before[pid]
            except OSError:
                pass
        return used


def draw_bars(axis, labels: list[str], series: dict[str, list[float]], ylabel: str, title: str) -> None:
    """Grouped bars on a matplotlib axis: one group per label, one bar per series."""
    width = 0.8 / len(series)
    for index, (name, values) in enumerate(series.items()):
        axis.bar([p - 0.4 + width * (index + 0.5) for p in range(len(labels))], values, width, label=name)
    axis.set_xticks(list(range(len(labels))), labels)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    if len(series) > 1:
        axis.legend()


def bar_charts(path: Path, panels: list[tuple[list[str], dict[str, list[float]], str, str]],
               size: tuple[float, float] = (7, 4)) -> None:
    """``panels`` side by side, each ``(labels, series, ylabel, title)`` as ``draw_bars`` takes, written as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False)
    for axis, panel in zip(axes[0], panels):
        draw_bars(axis, *panel)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def alternating_rounds(servers: dict, scenarios: dict[str, Callable[[Any], dict]], rounds: int,
                       describe: Callable[[dict], str]) -> dict[str, dict[str, list[dict]]]:
    """Each scenario measured ``rounds`` times on every server in turn (A B A B), so that the
    machine's drift falls on all of them: per server, per scenario, the figures of its rounds."""
    results: dict[str, dict[str, list[dict]]] = {name: {} for name in servers}
    for scenario, measure in scenarios.items():
        for number in range(rounds):
            for name, server in servers.items():
                figures = measure(server)
                results[name].setdefault(scenario, []).append(figures)
                print(f"round {number + 1} {name:8s} {scenario}: {describe(figures)}", flush=True)
    return results


def compared(results: dict[str, dict[str, list[dict]]], keys: tuple[str, ...]) -> Iterator[tuple[str, dict, dict]]:
    """Per scenario of ``alternating_rounds``: (scenario, tritium's medians, Triton's medians) of ``keys``."""
    for scenario in results["tritium"]:
        yield scenario, *({key: statistics.median(f[key] for f in results[name][scenario]) for key in keys}
                          for name in ("tritium", "triton"))


VERSUS_HEADERS = ["Triton infer/s", "tritium infer/s", "ratio", "Triton p50 us", "tritium p50 us"]


def versus_row(scenario: str, ours: dict, theirs: dict) -> list:
    """A scenario's row of medians (``compared``): Triton's and tritium's throughput, the ratio, their p50s."""
    return [scenario, round(theirs["throughput"]), round(ours["throughput"]),
            f"{ours['throughput'] / theirs['throughput']:.2f}", round(theirs["p50_us"]), round(ours["p50_us"])]


def versus_plot(path: Path, rows: list[list], title: str) -> None:
    """Throughput and p50 latency of ``versus_row`` rows, Triton's bars beside tritium's."""
    labels = [row[0] for row in rows]
    bar_charts(path, [
        (labels, {"Triton": [row[1] for row in rows], "tritium": [row[2] for row in rows]}, "infer/s", title),
        (labels, {"Triton": [row[4] for row in rows], "tritium": [row[5] for row in rows]}, "us", "p50 latency"),
    ], size=(9, 4))


@contextmanager
def tritium_and_triton(repository: Path) -> Iterator[dict]:
    """tritium and real Triton serving ``repository`` (``{"tritium": ..., "triton": ...}``), stopped on leaving."""
    servers = {"tritium": TritiumServer(repository)}
    try:
        servers["triton"] = TritonServer(repository)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def save(name: str, data) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
