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
move, and with the waker on the first CPU and the woken process moved back to the second
before each wait (its previous CPU idle when the wake-up comes). Writes
``bench/out/wake_placement.json``.

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


def woken(sock: socket.socket, wakeups: int, home_cpu: int | None) -> bytes:
    """The woken side: per wake-up, nanoseconds from the send to running, and whether on the waker's CPU.
    With ``home_cpu``, it goes back to that CPU before each wait, so that the CPU it last ran on
    is never the waker's when the wake-up comes."""
    everywhere = os.sched_getaffinity(0)
    waiter = select.poll()
    waiter.register(sock.fileno(), select.POLLIN)
    results = bytearray()
    sock.send(b"r")   # waiting from now on
    for _ in range(wakeups):
        if home_cpu is not None:
            os.sched_setaffinity(0, {home_cpu})   # moves it there at once; free again while it waits
            os.sched_setaffinity(0, everywhere)
        waiter.poll()
        now, cpu = time.monotonic_ns(), current_cpu()
        stamp = sock.recv(_STAMP.size, socket.MSG_WAITALL)
        if len(stamp) < _STAMP.size:   # the waker is gone
            break
        sent, waker_cpu = _STAMP.unpack(stamp)
        results += _STAMP.pack(now - sent, int(cpu == waker_cpu))
    return bytes(results)


def measure(wakeups: int, busy_us: int, apart: bool) -> dict:
    """One run: the share of wake-ups run on the waker's CPU and the delay from send to run.
    ``apart``: the waker on the first CPU, the woken process back on the second before each wait."""
    cpus = sorted(os.sched_getaffinity(0))
    waker, sleeper = socket.socketpair()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            waker.close()
            os.close(read_end)
            results = woken(sleeper, wakeups, cpus[1] if apart else None)
            with os.fdopen(write_end, "wb") as out:
                out.write(results)
            code = 0
        finally:
            os._exit(code)   # never back into the caller's code (a test session, say)
    sleeper.close()
    os.close(write_end)
    everywhere = os.sched_getaffinity(0)
    try:
        if apart:
            os.sched_setaffinity(0, {cpus[0]})
        if waker.recv(1) != b"r":
            raise RuntimeError("the woken process did not start")
        for _ in range(wakeups):
            waker.send(_STAMP.pack(time.monotonic_ns(), current_cpu()))
            busy(busy_us)
            time.sleep(0.001)
        with os.fdopen(read_end, "rb") as results:
            data = results.read()
    finally:
        os.sched_setaffinity(0, everywhere)
        waker.close()
        _, status = os.waitpid(child, 0)
    rows = [_STAMP.unpack_from(data, offset) for offset in range(0, len(data), _STAMP.size)]
    if status != 0 or len(rows) != wakeups:
        raise RuntimeError(f"the woken process saw {len(rows)} wake-ups of {wakeups} (exit status {status})")
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
               "the woken one last ran on the other CPU": measure(args.wakeups, args.busy_us, apart=True)}
    save("wake_placement", {"busy_us": args.busy_us, "wakeups": args.wakeups, "results": results})
    print(table(["case", "on the waker's CPU", "send to run p50 (us)", "p90 (us)"],
                [[case, f"{r[ON_WAKER]:.0f}%", f"{r['delay p50 us']:.0f}",
                  f"{r['delay p90 us']:.0f}"] for case, r in results.items()]))


if __name__ == "__main__":
    main()
