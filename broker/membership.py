"""Who is connected: gateways, host agents and instances; the only writer of the registry's agents,
instances and host metrics, and of its ``generation`` (what gateways see changed).

Every join, leave and drain of a peer or an instance goes through ``Membership``, so that
its invariants hold in one place: an instance is in ``registry.instances`` exactly while it
is in its version's ``instances``; the generation moves when a version gains its first
instance or loses its last, when an instance's health changes, and whenever another owner
(model loading, control, autoscaling) says what gateways see changed (``changed``). What the
broker answers to a peer's messages is decided in ``broker/peers.py``.
"""

from __future__ import annotations

from tritium.broker.liveness import PeerLiveness
from tritium.broker.registry import AgentRecord, InstanceRecord, ModelVersion, Registry
from tritium.broker.scheduler import Scheduler
from tritium.protocol import BLS_SUFFIX, HostMetrics


class Membership:
    def __init__(self, registry: Registry, scheduler: Scheduler, liveness: PeerLiveness) -> None:
        self.registry = registry
        self.scheduler = scheduler   # answers what a lost instance held
        self.liveness = liveness
        self.gateways: set[bytes] = set()
        # Where this process's requests begin on a link a previous broker process may also have
        # heard: an unregistered gateway -> the first rid heard from it (``gateway_boundary``), and
        # an instance's BLS socket (iid + BLS_SUFFIX) -> the first rid heard on it (``bls_boundary``).
        self._first_gateway_rid: dict[bytes, int] = {}
        self._first_bls_rid: dict[bytes, int] = {}

    def changed(self) -> None:
        """What gateways see (the model table) changed: it is pushed to them at the end of the turn."""
        self.registry.generation += 1

    # -- gateways -------------------------------------------------------------------------

    def add_gateway(self, peer: bytes) -> None:
        self.gateways.add(peer)

    def note_gateway_request(self, peer: bytes, rid: int) -> None:
        """A request (or control call) from ``peer``: the first one heard from a gateway not
        registered (yet), one of a previous broker process perhaps, is where this process's begin."""
        if peer not in self.gateways and peer not in self._first_gateway_rid:
            self._first_gateway_rid[peer] = rid

    def gateway_boundary(self, peer: bytes, next_rid: int | None) -> int | None:
        """The first rid this process heard from a gateway that registers now (its heartbeat's
        ``next_rid`` when none came before it; None for a HELLO that sent nothing): the gateway's
        requests below it went to a previous process."""
        return self._first_gateway_rid.pop(peer, next_rid)

    def remove_gateway(self, peer: bytes) -> bool:
        """False when ``peer`` was no gateway (still) known."""
        if peer not in self.gateways:
            return False
        self.gateways.discard(peer)
        self.liveness.forget(peer)
        self.registry.tensor_pools.pop(peer, None)
        return True

    # -- instances' BLS sockets -------------------------------------------------------------

    def note_bls_call(self, peer: bytes, rid: int) -> None:
        if peer not in self._first_bls_rid:
            self._first_bls_rid[peer] = rid

    def bls_boundary(self, peer: bytes, next_rid: int) -> int:
        """The first rid this process heard on a BLS socket that asks (its question's own
        ``next_rid`` when no call came before it): the socket's calls below it went to a previous
        broker process. Kept until the instance leaves: the socket may ask again (an answer to a
        question meant for a process that died meanwhile is ignored)."""
        return self._first_bls_rid.setdefault(peer, next_rid)

    # -- host agents ----------------------------------------------------------------------

    def add_agent(self, agent: AgentRecord) -> None:
        self.registry.agents[agent.identity] = agent

    def remove_agent(self, peer: bytes) -> AgentRecord:
        """The agent leaves with its host's metrics; its instances are removed by ``remove_instances_of``."""
        agent = self.registry.agents.pop(peer)
        self.registry.host_metrics.pop(agent.host, None)
        return agent

    def instances_of(self, peer: bytes) -> list[InstanceRecord]:
        return [i for i in self.registry.instances.values() if i.agent == peer]

    def drain_agent(self, agent: AgentRecord) -> None:
        """The host is stopping: it and its instances get no new work."""
        agent.draining = True
        for instance in self.registry.instances.values():
            if instance.agent == agent.identity:
                instance.draining = True

    def record_host_metrics(self, host: str, metrics: HostMetrics) -> None:
        self.registry.host_metrics[host] = metrics

    def record_working(self, agent: AgentRecord, iids: list[str], now: float) -> None:
        """A host agent's heartbeat: which of its instances' processes run."""
        agent.working = frozenset(iid.encode() for iid in iids)
        agent.working_at = now

    def record_custom_metrics(self, iid: bytes, families: list) -> None:
        """An instance's custom metrics, as its heartbeat reports them."""
        if iid in self.registry.instances:
            self.registry.custom_metrics.report(iid, families)

    def record_tensor_pools(self, peer: bytes, pools: list) -> None:
        """A gateway's or an instance's shared tensor pools, as its heartbeat reports them."""
        if peer in self.gateways or peer in self.registry.instances:
            self.registry.tensor_pools[peer] = pools

    # -- instances ------------------------------------------------------------------------

    def add_instance(self, instance: InstanceRecord, version: ModelVersion) -> None:
        self.registry.instances[instance.iid] = instance
        version.instances.append(instance)
        version.passive_instances += instance.passive
        if not instance.passive and len(version.instances) - version.passive_instances == 1:
            self.changed()   # ready again: gateways must hear of it

    def remove_instance(self, iid: bytes, why: str, restart_expected: bool = True) -> None:
        """An instance is gone; nothing it held is left silent (the scheduler retries or answers it)."""
        instance = self.registry.instances.pop(iid, None)
        self._forget_reports(iid)
        if instance is None:
            return
        version = self.registry.epochs.get(instance.epoch)
        if version is not None and instance in version.instances:
            version.instances.remove(instance)
            version.passive_instances -= instance.passive
            if not instance.passive and not version.serving:
                self.changed()   # its readiness changed: gateways must hear of it
        self.scheduler.instance_gone(instance, version, why, restart_expected)

    def _forget_reports(self, iid: bytes) -> None:
        """What a gone instance reported: its tensor pools, its BLS socket's first rid, its custom metrics."""
        self.registry.tensor_pools.pop(iid, None)
        self._first_bls_rid.pop(iid + BLS_SUFFIX, None)
        forked = iid + BLS_SUFFIX + b"/"   # the BLS sockets of processes its model forked
        for peer in [peer for peer in self._first_bls_rid if peer.startswith(forked)]:
            del self._first_bls_rid[peer]
        self.registry.custom_metrics.forget(iid)

    def remove_instances_of(self, peer: bytes, why: str) -> None:
        """A host is lost: so are its instances, and nothing restarts them."""
        for instance in self.instances_of(peer):
            self.remove_instance(instance.iid, why, restart_expected=False)
            self.liveness.forget(instance.iid)

    def remove_stopped(self, version: ModelVersion) -> None:
        """A drained version's instances were told to stop; none of them holds work."""
        for instance in version.instances:
            self.registry.instances.pop(instance.iid, None)
            self._forget_reports(instance.iid)
        self.scheduler.instances_stopped(version.instances)
        version.instances.clear()
        version.passive_instances = 0

    def set_health(self, instance: InstanceRecord, healthy: bool) -> None:
        instance.healthy = healthy
        self.changed()   # gateways answer readiness from the table
