"""A scheduler with an autoscaler and hosts with room, for tests: a fake clock and recorded sends
(tests/broker/scheduler_world.py) plus the SCALE messages the autoscaler sends to agents."""

from __future__ import annotations

from tritium.broker.autoscale import Autoscaler
from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.registry import AgentRecord, InstanceRecord, ModelVersion
from tritium.broker.startup_hold import StartupHold
from tests.broker.scheduler_world import CONFIG, definition, make_world
from tritium.protocol import Scale, read_record

SCALED = CONFIG + ' parameters { key: "tritium.autoscale" value: { string_value: "%s" } }'


class World:
    def __init__(self, setting: str, hosts: dict[bytes, int], hold_s: float = 0.0) -> None:
        self.registry, version, self.scheduler, self.to_instances, self.to_gateways, self.clock = make_world("")
        self.version = ModelVersion("m", 1, definition(SCALED % setting), epoch=1)
        self.version.state = version.state
        self.registry.models["m"].versions[1] = self.version
        self.registry.versions[self.version.key] = self.version
        self.registry.epochs[1] = self.version
        self.hold = StartupHold(hold_s, self.clock, rejoin_s=1.0)   # hold_s: hosts may yet register meanwhile
        self.autoscaler = Autoscaler(self.registry, self.to_instances.append, self.scheduler, self.clock,
                                     Membership(self.registry, self.scheduler, PeerLiveness(1.0)).changed, self.hold)
        self.scheduler.autoscaler = self.autoscaler
        for identity, slots in hosts.items():
            self.host_registers(identity, slots)

    def host_registers(self, identity: bytes, slots: int, keeps: int = 0) -> None:
        """A host registers, still running ``keeps`` instances of the model (adopted)."""
        self.registry.agents[identity] = AgentRecord(identity, identity.decode(), (), None, cpu_slots=slots)
        self.hold.host_registered(kept_instances=keeps > 0)
        if keeps:
            self.autoscaler.adopt(self.version, identity, keeps)

    def scales(self) -> list[tuple[bytes, int, list]]:
        """(host, count, stop) of every SCALE sent so far."""
        found = []
        for parts in self.to_instances:
            message = read_record(parts[1])[0]
            if isinstance(message, Scale):
                found.append((parts[0], message.count, list(message.stop)))
        return found

    def join(self, host: bytes, name: str) -> InstanceRecord:
        instance = InstanceRecord(f"{host.decode()}/{name}".encode(), host, "m", 1, name, 2, epoch=1)
        self.registry.instances[instance.iid] = instance
        self.version.instances.append(instance)
        self.autoscaler.instance_joined(self.version)
        return instance
