"""The broker process's loop, in-process, over ``inproc://`` with scripted peers.

A test plays the gateway, the host agent and the instance with DEALER sockets of its
own and drives the broker turn by turn (``Broker.turn``), so that orderings, failures and
liveness are exact and asserted on the messages and the broker's state, not on logs.
"""

from __future__ import annotations

import itertools
import time

import pytest
import zmq

from tritium.broker.server import Broker, BrokerSettings
from tests.repo.helpers import PLAIN_PY_MODEL, write_model
from tritium.logs import LogSettings
from tritium.protocol import (
    PROTOCOL_VERSION,
    BatchDone,
    Control,
    Heartbeat,
    Hello,
    IndexQuery,
    Infer,
    Kind,
    Placed,
    Response,
    Role,
    decode,
)
from tritium.zmqio import recv_parts, send_parts

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching { }
"""
HEARTBEAT_S = 0.2
_names = itertools.count()


class Peer:
    """A scripted gateway, agent or instance: sends records, collects what the broker sends it."""

    def __init__(self, context: zmq.Context, address: str, identity: bytes) -> None:
        self.identity = identity
        self.sock = context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.messages: list[list[tuple[dict, bytes]]] = []   # per message: (header, the record's bytes)

    def send(self, *records: bytes) -> None:
        send_parts(self.sock, list(records))

    def collect(self) -> None:
        while True:
            try:
                parts = recv_parts(self.sock)
            except zmq.Again:
                return
            self.messages.append([(decode(part)[0], part.bytes) for part in parts])

    def records(self, kind: Kind) -> list[tuple[dict, bytes]]:
        return [(header, raw) for message in self.messages for header, raw in message if header["k"] == kind]

    def headers(self, kind: Kind) -> list[dict]:
        return [header for header, _ in self.records(kind)]


class World:
    def __init__(self, root, config: str = CONFIG, spin_s: float = 0.0) -> None:
        write_model(root / "repo", "m", config, {"1/model.py": PLAIN_PY_MODEL})
        self.context = zmq.Context()
        name = next(_names)
        self.broker = Broker(BrokerSettings(model_repositories=(str(root / "repo"),),
                                            frontend=f"inproc://front-{name}", backend=f"inproc://back-{name}",
                                            metrics=None, heartbeat_interval_s=HEARTBEAT_S, spin_s=spin_s),
                             self.context)
        self.broker.load_repository()
        self.peers: list[Peer] = []

    def peer(self, side: str, identity: bytes) -> Peer:
        peer = Peer(self.context, self.broker.settings.frontend if side == "front" else self.broker.settings.backend,
                    identity)
        self.peers.append(peer)
        return peer

    def until(self, condition, timeout_s: float = 5.0) -> None:
        """Turn the broker (and let the peers read) until ``condition()`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.broker.turn(5)
            for peer in self.peers:
                peer.collect()
            if condition():
                return
            assert time.monotonic() < deadline, "the broker did not get there in time"

    def gateway(self, identity: bytes = b"gw-1") -> Peer:
        gateway = self.peer("front", identity)
        gateway.send(Hello(Role.GATEWAY, PROTOCOL_VERSION, heartbeat_s=1.0).encode())
        self.until(lambda: gateway.headers(Kind.MODELS))
        return gateway

    def serving_instance(self) -> tuple[Peer, Peer]:
        """An agent that places the model, and its instance, READY."""
        agent = self.peer("back", b"agent-1")
        agent.send(Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, host="h", gpus=()).encode())
        self.until(lambda: agent.headers(Kind.ASSIGN))
        (assignment,) = agent.headers(Kind.ASSIGN)[0]["models"]
        boot = agent.headers(Kind.HEARTBEAT)[0]["boot"]
        agent.send(Placed("m", 1, assignment["e"], boot, instances=["m_0"]).encode())
        instance = self.peer("back", b"instance-1")
        instance.send(Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, agent="agent-1", model="m",
                            version=1, epoch=assignment["e"], name="m_0", boot=boot, credit=2,
                            instance_kind="CPU").encode())
        self.until(lambda: self.broker.registry.versions[("m", 1)].state.value == "READY")
        return agent, instance

    def close(self) -> None:
        for peer in self.peers:
            peer.sock.close(0)
        self.broker.close()
        self.context.term()


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path)
    yield world
    world.close()


def infer(gateway: Peer, rid: int, value: float = 1.0) -> bytes:
    record = Infer(rid, "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode(
        [bytes([int(value)]) * 16])
    gateway.send(record)
    return record


def answer(instance: Peer, batch: dict, records: list[tuple[dict, bytes]]) -> None:
    """The instance's BATCH_DONE: each request's output is its input bytes."""
    responses = [Response(header["rid"], [["Y", "FP32", [1, 4], 16, False]]).encode([raw[-16:]])
                 for header, raw in records]
    done = BatchDone(batch["b"], [True] * len(responses), [0] * len(responses), [1_000, 2_000, 3_000])
    instance.send(done.encode(), *responses)


def test_a_gateway_that_says_hello_gets_the_boot_id_the_model_table_and_the_log_settings(world):
    gateway = world.gateway()
    beat = gateway.headers(Kind.HEARTBEAT)[0]
    assert beat["boot"] == world.broker.boot and beat["hb"] == HEARTBEAT_S
    table = gateway.headers(Kind.MODELS)[-1]
    assert [(m["name"], m["versions"]) for m in table["models"]] == [("m", [[1, "LOADING", "", True]])]
    assert gateway.headers(Kind.LOG_SETTINGS)
    assert b"gw-1" in world.broker.gateways


def test_a_request_goes_to_the_instance_untouched_and_its_answer_back_with_statistics(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    world.until(lambda: any(v[1] == "READY" for m in gateway.headers(Kind.MODELS)[-1]["models"] for v in m["versions"]))
    sent = infer(gateway, rid=7, value=3)
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    assert (batch["k"], batch["n"], header["rid"], raw) == (Kind.BATCH, 1, 7, sent)   # the very record
    answer(instance, batch, [(header, raw)])
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((response, body),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 7 and body.endswith(bytes([3]) * 16)
    stats = world.broker.registry.versions[("m", 1)].stats.as_dict("m", 1)
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["compute_infer"]["ns"] == 2_000
    assert stats["execution_count"] == 1


def test_requests_wait_for_a_busy_instance_and_leave_together_each_gateway_answered_once(world):
    first, second = world.gateway(b"gw-1"), world.gateway(b"gw-2")
    _, instance = world.serving_instance()
    infer(first, rid=1)
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 1)
    infer(first, rid=2)
    infer(second, rid=3)
    infer(first, rid=4)
    for _ in range(20):    # one batch at a time for a batching model: the rest wait in the broker
        world.broker.turn(2)
    instance.collect()
    assert len(instance.headers(Kind.BATCH)) == 1
    (batch_one,) = instance.messages
    answer(instance, batch_one[0][0], batch_one[1:])
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 2)
    batch_two = instance.messages[-1]
    assert [h["rid"] for h, _ in batch_two[1:]] == [2, 3, 4]
    first.messages.clear()
    second.messages.clear()
    answer(instance, batch_two[0][0], batch_two[1:])
    world.until(lambda: first.headers(Kind.RESPONSE) and second.headers(Kind.RESPONSE))
    assert [[h["rid"] for h, _ in m if h["k"] == Kind.RESPONSE] for m in first.messages] == [[2, 4]]  # one message
    assert [h["rid"] for h in second.headers(Kind.RESPONSE)] == [3]


def test_a_host_that_falls_silent_is_dropped_and_the_request_it_held_is_answered_503(world):
    gateway = world.gateway()
    world.serving_instance()
    infer(gateway, rid=5)
    world.until(lambda: world.broker.scheduler.holds_work(list(world.broker.registry.instances.values())))
    keep_gateway_alive = Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION).encode()

    def silent_host_dropped() -> bool:
        gateway.send(keep_gateway_alive)
        return bool(gateway.headers(Kind.RESPONSE))

    world.until(silent_host_dropped, timeout_s=4 * HEARTBEAT_S * 3)
    ((response, _),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 5 and response["err"]["code"] == 5   # UNAVAILABLE
    assert "was lost with its host h" in response["err"]["message"]
    assert world.broker.registry.agents == {} and world.broker.registry.instances == {}


def test_a_malformed_record_is_dropped_and_the_gateway_keeps_being_served(world):
    gateway = world.gateway()
    gateway.send(b"\x05\x00\x00\x00garbage-that-is-no-msgpack")
    gateway.send(Control(9, IndexQuery(ready=False)).encode())
    world.until(lambda: gateway.headers(Kind.CONTROL_REPLY))
    (reply,) = gateway.headers(Kind.CONTROL_REPLY)
    assert reply["rid"] == 9 and [e["name"] for e in reply["ok"]] == ["m"]


def test_a_peer_of_another_protocol_version_is_refused_with_the_reason(world):
    agent = world.peer("back", b"old-agent")
    agent.send(Hello(Role.AGENT, PROTOCOL_VERSION - 1, host="h", gpus=()).encode())
    world.until(lambda: agent.headers(Kind.REFUSED))
    (refused,) = agent.headers(Kind.REFUSED)
    assert refused["reason"] == (f"protocol version {PROTOCOL_VERSION - 1} refused; this broker speaks "
                                 f"version {PROTOCOL_VERSION}")
    assert b"old-agent" not in world.broker.registry.agents


def test_the_log_settings_the_broker_is_started_with_reach_a_gateway_that_says_hello(world):
    world.broker.log_settings = LogSettings(log_verbose_level=2)   # as tritium broker hands them on
    gateway = world.gateway()
    assert gateway.headers(Kind.LOG_SETTINGS)[-1]["settings"]["log_verbose_level"] == 2
