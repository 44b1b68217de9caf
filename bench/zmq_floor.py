"""The latency floor of one ZeroMQ hop between two processes on this machine, by CPU placement.

A DEALER in this process sends 100 bytes to a ROUTER in another process, which sends
them back; the round trip is two hops. Each tritium request crosses four hops (gateway
-> broker -> instance -> broker -> gateway), so four times half this round trip is the
part of the latency at concurrency 1 that no code of tritium's can remove.

With libzmq each hop wakes three threads: the sender's ZeroMQ I/O thread, the
receiver's, and the receiving process; tritium's own ZMTP sockets (tritium/zmtp.py, what
its local links use) speak the same protocol from the owning thread, one wake-up per hop.
What a wake-up costs depends on where the woken thread runs, so the round trip is
measured with both processes (and their I/O threads) on one CPU, on two different CPUs,
and free to run anywhere; a plain Unix socket is the reference. On a virtual machine
without halt polling, waking a thread on an idle CPU costs tens of microseconds, which is
what ``--gateway-cpus``, ``--broker-cpus`` and ``--worker-cpus`` work around. Writes
``bench/out/zmq_floor.json`` and docs/zmq_floor.png.

    python -m bench.zmq_floor
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from bench.harness import bar_charts, save, table
from tritium.zmtp import ZmtpDealer

ZMQ_ECHO = r'''
import sys, zmq
sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    sock.send_multipart(sock.recv_multipart())
'''

ZMTP_ECHO = r'''
import select, sys
from tritium.zmtp import ZmtpRouter
router = ZmtpRouter(sys.argv[1])
waiter = select.poll()
waiter.register(router.fileno(), select.POLLIN)
while True:
    while router.has_message():
        router.send_parts(router.recv_parts())
    waiter.poll()
'''

UNIX_ECHO = r'''
import socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen()
connection, _ = listener.accept()
while data := connection.recv(4096):
    connection.sendall(data)
'''


def _echo(kind: str, address: str, cpus: set[int]) -> subprocess.Popen:
    code = {"zmq": ZMQ_ECHO, "zmtp": ZMTP_ECHO, "unix": UNIX_ECHO}[kind]
    return subprocess.Popen([sys.executable, "-c", code, address], preexec_fn=lambda: os.sched_setaffinity(0, cpus))


def round_trips(kind: str, mine: set[int], theirs: set[int], samples: int) -> list[int]:
    """Nanoseconds per round trip, this process on ``mine`` and the echo on ``theirs``."""
    with tempfile.TemporaryDirectory(prefix="tritium-zmq-floor-") as folder:
        return _round_trips(kind, os.path.join(folder, "echo"), mine, theirs, samples)


def _round_trips(kind: str, path: str, mine: set[int], theirs: set[int], samples: int) -> list[int]:
    saved = os.sched_getaffinity(0)
    echo = _echo(kind, f"ipc://{path}" if kind == "zmq" else path, theirs)
    try:
        os.sched_setaffinity(0, mine)   # before the context: its I/O thread inherits the set
        if kind == "zmq":
            context = zmq.Context()
            sock = context.socket(zmq.DEALER)
            sock.connect(f"ipc://{path}")
            send, receive = sock.send, sock.recv
        elif kind == "zmtp":
            while not os.path.exists(path):
                time.sleep(0.01)
            dealer = ZmtpDealer(path, b"floor")
            waiter = select.poll()
            waiter.register(dealer.fileno(), select.POLLIN)
            def send(payload):
                dealer.send_parts([payload])

            def receive():
                while not dealer.has_message():
                    waiter.poll()
                return dealer.recv_parts()
        else:
            while not os.path.exists(path):
                time.sleep(0.01)
            unix = socket.socket(socket.AF_UNIX)
            unix.connect(path)
            send, receive = unix.sendall, (lambda: unix.recv(4096))
        payload = b"x" * 100
        times = []
        for index in range(500 + samples):
            start = time.perf_counter_ns()
            send(payload)
            receive()
            if index >= 500:   # after the warm-up
                times.append(time.perf_counter_ns() - start)
        if kind == "zmq":
            sock.close(0)
            context.term()
        elif kind == "zmtp":
            dealer.close()
        else:
            unix.close()
        return sorted(times)
    finally:
        os.sched_setaffinity(0, saved)
        echo.terminate()
        echo.wait()


def main(samples: int = 5000) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    first, other = {cpus[0]}, {cpus[-1]}
    placements = [("same CPU", first, first), ("different CPUs", first, other), ("any CPU", set(cpus), set(cpus))]
    rows, result = [], {}
    for kind, label in KINDS:
        for placement, mine, theirs in placements:
            times = round_trips(kind, mine, theirs, samples)
            p50, p99 = times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000
            result[f"{kind} {placement}"] = {"round_trip_p50_us": p50, "round_trip_p99_us": p99}
            rows.append([label, placement, round(p50), round(p99), round(2 * p50)])
    result["four_hops_us"] = 2 * result["zmq any CPU"]["round_trip_p50_us"]
    result["four_hops_zmtp_us"] = 2 * result["zmtp any CPU"]["round_trip_p50_us"]
    save("zmq_floor", result)
    print(table(["round trip (2 hops), 100 B", "placement", "p50 us", "p99 us", "4 hops us"], rows))
    plot(result, [placement for placement, _, _ in placements], PLOT)
    print(f"plot: {PLOT}")


KINDS = (("zmq", "ZeroMQ DEALER <-> ROUTER, ipc (libzmq)"), ("zmtp", "tritium's ZMTP DEALER <-> ROUTER, ipc"),
         ("unix", "Unix socket (reference)"))
PLOT = Path(__file__).resolve().parent.parent / "docs" / "zmq_floor.png"


def plot(result: dict, placements: list[str], path: Path) -> None:
    series = {label: [result[f"{kind} {placement}"]["round_trip_p50_us"] for placement in placements]
              for kind, label in KINDS}
    bar_charts(path, [(placements, series, "round trip p50 (us)", "Two hops between two processes, by CPU placement")],
               size=(7, 3.5))


if __name__ == "__main__":
    main()
