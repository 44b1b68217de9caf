"""Soak: closed-loop load for minutes while a worker host is killed every minute.

Broker, two worker hosts and a gateway run as separate processes (tests/cluster.py,
over tcp://, or with ``--links ipc`` over Unix sockets, where the broker, gateway and
instances speak ZMTP themselves). ``--concurrency`` connections send whoami requests (tests/e2e/cluster_repo)
for ``--duration`` seconds; every ``--kill-every`` seconds one worker host is killed
(SIGKILL to the agent and its instances) and started again ``--down-for`` seconds later.

Reported: requests answered, errors by status and when they happened relative to the
kills, requests never answered within ``--request-timeout`` (must be zero), and the
resident memory of broker and gateway after warm-up and at the end.

    python -m bench.soak --duration 300 --concurrency 64 [--links ipc] [--gateway-send-every 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests import cluster
from tests.cluster import instance_pids, model_ready
from tritium.perf.loadgen import _Connection

REPO = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "cluster_repo"
OUT = Path(__file__).resolve().parent / "out" / "soak.json"
BODY = b'{"inputs":[{"name":"DELAY_MS","datatype":"FP32","shape":[1,1],"data":[5]}]}'


def request_bytes(host: str) -> bytes:
    return (f"POST /v2/models/whoami/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Tally:
    def __init__(self) -> None:
        self.ok = 0
        self.errors: Counter = Counter()
        self.error_times: list[float] = []
        self.unanswered = 0
        self.examples: dict[str, str] = {}


async def closed_loop(host: str, port: int, tally: Tally, stop_at: float, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    request = request_bytes(host)
    connection = None
    while time.monotonic() < stop_at:
        if connection is None or connection.lost:
            try:
                _, connection = await loop.create_connection(_Connection, host, port)
            except OSError as exc:
                tally.errors["connect"] += 1
                tally.examples.setdefault("connect", repr(exc))
                await asyncio.sleep(0.1)
                continue
        try:
            status = await asyncio.wait_for(connection.send(request), timeout_s)
        except asyncio.TimeoutError:
            tally.unanswered += 1
            connection.transport.close()
            connection = None
            continue
        except (ConnectionError, OSError) as exc:
            tally.errors["connection"] += 1
            tally.error_times.append(time.monotonic())
            tally.examples.setdefault("connection", repr(exc))
            connection = None
            continue
        if status == 200:
            tally.ok += 1
        else:
            tally.errors[str(status)] += 1
            tally.error_times.append(time.monotonic())
            tally.examples.setdefault(str(status), bytes(connection.body[:200]).decode(errors="replace"))
    if connection is not None:
        connection.transport.close()


async def killer(workers: list[cluster.Part], every_s: float, down_s: float, stop_at: float,
                 kills: list[float]) -> None:
    index = 0
    while time.monotonic() + every_s < stop_at:
        await asyncio.sleep(every_s)
        victim = workers[index % len(workers)]
        index += 1
        kills.append(time.monotonic())
        victim.kill()
        await asyncio.sleep(down_s)
        victim.start()


async def soak(args, gateway: cluster.Part, workers: list[cluster.Part], tally: Tally, kills: list[float]) -> None:
    host, port = gateway.url.rsplit(":", 1)
    stop_at = time.monotonic() + args.duration
    await asyncio.gather(killer(workers, args.kill_every, args.down_for, stop_at, kills),
                         *(closed_loop(host, int(port), tally, stop_at, args.request_timeout)
                           for _ in range(args.concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=60)
    parser.add_argument("--down-for", type=float, default=5)
    parser.add_argument("--request-timeout", type=float, default=30)
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--links", choices=("tcp", "ipc"), default="tcp",
                        help="how the parts reach the broker: libzmq over TCP, or tritium's ZMTP over Unix sockets")
    parser.add_argument("--gateway-send-every", type=int, default=0, metavar="N",
                        help="the gateway sends a turn's requests this many at a time (0: at the turn's end), as "
                             "serve's gateways do when pinned apart from the broker")
    args = parser.parse_args()
    if args.gateway_send_every < 0:
        parser.error("--gateway-send-every must be 0 or more")

    beat = ("--heartbeat-interval-secs", "1")
    with tempfile.TemporaryDirectory(prefix="tritium-soak-") as folder:   # the Unix sockets of --links ipc
        links = {"frontend": f"ipc://{folder}/frontend", "backend": f"ipc://{folder}/backend"} if args.links == "ipc" else {}
        report = run_soak(args, cluster.broker(REPO, *beat, **links), beat)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def run_soak(args: argparse.Namespace, broker, beat: tuple) -> dict:
    """Start the workers and the gateway on ``broker``, warm up, soak; the report."""
    broker.wait_ready()
    workers = [cluster.worker(broker.backend, REPO, *beat, "--models", "whoami") for _ in range(2)]
    gateway = cluster.gateway(broker.frontend, *beat, "--gateway-send-every", str(args.gateway_send_every))
    parts = [broker, *workers, gateway]
    try:
        for part in parts[1:]:
            part.wait_ready()
        cluster.wait_until(lambda: all(instance_pids(w) for w in workers), what="instances")
        cluster.wait_until(lambda: model_ready(gateway.url), what="whoami ready")
        warm = Tally()
        asyncio.run(soak(argparse.Namespace(**{**vars(args), "duration": args.warmup, "kill_every": 1e9}),
                         gateway, workers, warm, []))
        rss_start = {"broker": rss_kib(broker.pid), "gateway": rss_kib(gateway.pid)}
        tally, kills = Tally(), []
        started = time.monotonic()
        asyncio.run(soak(args, gateway, workers, tally, kills))
        elapsed = time.monotonic() - started
        rss_end = {"broker": rss_kib(broker.pid), "gateway": rss_kib(gateway.pid)}
    finally:
        for part in reversed(parts):
            part.stop(timeout_s=20)
    near_kill = sum(1 for t in tally.error_times if any(0 <= t - k <= args.down_for + 10 for k in kills))
    return {
        "duration_s": round(elapsed, 1), "concurrency": args.concurrency, "links": args.links,
        "gateway_send_every": args.gateway_send_every, "kills": len(kills),
        "answered_ok": tally.ok, "throughput_per_s": round(tally.ok / elapsed, 1),
        "errors": dict(tally.errors), "errors_within_15_s_of_a_kill": near_kill,
        "error_examples": tally.examples, "unanswered": tally.unanswered,
        "rss_kib_after_warmup": rss_start, "rss_kib_at_end": rss_end,
        "rss_growth_pct": {k: round(100 * (rss_end[k] - rss_start[k]) / rss_start[k], 1) for k in rss_start},
    }


if __name__ == "__main__":
    main()
