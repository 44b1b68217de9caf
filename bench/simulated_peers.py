"""Cheap stand-ins for a broker's peers, for the broker benchmarks: host agents that place
whatever they are assigned, instances that answer every BATCH at once, gateways that keep a
window of requests outstanding, all ZeroMQ DEALERs of this process speaking tritium's protocol.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from tritium.protocol import (
    PROTOCOL_VERSION,
    Assign,
    Batch,
    BatchDone,
    Heartbeat,
    Hello,
    Placed,
    Response,
    Role,
    read_record,
)
from tritium.zmqio import recv_parts, send_parts

MakeRequest = Callable[[int, str], bytes]   # (rid, model) -> an INFER record
MakeAnswer = Callable[[int], bytes]         # rid -> its RESPONSE record


class SimulatedPeers:
    """``agents`` host agents starting ``instances`` instances per load, and ``gateways``
    gateways keeping ``window`` requests each in flight once ``start`` names a model."""

    def __init__(self, context: zmq.Context, frontend: str, backend: str, *, agents: int, instances: int,
                 gateways: int, window: int, request: MakeRequest, answer: MakeAnswer) -> None:
        self.context = context
        self.backend = backend
        self.poller = zmq.Poller()
        self.agents = [self._socket(backend, f"agent-{i}") for i in range(agents)]
        self.instances_per_load = instances
        self.instances: dict[zmq.Socket, str] = {}   # socket -> its iid
        self.gateways = [self._socket(frontend, f"gw-{i}") for i in range(gateways)]
        self.window = window
        self.boot: int | None = None
        self.model = ""            # what the gateways ask for; "" once stopped
        self.answered = 0
        self.errors = 0
        self._request = request
        self._answer = answer
        self._rid = 0

    def _socket(self, address: str, identity: str) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        self.poller.register(sock, zmq.POLLIN)
        return sock

    def hello(self) -> None:
        for index, agent in enumerate(self.agents):
            send_parts(agent, [Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=1.0, host=f"host-{index}",
                                     gpus=[]).encode()])
        for gateway in self.gateways:
            send_parts(gateway, [Hello(Role.GATEWAY, PROTOCOL_VERSION, heartbeat_s=1.0).encode()])

    def heartbeat(self) -> None:
        for agent in self.agents:
            send_parts(agent, [Heartbeat(heartbeat_s=1.0, role=Role.AGENT).encode()])
        for sock, iid in self.instances.items():
            send_parts(sock, [Heartbeat(heartbeat_s=1.0, iid=iid, joined=True).encode()])
        for gateway in self.gateways:
            send_parts(gateway, [Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY,
                                           protocol_version=PROTOCOL_VERSION).encode()])

    def start(self, model: str) -> None:
        self.model = model
        for gateway in self.gateways:
            send_parts(gateway, [self._next_request() for _ in range(self.window)])

    def stop(self) -> None:
        """The gateways send nothing more; what is in flight is still answered."""
        self.model = ""

    def _next_request(self) -> bytes:
        self._rid += 1
        return self._request(self._rid, self.model)

    def turn(self, timeout_ms: int) -> None:
        """Handle every message that arrives within ``timeout_ms``."""
        for sock, _ in self.poller.poll(timeout_ms):
            while True:
                try:
                    parts = recv_parts(sock)
                except zmq.Again:
                    break
                self._handle(sock, parts)

    def _handle(self, sock: zmq.Socket, parts: list) -> None:
        message = read_record(parts[0])[0]
        if isinstance(message, Heartbeat) and self.boot is None:
            self.boot = message.boot
        elif isinstance(message, Assign):
            self._place(sock, message.models)
        elif isinstance(message, Batch):
            self._execute(sock, message, parts[1:])
        elif isinstance(message, Response):
            self._answered(sock, parts)

    def _place(self, agent: zmq.Socket, models: tuple) -> None:
        agent_id = agent.getsockopt(zmq.IDENTITY).decode()
        for model in models:
            names = [f"{model.model}_0_{j}" for j in range(self.instances_per_load)]
            send_parts(agent, [Placed(model.model, model.version, model.epoch, self.boot, instances=names).encode()])
            for name in names:
                iid = f"{agent_id}/{name}"
                sock = self._socket(self.backend, iid)
                self.instances[sock] = iid
                send_parts(sock, [Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=1.0, agent=agent_id,
                                        model=model.model, version=model.version, epoch=model.epoch, name=name,
                                        boot=self.boot, credit=2, instance_kind="CPU").encode()])

    def _execute(self, instance: zmq.Socket, batch: Batch, records: list) -> None:
        responses = [self._answer(read_record(record)[0].rid) for record in records]
        done = BatchDone(batch.number, [True] * len(responses), [0] * len(responses), [0, 1000, 0])
        send_parts(instance, [done.encode(), *responses])

    def _answered(self, gateway: zmq.Socket, parts: list) -> None:
        again = []
        for part in parts:
            message = read_record(part)[0]
            if not isinstance(message, Response):
                continue
            if message.error is not None:
                self.errors += 1
            else:
                self.answered += 1
            if self.model:
                again.append(self._next_request())
        if again:
            send_parts(gateway, again)
