"""Scripted peers for the broker's loop in-process, over ``inproc://``: a ``World`` holds a broker
driven turn by turn (``Broker.turn``) and the DEALER sockets that play its gateways, host agents and
instances, so that tests assert on the messages and the broker's state, not on logs.
"""

from __future__ import annotations

import itertools
import time

import zmq

from tritium.broker.server import Broker, BrokerSettings
from tests.repo.helpers import PLAIN_PY_MODEL, write_model
from tritium.protocol import (
    PROTOCOL_VERSION,
    BatchDone,
    Hello,
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
    def __init__(self, root, config: str = CONFIG, spin_s: float = 0.0, rate_limit_resources=None) -> None:
        write_model(root / "repo", "m", config, {"1/model.py": PLAIN_PY_MODEL})
        self.context = zmq.Context()
        name = next(_names)
        self.broker = Broker(BrokerSettings(model_repositories=(str(root / "repo"),),
                                            frontend=f"inproc://front-{name}", backend=f"inproc://back-{name}",
                                            metrics=None, heartbeat_interval_s=HEARTBEAT_S, spin_s=spin_s,
                                            rate_limit_resources=rate_limit_resources),
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

    def placing_agent(self) -> tuple[Peer, dict, int]:
        """An agent that placed the model's instance m_0 (not yet started): it, its assignment, the boot."""
        agent = self.peer("back", b"agent-1")
        agent.send(Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, host="h", gpus=()).encode())
        self.until(lambda: agent.headers(Kind.ASSIGN))
        (assignment,) = agent.headers(Kind.ASSIGN)[0]["models"]
        boot = agent.headers(Kind.HEARTBEAT)[0]["boot"]
        agent.send(Placed("m", 1, assignment["e"], boot, instances=["m_0"]).encode())
        return agent, assignment, boot

    def serving_instance(self) -> tuple[Peer, Peer]:
        """An agent that places the model, and its instance, READY."""
        agent, assignment, boot = self.placing_agent()
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


def infer(gateway: Peer, rid: int, value: float = 1.0) -> bytes:
    record = Infer(rid, "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode(
        [bytes([int(value)]) * 16])
    gateway.send(record)
    return record


def answer(instance: Peer, batch: dict, records: list[tuple[dict, bytes]]) -> None:
    """The instance's BATCH_DONE: each request's output is its input bytes."""
    responses = [Response(header["rid"], [["Y", "FP32", [1, 4], 16, False]]).encode([raw[-16:]])
                 for header, raw in records]
    done = BatchDone(batch["b"], [True] * len(responses), [0] * len(responses), (1_000, 2_000, 3_000))
    instance.send(done.encode(), *responses)
