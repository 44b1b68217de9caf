"""Four hosts on one machine: broker, two worker hosts and a gateway, each in a network namespace.

The namespaces hang off one bridge (10.79.0.0/24), so every hop is real TCP between
separate network stacks. Taking a worker host's link down is a host vanishing without
a word: no process exits and no socket closes, only heartbeats stop. The tests create
and remove the namespaces themselves and skip where that is not permitted (not root,
or no CAP_SYS_ADMIN in a container).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import cluster
from tests.cluster import Load, failures, instance_pids, model_ready, served_by
from tritium.lifetime import is_alive

REPO = Path(__file__).parent / "cluster_repo"
HEARTBEAT = ("--heartbeat-interval-secs", "0.25")
SUBNET = "10.79.0"
HOSTS = {"broker": 1, "worker1": 2, "worker2": 3, "gateway": 4}


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def _remove_leftovers() -> None:
    """The bridge and namespaces of an earlier run that was killed before removing them: its
    bridge on the same subnet would take this run's traffic."""
    names = _ip("-o", "link", "show", "type", "bridge").stdout.split() + _ip("netns", "list").stdout.split()
    for name in names:
        name = name.rstrip(":").split("@")[0]
        tag = name[len("trbr"):] if name.startswith("trbr") else name.rsplit("-", 1)[-1] \
            if name.startswith("tritium-") else ""
        if not tag.isdigit() or is_alive(int(tag)):
            continue
        if name.startswith("trbr"):
            _ip("link", "del", name)
        else:
            _ip("netns", "del", name)


class Network:
    """A bridge in this namespace and one namespace per host, linked by veth pairs."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.bridge = f"trbr{tag}"
        self.namespaces = {role: f"tritium-{role}-{tag}" for role in HOSTS}
        self.links = {role: f"tr{tag}{number}" for role, number in HOSTS.items()}
        self._commands = [["link", "add", self.bridge, "type", "bridge"],
                          ["addr", "add", f"{SUBNET}.254/24", "dev", self.bridge],
                          ["link", "set", self.bridge, "up"]]
        for role, number in HOSTS.items():
            ns, outside = self.namespaces[role], self.links[role]
            self._commands += [["netns", "add", ns],
                               ["link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns],
                               ["link", "set", outside, "master", self.bridge],
                               ["link", "set", outside, "up"],
                               ["-n", ns, "addr", "add", f"{SUBNET}.{number}/24", "dev", "eth0"],
                               ["-n", ns, "link", "set", "eth0", "up"],
                               ["-n", ns, "link", "set", "lo", "up"]]

    def create(self) -> None:
        _remove_leftovers()
        for command in self._commands:
            done = _ip(*command)
            if done.returncode != 0:
                self.remove()
                pytest.skip(f"cannot build network namespaces here (ip {' '.join(command)}: {done.stderr.strip()})")

    def remove(self) -> None:
        for ns in self.namespaces.values():
            _ip("netns", "del", ns)
        _ip("link", "del", self.bridge)

    def address(self, role: str) -> str:
        return f"{SUBNET}.{HOSTS[role]}"

    def cut(self, role: str) -> None:
        subprocess.run(["ip", "link", "set", self.links[role], "down"], check=True)

    def mend(self, role: str) -> None:
        subprocess.run(["ip", "link", "set", self.links[role], "up"], check=True)


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    network = Network()
    network.create()
    broker_ip = network.address("broker")
    parts = []
    try:
        broker = cluster.broker(REPO, *HEARTBEAT, frontend=f"tcp://{broker_ip}:5555",
                                backend=f"tcp://{broker_ip}:5556", netns=network.namespaces["broker"])
        parts.append(broker)
        broker.wait_ready()
        workers = [cluster.worker(broker.backend, REPO, *HEARTBEAT, "--models", "whoami",
                                  netns=network.namespaces[role]) for role in ("worker1", "worker2")]
        gateway = cluster.gateway(broker.frontend, *HEARTBEAT, host=network.address("gateway"),
                                  netns=network.namespaces["gateway"])
        parts += [*workers, gateway]
        for part in parts[1:]:
            part.wait_ready()
        cluster.wait_until(lambda: all(len(instance_pids(w)) == 1 for w in workers), what="one instance per host")
        cluster.wait_until(lambda: model_ready(gateway.url), what="whoami ready")
        yield network, broker, workers, gateway
    finally:
        for part in reversed(parts):
            part.stop(timeout_s=20)
        network.remove()


def test_traffic_is_balanced_over_both_worker_hosts(hosts):
    _, _, workers, gateway = hosts
    with Load(gateway.url, threads=4, delay_ms=20) as load:
        time.sleep(2)
    counts = [sum(1 for o in load.outcomes if o.pid in instance_pids(w)) for w in workers]
    assert not failures(load.outcomes)
    assert all(count >= len(load.outcomes) // 5 for count in counts), f"unbalanced: {counts}"


def test_a_worker_host_that_vanishes_from_the_network_is_dropped_and_rejoins_when_back(hosts):
    network, broker, workers, gateway = hosts
    vanished, survivor = workers
    logged_before = len(broker.logs())
    with Load(gateway.url, threads=4, delay_ms=50) as load:
        cluster.wait_until(lambda: served_by(load.outcomes) & instance_pids(vanished), what="traffic on both hosts")
        cut_at = time.monotonic()
        network.cut("worker1")
        cluster.wait_until(lambda: "stopped answering heartbeats" in broker.logs()[logged_before:], timeout_s=15,
                           what="the host dropped")
        after_drop = time.monotonic()
        cluster.wait_until(lambda: served_by(load.since(after_drop)) & instance_pids(survivor), what="the other host")
        network.mend("worker1")
        cluster.wait_until(lambda: "is ready" in broker.logs().split("dropping it")[-1], timeout_s=30,
                           what="the host's instance registered again")
        back_at = time.monotonic()
        cluster.wait_until(lambda: served_by(load.since(back_at + 1)) & instance_pids(vanished), timeout_s=15,
                           what="traffic on the host back")
    assert not [o for o in failures(load.outcomes) if o.status != "503"], failures(load.outcomes)[:3]
    assert all(o.ended - o.started < 15 for o in load.outcomes), "no request may wait on a vanished host"
    assert all(o.started < cut_at + 2 for o in failures(load.outcomes))
    assert served_by(load.since(after_drop)) & instance_pids(survivor), "the other host keeps serving"
    assert served_by(load.since(back_at + 1)) & instance_pids(vanished), "the host gets traffic again"
    assert "stopped answering heartbeats" in broker.logs()


def test_a_worker_host_killed_under_load_leaves_no_request_unanswered(hosts):
    _, broker, workers, gateway = hosts
    victim, survivor = workers
    with Load(gateway.url, threads=4, delay_ms=50) as load:
        cluster.wait_until(lambda: served_by(load.outcomes) & instance_pids(victim), what="traffic on both hosts")
        killed_at = time.monotonic()
        victim.kill()
        time.sleep(1)
        after_kill = time.monotonic()
        cluster.wait_until(lambda: served_by(load.since(after_kill)) & instance_pids(survivor), what="the other host")
        victim.start()
        victim.wait_ready()
        cluster.wait_until(lambda: len(instance_pids(victim)) == 1, what="the host's instance restarted")
        back_at = time.monotonic()
        cluster.wait_until(lambda: served_by(load.since(back_at)) & instance_pids(victim), timeout_s=15,
                           what="the restarted host serving")
    assert not [o for o in failures(load.outcomes) if o.status != "503"], failures(load.outcomes)[:3]
    assert all(o.started < killed_at + 2 for o in failures(load.outcomes))
