"""Membership's invariants, through the broker's loop in-process (the harness of test_broker_inprocess):
the generation moves once per change gateways must see, instances come and go only through
``Membership``, a draining host's instances drain, and a silent peer's instances are removed.
Asserted on the broker's state, its metrics and what peers are sent, not on logs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tritium.broker.metrics import MetricsSettings, TritonCollector, render
from tests.broker.inprocess_world import HEARTBEAT_S, Peer, World, answer, infer
from tritium.protocol import HEARTBEAT_SUFFIX, PROTOCOL_VERSION, Drain, Heartbeat, Hello, InstanceExited, InstanceHealth, Kind, Role


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path)
    yield world
    world.close()


def second_instance(world: World, iid: bytes = b"instance-2", name: str = "m_1") -> Peer:
    """Another instance of the serving version, on the same host."""
    version = world.broker.registry.versions[("m", 1)]
    instance = world.peer("back", iid)
    instance.send(Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, agent="agent-1", model="m",
                        version=1, epoch=version.epoch, name=name, boot=world.broker.boot, credit=2,
                        instance_kind="CPU").encode())
    world.until(lambda: iid in world.broker.registry.instances)
    return instance


def exited(world: World, agent: Peer, iid: bytes, name: str) -> None:
    version = world.broker.registry.versions[("m", 1)]
    agent.send(InstanceExited(iid.decode(), "exited with status 1", 1, version.epoch, name, False,
                              world.broker.boot).encode())
    world.until(lambda: iid not in world.broker.registry.instances)


def instances_per_host(world: World) -> dict[str, float]:
    """The broker's tritium_instances gauge, per host, as /metrics shows it."""
    text = render(TritonCollector(world.broker.registry, MetricsSettings())).decode()
    return {re.search(r'host="([^"]*)"', labels).group(1): float(value)
            for labels, value in re.findall(r"^tritium_instances\{([^}]*)\} (\S+)$", text, flags=re.MULTILINE)}


def test_the_generation_moves_once_per_change_gateways_see_and_the_instances_follow_joins_and_exits(world):
    gateway = world.gateway()
    agent, _ = world.serving_instance()
    registry, version = world.broker.registry, world.broker.registry.versions[("m", 1)]
    ready = registry.generation
    second_instance(world)
    assert registry.generation == ready   # not the first instance: gateways see nothing new
    assert [i.iid for i in version.instances] == [b"instance-1", b"instance-2"] == list(registry.instances)
    assert instances_per_host(world) == {"h": 2.0}

    health = InstanceHealth(False).encode()
    world.peers[-1].send(health)
    world.until(lambda: not registry.instances[b"instance-2"].healthy)
    assert registry.generation == ready + 1
    world.peers[-1].send(health)   # the same report again changes nothing
    world.until(lambda: True)
    assert registry.generation == ready + 1

    exited(world, agent, b"instance-2", "m_1")
    assert registry.generation == ready + 1   # one instance still serves
    assert [i.iid for i in version.instances] == [b"instance-1"] == list(registry.instances)
    assert instances_per_host(world) == {"h": 1.0}

    exited(world, agent, b"instance-1", "m_0")
    assert registry.generation == ready + 2   # the last one left: the version is not ready any more
    assert version.instances == [] and registry.instances == {}
    assert instances_per_host(world) == {"h": 0.0}
    world.until(lambda: gateway.headers(Kind.MODELS)[-1]["generation"] == registry.generation)
    (row,) = gateway.headers(Kind.MODELS)[-1]["models"][0]["versions"]
    assert row[1:] == ["READY", "", False]   # serving, but not ready: no instance left


