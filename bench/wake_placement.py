"""Where the kernel runs a process woken by another that keeps running.

tritium's parts wake each other through Unix sockets: the gateway sends requests to the
broker and goes on reading, the broker sends a batch to an instance and goes on. Whether the
woken part then runs beside the waker, on another CPU, or on the waker's own CPU (taking
turns with it while another CPU idles) decides how much its stages overlap, and so whether
``--cpu-layout split`` pays on a machine (docs/performance.md, "The gateway on a CPU of its
own"). A stock Linux kernel looks for an idle CPU for the woken process; the kernel of some
small virtual machines keeps it on the waker's CPU.

A waker process sends a few bytes on a Unix socket pair, then stays busy for ``--busy-us``
(as a gateway reading the rest of a turn), then sleeps a millisecond; the woken process waits
in ``poll``, notes the CPU it runs on and how long after the send it started. Run both free to
move, and with the woken process started on the other CPU than the waker's (its previous CPU
idle when the wake-up comes). Writes ``bench/out/wake_placement.json``.

    python -m bench.wake_placement [--wakeups 1000] [--busy-us 300]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import socket
import statistics
import struct
import time

from bench.harness import save, table

_STAMP = struct.Struct("qi")   # the waker's clock at the send, and its CPU
ON_WAKER = "on the waker's CPU %"
_libc = ctypes.CDLL(None, use_errno=True)


def current_cpu() -> int:
    return _libc.sched_getcpu()


def busy(us: int) -> None:
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def woken(sock: socket.socket, wakeups: int, start_cpu: int | None, results) -> None:
    """The woken side: one line per wake-up (microseconds after the send, whether on the waker's CPU)."""
    if start_cpu is not None:   # run once on that CPU, so that it is the previous CPU at the first wake-up
        everywhere = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {start_cpu})
        busy(1000)
        os.sched_setaffinity(0, everywhere)
    waiter = select.poll()
    waiter.register(sock.fileno(), select.POLLIN)
    for _ in range(wakeups):
        waiter.poll()
        now, cpu = time.monotonic_ns(), current_cpu()
        sent, waker_cpu = _STAMP.unpack(sock.recv(_STAMP.size))
        results.write(_STAMP.pack(now - sent, int(cpu == waker_cpu)))


def measure(wakeups: int, busy_us: int, apart: bool) -> dict:
    """One run: the share of wake-ups run on the waker's CPU and the delay from send to run."""
    cpus = sorted(os.sched_getaffinity(0))
    waker, sleeper = socket.socketpair()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        waker.close()
        os.close(read_end)
        with os.fdopen(write_end, "wb") as results:
            woken(sleeper, wakeups, cpus[1] if apart else None, results)
        os._exit(0)
    sleeper.close()
    os.close(write_end)
    everywhere = os.sched_getaffinity(0)
    if apart:
        os.sched_setaffinity(0, {cpus[0]})   # the waker starts on another CPU than the woken one
    time.sleep(0.2)
    for _ in range(wakeups):
        waker.send(_STAMP.pack(time.monotonic_ns(), current_cpu()))
        busy(busy_us)
        time.sleep(0.001)
    os.sched_setaffinity(0, everywhere)
    with os.fdopen(read_end, "rb") as results:
        data = results.read()
    os.waitpid(child, 0)
    waker.close()
    rows = [_STAMP.unpack_from(data, offset) for offset in range(0, len(data), _STAMP.size)]
    delays = sorted(delay / 1000 for delay, _ in rows)
    return {ON_WAKER: 100 * sum(same for _, same in rows) / len(rows),
            "delay p50 us": statistics.median(delays), "delay p90 us": delays[int(len(delays) * 0.9)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wakeups", type=int, default=1000)
    parser.add_argument("--busy-us", type=int, default=300, help="how long the waker stays busy after each send")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs")
    results = {"both free": measure(args.wakeups, args.busy_us, apart=False),
               "the woken one last ran on another CPU": measure(args.wakeups, args.busy_us, apart=True)}
    save("wake_placement", {"busy_us": args.busy_us, "wakeups": args.wakeups, "results": results})
    print(table(["case", "on the waker's CPU", "send to run p50 (us)", "p90 (us)"],
                [[case, f"{r[ON_WAKER]:.0f}%", f"{r['delay p50 us']:.0f}",
                  f"{r['delay p90 us']:.0f}"] for case, r in results.items()]))


if __name__ == "__main__":
    main()
