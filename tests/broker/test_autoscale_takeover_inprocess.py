"""A model autoscaled to zero (``min=0``) across a broker restart, in-process with scripted peers.

Such a version is READY as soon as the new broker process loads it, before any worker host
registered again. A request for it waits for the hosts instead of failing for want of one:
it is served by the instance a host still runs (kept, no cold start) or, when none does, by a
cold start once the hosts had their time to register; no host within the broker's first
seconds answers it as a broker without hosts does.
"""

from __future__ import annotations

import time

import pytest

from tests.broker.inprocess_world import CONFIG, HEARTBEAT_S, Peer, World, answer, infer
from tests.broker.test_broker_restart_inprocess import returning_heartbeat
from tritium.protocol import PROTOCOL_VERSION, Heartbeat, Hello, Kind, Placed, RunningInstance, Role

SCALED_TO_ZERO = CONFIG + ' parameters { key: "tritium.autoscale" value: { string_value: "min=0,max=2" } }'


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path, config=SCALED_TO_ZERO)
    world.broker.hold.until_ns = time.monotonic_ns() + 60_000_000_000   # not ended by a slow machine
    yield world
    world.close()


def request_before_any_host(world: World) -> Peer:
    """A gateway of the previous broker process sends a request, then heartbeats."""
    gateway = world.peer("front", b"gw-old")
    infer(gateway, rid=7, value=5)
    gateway.send(returning_heartbeat(next_rid=8))
    world.until(lambda: gateway.headers(Kind.HEARTBEAT))
    evaluated = time.monotonic() + 0.3   # beyond the autoscaler's evaluation every 250 ms
    while time.monotonic() < evaluated:
        world.broker.turn(50)
    gateway.collect()
    return gateway


def agent_hello(world: World, running: tuple[RunningInstance, ...] = ()) -> Peer:
    agent = world.peer("back", b"agent-1")
    agent.send(Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, host="h", gpus=(), cpu_slots=2,
                     running=running).encode())
    world.until(lambda: agent.headers(Kind.ASSIGN))
    return agent


def instance_hello(world: World, agent: Peer, identity: bytes, epoch: int) -> Peer:
    instance = world.peer("back", identity)
    instance.send(Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, agent="agent-1", model="m",
                        version=1, epoch=epoch, name="m_0", boot=agent.headers(Kind.HEARTBEAT)[0]["boot"],
                        credit=2, instance_kind="CPU").encode())
    return instance


def served(world: World, gateway: Peer, instance: Peer) -> dict:
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    answer(instance, batch, [(header, raw)])
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((response, _),) = gateway.records(Kind.RESPONSE)
    return response


def test_a_request_before_the_hosts_register_is_served_by_the_instance_a_host_still_runs(world):
    version = world.broker.registry.versions[("m", 1)]
    assert version.state.value == "READY"   # min=0: ready with no instance
    gateway = request_before_any_host(world)
    assert not gateway.headers(Kind.RESPONSE), "it waits for the hosts, not 'no instance ... is running'"

    kept = RunningInstance("agent-1/m_0", "m", 1, version.identity, "m_0", "m_0", "CPU", 0, 2, True, 1)
    agent = agent_hello(world, running=(kept,))
    ((scaled,),) = [a["scale"] for a in agent.headers(Kind.ASSIGN)]
    assert scaled["count"] == 1 and scaled["assignment"]["adopt"] == ["agent-1/m_0"]
    epoch = scaled["assignment"]["e"]
    agent.send(Placed("m", 1, epoch, agent.headers(Kind.HEARTBEAT)[0]["boot"], instances=["m_0"],
                      adopted={"m_0": "agent-1/m_0"}).encode())
    instance = instance_hello(world, agent, b"agent-1/m_0", epoch)
    response = served(world, gateway, instance)

    assert response["rid"] == 7 and "err" not in response
    assert not agent.headers(Kind.SCALE), "no cold start beside the instance kept"
    assert version.scale is not None and version.scale.cold_starts == 0 and version.scale.total == 1


def test_a_request_before_the_hosts_register_cold_starts_on_the_first_host_without_a_kept_instance(world):
    gateway = request_before_any_host(world)
    assert not gateway.headers(Kind.RESPONSE)

    agent = agent_hello(world)
    registered = time.monotonic()

    def scaled() -> bool:   # the agent heartbeats meanwhile, as a live one does
        agent.send(Heartbeat(heartbeat_s=HEARTBEAT_S, role=Role.AGENT, protocol_version=PROTOCOL_VERSION).encode())
        return bool(agent.headers(Kind.SCALE))

    world.until(scaled)
    assert time.monotonic() - registered >= HEARTBEAT_S + 1.0, "the other hosts had their time to register"
    ((scale,),) = [agent.headers(Kind.SCALE)]
    assert scale["count"] == 1
    instance = instance_hello(world, agent, b"agent-1/m_0", scale["assignment"]["e"])
    response = served(world, gateway, instance)

    version = world.broker.registry.versions[("m", 1)]
    assert response["rid"] == 7 and "err" not in response
    assert version.scale is not None and version.scale.cold_starts == 1


def test_a_request_is_refused_as_without_hosts_once_none_registered_in_the_brokers_first_seconds(world):
    gateway = request_before_any_host(world)
    assert not gateway.headers(Kind.RESPONSE)
    world.broker.hold.until_ns = time.monotonic_ns()   # no worker host came back in time
    world.until(lambda: gateway.headers(Kind.RESPONSE), timeout_s=2.0)
    ((response, _),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 7
    assert response["err"]["message"] == "no instance of model 'm' version 1 is running"
    infer(gateway, rid=8)   # from now on, at once
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    assert gateway.headers(Kind.RESPONSE)[1]["err"]["message"] == "no instance of model 'm' version 1 is running"