def test_a_draining_host_s_instances_take_no_new_work_and_it_is_told_once_they_hold_none(world):
    gateway = world.gateway()
    agent, instance = world.serving_instance()
    registry = world.broker.registry
    second_instance(world)
    infer(gateway, rid=1)
    world.until(lambda: instance.headers(Kind.BATCH) or world.peers[-1].headers(Kind.BATCH))
    busy = instance if instance.headers(Kind.BATCH) else world.peers[-1]
    generation = registry.generation
    agent.send(Drain().encode())
    world.until(lambda: registry.agents[b"agent-1"].draining)
    assert all(i.draining for i in registry.instances.values()) and len(registry.instances) == 2
    assert registry.generation == generation and not agent.headers(Kind.DRAINED)   # a batch still runs
    ((batch, _), *records) = busy.messages[-1]
    answer(busy, batch, records)
    world.until(lambda: agent.headers(Kind.DRAINED))
    assert gateway.headers(Kind.RESPONSE)[0]["rid"] == 1


def test_an_instance_that_stops_heartbeating_is_removed_and_awaited_back(world):
    world.gateway()
    agent, instance = world.serving_instance()
    registry, version = world.broker.registry, world.broker.registry.versions[("m", 1)]
    generation = registry.generation
    agent_beat = Heartbeat(role=Role.AGENT).encode()

    def instance_dropped() -> bool:
        agent.send(agent_beat)   # its host lives: the instance is expected back
        return b"instance-1" not in registry.instances

    world.until(instance_dropped, timeout_s=4 * HEARTBEAT_S * 3)
    assert version.instances == [] and b"agent-1" in registry.agents
    assert registry.generation == generation + 1
    assert "m_0" in version.awaited
    assert instance.headers(Kind.RESET)   # should it wake up: it exits and is restarted
    assert instances_per_host(world) == {"h": 0.0}


def test_an_unknown_instance_heartbeating_is_told_to_exit_on_its_heartbeat_socket_too(world):
    """Its main thread may be blocked in a model's execute, on a BLS call a previous broker
    process held: its heartbeat thread hears the RESET and fails that call, so that it can go."""
    world.serving_instance()
    instance = world.peer("back", b"instance-9")
    beats = world.peer("back", b"instance-9" + HEARTBEAT_SUFFIX)
    beats.send(Heartbeat(heartbeat_s=HEARTBEAT_S, iid="instance-9", agent="agent-1", joined=True).encode())
    world.until(lambda: instance.headers(Kind.RESET) and beats.headers(Kind.RESET))
    assert instance.headers(Kind.RESET)[0] == beats.headers(Kind.RESET)[0]
    assert beats.headers(Kind.RESET)[0].get("e") is None   # not kept: it exits, its agent starts it again


def tensor_pools(world: World) -> dict[tuple[str, str], list[float]]:
    """(process, kind) -> the pool's size, bytes in use, overflows and renewals, as /metrics shows them."""
    text = render(TritonCollector(world.broker.registry, MetricsSettings())).decode()
    found: dict[tuple[str, str], list[float]] = {}
    for name in ("tritium_tensor_pool_bytes", "tritium_tensor_pool_used_bytes", "tritium_tensor_pool_overflows_total",
                 "tritium_tensor_pool_renewals_total"):
        for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, flags=re.MULTILINE):
            key = (re.search(r'process="([^"]*)"', labels).group(1), re.search(r'kind="([^"]*)"', labels).group(1))
            found.setdefault(key, []).append(float(value))
    return found


def test_the_tensor_pools_gateways_and_instances_report_are_in_metrics_while_they_serve(world):
    gateway = world.gateway()
    agent, instance = world.serving_instance()
    assert tensor_pools(world) == {}
    gateway.send(Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION,
                           pools=[("request", 4096, 1024, 2, 0)]).encode())
    instance.send(Heartbeat(heartbeat_s=HEARTBEAT_S, iid="instance-1", agent="agent-1", joined=True,
                            pools=[("answer", 8192, 0, 5, 1), ("bls", 4096, 0, 0, 0)]).encode())
    world.until(lambda: len(tensor_pools(world)) == 3)
    assert tensor_pools(world) == {("gw-1", "request"): [4096, 1024, 2, 0], ("instance-1", "answer"): [8192, 0, 5, 1],
                                   ("instance-1", "bls"): [4096, 0, 0, 0]}
    instance.send(Heartbeat(heartbeat_s=HEARTBEAT_S, iid="instance-1", agent="agent-1", joined=True,
                            pools=[("answer", 8192, 2048, 6, 1)]).encode())
    world.until(lambda: tensor_pools(world).get(("instance-1", "answer")) == [8192, 2048, 6, 1])
    assert ("instance-1", "bls") not in tensor_pools(world)   # the figures are the last heartbeat's
    exited(world, agent, b"instance-1", "m_0")
    assert tensor_pools(world) == {("gw-1", "request"): [4096, 1024, 2, 0]}   # an instance gone takes its pool along


