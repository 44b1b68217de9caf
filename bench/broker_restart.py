"""Broker restarts under load: how soon requests are answered again, and what restarted.

A broker, a worker host and a gateway run as separate processes over tcp:// (as in the
reliability tests); closed-loop threads send whoami requests (tests/e2e/restart_repo:
``whoami`` with two instances, ``whoami_scaled`` autoscaled to two, ``py_state`` a stateful
model with implicit state). The broker is
restarted twice: killed with SIGKILL, and stopped with SIGTERM (a drain). Reported for
each: the seconds from the new broker process's start to the first answered request,
the instance processes restarted (pids that changed), and the failed requests by their
error.

Every part heartbeats every 0.25 s, so that a gateway calls the broker lost after 0.75 s
of silence, shorter than the broker's restart: then each request sent meanwhile fails at
once, and a client loop sends thousands. ``--gateway-heartbeat-s 1`` gives the gateway
the default interval (lost after 3 s), longer than the restart: requests sent meanwhile
wait for the new broker.

    python -m bench.broker_restart [--gateway-heartbeat-s 1] [--out bench/out/broker_restart.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import cluster
from tests.cluster import Load, Outcome, failures, instance_pids

REPO = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "restart_repo"
MODELS = ("whoami", "whoami_scaled", "py_state")
HEARTBEAT = ("--heartbeat-interval-secs", "0.25")


@dataclass
class RestartRun:
    """One broker restart under load."""

    how: str                       # "SIGKILL" or "SIGTERM"
    first_answer_s: float          # from the new broker process's start to the first result
    pids_before: set[int]
    pids_after: set[int]
    outcomes: list[Outcome] = field(repr=False)
    # monotonic time that first result arrived: a request sent just before it may still meet the
    # new broker's first model table (the version loading again, Triton's "not ready")
    back_at: float = 0.0

    @property
    def restarted(self) -> int:
        """Instance processes that did not survive (every model's instances, on every host)."""
        return len(self.pids_before - self.pids_after)

    def failed_after_back(self) -> list[Outcome]:
        return [o for o in failures(self.outcomes) if o.started >= self.back_at]

    def failed_by_error(self, address: str) -> dict[str, int]:
        """Failed requests per status and message (the broker's address written ADDR)."""
        return dict(collections.Counter(f"{o.status} {o.message.replace(address, 'ADDR')}"
                                        for o in failures(self.outcomes)))

    def summary(self, address: str = "") -> dict:
        return {"how": self.how, "first_answer_s": round(self.first_answer_s, 3),
                "instance_processes_restarted": self.restarted, "requests": len(self.outcomes),
                "failed": len(failures(self.outcomes)), "failed_after_back": len(self.failed_after_back()),
                "failed_by_error": self.failed_by_error(address)}


def instance_pids_of(workers: list[cluster.Part]) -> set[int]:
    return set().union(*(instance_pids(w, model) for w in workers for model in MODELS))


def restart_under_load(broker: cluster.Part, gateway: cluster.Part, workers: list[cluster.Part], planned: bool,
                       threads: int = 2, delay_ms: float = 20) -> RestartRun:
    """Restart ``broker`` while ``threads`` clients send whoami requests; SIGTERM when ``planned``."""
    before = instance_pids_of(workers)
    with Load(gateway.url, threads=threads, delay_ms=delay_ms) as load:
        time.sleep(1)
        if planned:
            broker.terminate()
            broker.wait(timeout_s=30)
        else:
            broker.kill()
        time.sleep(0.5)
        started_at = time.monotonic()
        broker.start()
        first = cluster.wait_until(lambda: next((o for o in list(load.outcomes)
                                                 if o.pid is not None and o.started >= started_at), None),
                                   timeout_s=60, interval_s=0.01, what="the first answer from the new broker")
        time.sleep(1.5)
    return RestartRun("SIGTERM" if planned else "SIGKILL", first.ended - started_at, before,
                      instance_pids_of(workers), list(load.outcomes), back_at=first.ended)


def start_cluster(gateway_heartbeat_s: float | None = None) -> tuple[cluster.Part, list[cluster.Part], cluster.Part]:
    """Broker, one worker host and a gateway, with ``whoami_scaled`` grown to two instances."""
    broker = cluster.broker(REPO, *HEARTBEAT)
    broker.wait_ready()
    # Room for whoami_zero's instance beside whoami_scaled's two, on a machine of two CPUs.
    workers = [cluster.worker(broker.backend, REPO, *HEARTBEAT, "--max-cpu-instances", "3")]
    gateway = cluster.gateway(broker.frontend, *(HEARTBEAT if gateway_heartbeat_s is None else
                                                 ("--heartbeat-interval-secs", str(gateway_heartbeat_s))))
    for part in [*workers, gateway]:
        part.wait_ready()
    cluster.wait_until(lambda: cluster.model_ready(gateway.url), what="whoami ready")
    with Load(gateway.url, threads=4, delay_ms=100, model="whoami_scaled"):   # its queue makes it grow
        cluster.wait_until(lambda: len(instance_pids(workers[0], "whoami_scaled")) == 2, timeout_s=30,
                           what="whoami_scaled scaled to two instances")
    cluster.wait_until(lambda: len(instance_pids_of(workers)) == 5, what="five instances")
    return broker, workers, gateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway-heartbeat-s", type=float, default=None,
                        help="the gateway's heartbeat interval (default: 0.25 s, as the other parts')")
    parser.add_argument("--out", default="bench/out/broker_restart.json")
    args = parser.parse_args()
    broker, workers, gateway = start_cluster(args.gateway_heartbeat_s)
    try:
        runs = [restart_under_load(broker, gateway, workers, planned) for planned in (False, True)]
    finally:
        for part in [gateway, *workers, broker]:
            part.stop(timeout_s=20)
    results = [run.summary(broker.frontend) for run in runs]
    for result in results:
        print(json.dumps(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
