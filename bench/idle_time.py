"""Why the machine's CPUs sit idle under load: the kernel's scheduler events, recorded while
perf_analyzer drives tritium and then real Triton (servers alternating, same add_sub repository).

Each moment a CPU runs nothing is put in one of three kinds:

- **waking**: a thread has been woken onto this CPU and has not started yet. On a virtual
  machine whose idle CPUs halt, this is the time the CPU takes to come back (an interrupt to
  the hypervisor and the vCPU rescheduled), tens of microseconds each time.
- **work on another CPU**: threads are ready to run, but queued on a busy CPU.
- **nothing to run**: every thread of the machine is waiting for something.

It also counts the wake-ups that land on an idle CPU per request served, and how long those
took to run. Needs ``perf`` and the right to trace scheduler events (root, or
``kernel.perf_event_paranoid`` -1). Writes ``bench/out/idle_time.json`` and a plot.

    python -m bench.idle_time [--rounds 2] [--record-s 1.5] [--concurrency 16 64]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import OUT, TritiumServer, TritonServer, save, table
from bench.serving_overhead import python_repository
from bench.versus_triton import perf_analyzer, served

EVENTS = ("sched:sched_switch", "sched:sched_waking", "sched:sched_migrate_task", "sched:sched_stat_runtime")
KINDS = ("waking", "work on another CPU", "nothing to run")
_EVENT = re.compile(r"\s*(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)")
_FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass
class IdleTime:
    """What one recording found: seconds of CPU time by kind, and the wake-ups onto idle CPUs."""
    span_s: float = 0.0
    cpu_s: float = 0.0
    idle_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    wakeups: list[float] = field(default_factory=list)   # each wake-up of an idle CPU: seconds it took


class SchedulerReplay:
    """Replays scheduler events in order, keeping what each CPU runs and which threads wait to run where."""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.running = dict.fromkeys(range(cpus), 0)   # CPU -> thread id (0: idle)
        self.ready: dict[int, int] = {}   # thread -> the CPU it is queued on
        self.waking = dict.fromkeys(range(cpus), 0.0)   # CPU -> seconds this idle CPU has had a thread queued
        self.found = IdleTime()
        self._last: float | None = None

    def event(self, cpu: int, at: float, kind: str, fields: dict[str, str]) -> None:
        if self._last is not None:
            self._account(at - self._last)
        self._last = at
        if kind == "sched_waking":
            thread = int(fields["pid"])
            if thread not in self.running.values():
                self.ready[thread] = int(fields["target_cpu"])
        elif kind == "sched_migrate_task":   # the CPU a wake-up chose (sched_waking names the one it ran on last)
            thread = int(fields["pid"])
            if thread in self.ready:
                self.ready[thread] = int(fields["dest_cpu"])
        elif kind == "sched_switch":
            previous, following = int(fields["prev_pid"]), int(fields["next_pid"])
            if previous and fields["prev_state"].startswith("R"):   # preempted: it waits here
                self.ready[previous] = cpu
            self.ready.pop(following, None)
            if following and self.waking.get(cpu):
                self.found.wakeups.append(self.waking[cpu])
                self.waking[cpu] = 0.0
            self.running[cpu] = following

    def _account(self, seconds: float) -> None:
        found = self.found
        found.span_s += seconds
        found.cpu_s += seconds * self.cpus
        for cpu, thread in self.running.items():
            if thread:
                continue
            queued_on = self.ready.values()
            kind = "waking" if cpu in queued_on else "work on another CPU" if queued_on else "nothing to run"
            found.idle_s[kind] += seconds
            if kind == "waking":
                self.waking[cpu] += seconds


def parse(script_lines) -> list[tuple[int, float, int, str, dict[str, str]]]:
    """``perf script -F tid,cpu,time,event,trace`` lines as (CPU, time, thread running there, event, fields)."""
    events = []
    for line in script_lines:
        match = _EVENT.match(line)
        if match:
            thread, cpu, at, kind, rest = match.groups()
            events.append((int(cpu), float(at), int(thread), kind, dict(_FIELD.findall(rest.replace(" ==> ", " ")))))
    return events


def with_silent_switches(events: list) -> list:
    """The events, plus a switch wherever a CPU left idle without one in the trace.

    On this kernel a CPU coming out of idle does not always record its switch; the thread it
    ran shows up in the next event it records. Its first ``sched_stat_runtime`` there dates the
    switch (the runtime it reports is counted from it); lacking one, the event itself does.
    """
    current: dict[int, int] = {}   # CPU -> thread, as the trace tells so far
    idle_since: dict[int, float] = {}
    merged = []
    for event in events:
        cpu, at, thread, kind, fields = event
        if cpu not in current or (current[cpu] == 0 and thread != 0):
            started = at
            if kind == "sched_stat_runtime" and int(fields.get("pid", -1)) == thread:
                started = max(idle_since.get(cpu, at), at - int(fields["runtime"]) / 1e9)
            merged.append((cpu, started, thread, "sched_switch",
                           {"prev_pid": "0", "prev_state": "S", "next_pid": str(thread)}))
            current[cpu] = thread
        if kind == "sched_switch":
            current[cpu] = int(fields["next_pid"])
            if current[cpu] == 0:
                idle_since[cpu] = at
        merged.append(event)
    return sorted(merged, key=lambda event: event[1])   # stable: a switch added goes before its event


def replay(script_lines, cpus: int) -> IdleTime:
    """``script_lines``: ``perf script -F tid,cpu,time,event,trace`` of the EVENTS."""
    scheduler = SchedulerReplay(cpus)
    for cpu, at, _, kind, fields in with_silent_switches(parse(script_lines)):
        scheduler.event(cpu, at, kind, fields)
    return scheduler.found


def record(seconds: float) -> IdleTime:
    """The scheduler's events on every CPU for ``seconds``, replayed."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "sched.data"
        events = [word for event in EVENTS for word in ("-e", event)]
        subprocess.run(["perf", "record", "-q", "-a", "-o", str(data), *events, "--", "sleep", str(seconds)],
                       check=True, capture_output=True, timeout=seconds + 60)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,cpu,time,event,trace"],
                                check=True, capture_output=True, text=True, timeout=300)
    return replay(script.stdout.splitlines(), os.cpu_count() or 1)