def test_a_silent_host_takes_all_its_instances_with_it_in_one_generation(world):
    world.gateway()
    world.serving_instance()
    second_instance(world)
    registry, version = world.broker.registry, world.broker.registry.versions[("m", 1)]
    generation = registry.generation
    assert instances_per_host(world) == {"h": 2.0}
    world.until(lambda: not registry.agents, timeout_s=4 * HEARTBEAT_S * 3)
    assert registry.instances == {} and version.instances == [] and registry.host_metrics == {}
    assert registry.generation == generation + 1
    assert version.awaited == {}   # nothing restarts them: their host is gone
    assert instances_per_host(world) == {}


# Who may write what of the registry: everything else only reads it.
_OWNERS = {"instances": "membership.py", "agents": "membership.py", "host_metrics": "membership.py",
           "tensor_pools": "membership.py",
           "generation": "membership.py", "models": "lifecycle.py", "versions": "lifecycle.py",
           "epochs": "lifecycle.py", "shared_memory": "control.py",
           "trace_settings": "control.py"}
_MUTATORS = {"pop", "clear", "update", "setdefault", "popitem", "append", "remove", "extend", "insert"}


def _registry_writes(tree: ast.AST) -> list[tuple[str, int]]:
    """(registry field, line) of each write: assignment, deletion or a mutating call."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and target.attr in _OWNERS \
                    and "registry" in ast.unparse(target.value):
                found.append((target.attr, node.lineno))
            elif isinstance(target, ast.Attribute) and target.attr == "instances" \
                    and isinstance(node, ast.Call):   # a version's own instance list
                found.append(("instances", node.lineno))
    return found


def test_each_part_of_the_registry_is_written_by_its_owner_only():
    broker = Path(__file__).resolve().parents[2] / "broker"
    strays = [f"{path.name}:{line} writes registry {field}" for path in sorted(broker.glob("*.py"))
              if path.name != "registry.py"
              for field, line in _registry_writes(ast.parse(path.read_text()))
              if _OWNERS[field] != path.name]
    assert strays == []


def test_what_the_bls_sockets_of_an_instance_and_of_its_forked_processes_left_goes_with_it(world):
    agent, _ = world.serving_instance()
    membership = world.broker.membership
    for peer in (b"instance-1/bls", b"instance-1/bls/4242", b"instance-10/bls/7"):
        membership.note_bls_call(peer, 1)
    exited(world, agent, b"instance-1", "m_0")
    assert list(membership._first_bls_rid) == [b"instance-10/bls/7"]   # another instance's stays


def test_an_instance_the_broker_refused_while_loading_fails_the_load(world):
    """An instance the broker refused (status 5) ends for good and must fail its load, or the load
    would wait for it forever (one that failed to initialize, 3, fails it with its own report)."""
    agent, assignment, boot = world.placing_agent()
    version = world.broker.registry.versions[("m", 1)]
    world.until(lambda: "m_0" in version.placed)
    agent.send(InstanceExited("agent-1/m/1/x/m_0/1", "exited with status 5", 5, assignment["e"], "m_0", False,
                              boot, final=True).encode())
    world.until(lambda: version.state.value == "UNAVAILABLE")
    assert version.reason == "instance m_0 exited with status 5 before it was ready"
