"""The latency floor of one ZeroMQ hop between two processes on this machine.

A DEALER in this process sends 100 bytes to a ROUTER in another process, which sends
them back; the round trip is two hops. Each tritium request crosses four hops (gateway
-> broker -> instance -> broker -> gateway), so four times half this round trip is the
part of the latency at concurrency 1 that no code of tritium's can remove.

    python bench/zmq_floor.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import zmq

from bench.harness import save, table

ECHO = r'''
import sys, zmq
sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    sock.send_multipart(sock.recv_multipart())
'''


def main(samples: int = 5000) -> None:
    address = f"ipc:///tmp/tritium-zmq-floor-{time.monotonic_ns()}"
    echo = subprocess.Popen([sys.executable, "-c", ECHO, address])
    try:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(address)
        payload = b"x" * 100
        for _ in range(500):
            sock.send(payload)
            sock.recv()
        times = []
        for _ in range(samples):
            start = time.perf_counter_ns()
            sock.send(payload)
            sock.recv()
            times.append(time.perf_counter_ns() - start)
        sock.close(0)
    finally:
        echo.terminate()
        echo.wait()
    times.sort()
    result = {"round_trip_p50_us": times[len(times) // 2] / 1000,
              "round_trip_p99_us": times[int(len(times) * 0.99)] / 1000}
    result["four_hops_us"] = 2 * result["round_trip_p50_us"]
    save("zmq_floor", result)
    print(table(["ZeroMQ ipc round trip (2 hops)", "p50 us", "p99 us", "4 hops (a tritium request) us"],
                [["DEALER <-> ROUTER, 100 B", round(result["round_trip_p50_us"]),
                  round(result["round_trip_p99_us"]), round(result["four_hops_us"])]]))


if __name__ == "__main__":
    main()