def measured_run(http_url: str, concurrency: int, record_s: float) -> dict:
    """perf_analyzer at ``concurrency`` over HTTP; the scheduler recorded in the middle of its run."""
    load = threading.Thread(target=perf_analyzer, args=(http_url, "http", concurrency, 3000), daemon=True)
    load.start()
    time.sleep(3.0)   # past perf_analyzer's warm-up
    before = served(http_url)
    found = record(record_s)
    requests = max(1, served(http_url) - before)
    load.join()
    idle = {kind: 100 * seconds / found.cpu_s for kind, seconds in found.idle_s.items()}
    waits = sorted(found.wakeups)
    return {"idle %": sum(idle.values()), **{f"{kind} %": share for kind, share in idle.items()},
            "wake-ups onto an idle CPU per request": len(waits) / requests,
            "their p50 us": 1e6 * waits[len(waits) // 2] if waits else 0.0,
            "their mean us": 1e6 * statistics.fmean(waits) if waits else 0.0}


def plot(rows: list[list], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    labels = [f"{row[0]}\n{row[1]}" for row in rows]
    bottom = [0.0] * len(rows)
    for index, kind in enumerate(KINDS):
        values = [row[3 + index] for row in rows]
        axis.bar(labels, values, 0.6, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    axis.set_ylabel("% of the machine's CPU time idle")
    axis.set_title("Idle CPU time under load, by what it waited for")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--record-s", type=float, default=1.5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--plot", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "idle_time.png")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (linux-perf / linux-tools)")
    runs: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        repo = python_repository(Path(folder))
        servers = {"tritium": TritiumServer(repo), "triton": TritonServer(repo)}
        try:
            for concurrency in args.concurrency:
                for round_number in range(args.rounds):
                    for name, server in servers.items():
                        found = measured_run(server.url, concurrency, args.record_s)
                        runs.setdefault(f"HTTP c={concurrency}", {}).setdefault(name, []).append(found)
                        print(f"round {round_number + 1} {name:8s} HTTP c={concurrency}: idle {found['idle %']:.1f}% "
                              f"(waking {found['waking %']:.1f}, work on another CPU {found['work on another CPU %']:.1f}), "
                              f"{found['wake-ups onto an idle CPU per request']:.2f} wake-ups onto an idle CPU "
                              f"per request", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    medians = {scenario: {name: {key: statistics.median(run[key] for run in found) for key in found[0]}
                          for name, found in by_server.items()} for scenario, by_server in runs.items()}
    rows = [[scenario, name, round(m["idle %"], 1), *(round(m[f"{kind} %"], 1) for kind in KINDS),
             round(m["wake-ups onto an idle CPU per request"], 2), round(m["their p50 us"]), round(m["their mean us"])]
            for scenario, by_server in medians.items() for name, m in by_server.items()]
    save("idle_time", {"runs": runs, "medians": medians})
    print(table(["scenario", "server", "idle %", *(f"{kind} %" for kind in KINDS),
                 "wake-ups onto an idle CPU per request", "their p50 us", "their mean us"], rows))
    plot(rows, args.plot)
    print(f"plot: {args.plot}; data: {OUT / 'idle_time.json'}")


if __name__ == "__main__":
    main()
