"""What the broker does with what its peers say about themselves: gateways' and host agents'
HELLO, instances joining, heartbeating, failing, exiting and reporting health, a host draining,
and a peer gone silent. State changes go through ``Membership``; this module decides them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tritium.broker.adoption import Adoption
from tritium.broker.autoscale import Autoscaler
from tritium.broker.lifecycle import ModelLifecycle
from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.registry import AgentRecord, InstanceRecord, ModelVersion, Registry, VersionState
from tritium.broker.scheduler import Scheduler
from tritium.broker.startup_hold import StartupHold
from tritium.errors import InvalidArgument, ProtocolError
from tritium.exit_codes import ExitCode
from tritium.protocol import (
    HEARTBEAT_SUFFIX,
    Assign,
    Drained,
    Heartbeat,
    Hello,
    HostMetrics,
    InstanceExited,
    InstanceFailed,
    InstanceHealth,
    Placed,
    Refused,
    Reset,
    Role,
    ScaledAssignment,
)

log = logging.getLogger(__name__)

KEEP_COMPUTING_S = 600.0   # how long a silent instance running a batch is kept (its process running)

Send = Callable[[list], None]


class Peers:
    def __init__(self, registry: Registry, membership: Membership, lifecycle: ModelLifecycle,
                 autoscaler: Autoscaler, scheduler: Scheduler, liveness: PeerLiveness, adoption: Adoption,
                 send_frontend: Send, send_backend: Send, log_settings_message: Callable[[], bytes],
                 boot: int, heartbeat_interval_s: float, hold: StartupHold) -> None:
        self.registry = registry
        self.membership = membership
        self.lifecycle = lifecycle
        self.autoscaler = autoscaler
        self.scheduler = scheduler
        self.liveness = liveness
        self.adoption = adoption   # instances a previous broker process placed, which this one keeps
        self._send_frontend = send_frontend
        self._send_backend = send_backend
        self._log_settings_message = log_settings_message
        self.boot = boot
        self._heartbeat_interval_s = heartbeat_interval_s
        self.hold = hold   # a returning gateway's table waits while this process takes over
        self._reset_sent: dict[bytes, float] = {}   # unknown agents asked to register, and when
        self._kept_silent: dict[bytes, float] = {}   # instances kept silent while computing: since when

    # -- joining ------------------------------------------------------------------------

    def gateway_hello(self, peer: bytes, hello: Hello | Heartbeat, since: int | None = None,
                      draining: bool = False) -> None:
        """A gateway registers: by HELLO when it starts, by heartbeating when it was a previous
        broker process's (``since``: the first rid this process heard from it). ``draining``: this
        process drains, and the gateway is to hold its new requests from now on."""
        self.liveness.beats_every(peer, hello.heartbeat_s or 0.0)
        self.membership.add_gateway(peer)
        log.info("gateway %s connected", peer.decode(errors="replace"))
        self._send_frontend([peer, Heartbeat(self.boot, self._heartbeat_interval_s, since=since,
                                             draining=draining).encode()])
        if not (type(hello) is Heartbeat and self.hold.defer(peer)):
            self._send_frontend([peer, self.registry.table().encode()])
        self._send_frontend([peer, self._log_settings_message()])

    def backend_hello(self, peer: bytes, hello: Hello) -> None:
        self.liveness.beats_every(peer, hello.heartbeat_s or 0.0)
        if hello.role is Role.AGENT:
            agent = AgentRecord(peer, hello.host or "?", tuple(hello.gpus or ()), hello.models or None,
                                cpu_slots=hello.cpu_slots or 0)
            self.membership.add_agent(agent)
            self._reset_sent.pop(peer, None)
            self.adoption.announce(peer, hello.running)
            self.hold.host_registered(kept_instances=bool(hello.running))
            log.info("host agent %s joined (host %s, gpus %s)", peer.decode(), agent.host, list(agent.gpus))
            self._send_backend([peer, Heartbeat(self.boot, self._heartbeat_interval_s).encode()])
            self._send_backend([peer, self._log_settings_message()])
            self._assign_on_join(agent)
        elif hello.role is Role.INSTANCE:
            self._instance_hello(peer, hello)
        else:
            raise ProtocolError(f"a {hello.role.value} says HELLO on the backend")

    def _instance_hello(self, peer: bytes, hello: Hello) -> None:
        if peer in self.registry.instances:
            return   # an adopted instance told the new epoch twice (its RESET was sent again) says HELLO twice
        if hello.agent is None or hello.model is None or hello.version is None or hello.name is None:
            raise ProtocolError("an instance's HELLO names its agent, model, version and key")
        version = self._epoch_of(hello.epoch, hello.boot)
        # A draining version takes back a restarted instance: its queue still needs one.
        if version is None or version.state not in (VersionState.LOADING, VersionState.READY,
                                                     VersionState.UNLOADING):
            log.warning("instance %s of %s version %s (load %s) is not wanted; ignoring it",
                        hello.name, hello.model, hello.version, hello.epoch)
            return
        agent = self.registry.agents.get(hello.agent.encode())
        if agent is None:   # its host must register first; it will start it again
            self._send_backend([peer, Reset().encode()])
            return
        version.awaited.pop(hello.name, None)
        self.adoption.forget(peer)
        passive = bool(hello.passive)
        instance = InstanceRecord(peer, hello.agent.encode(), hello.model, hello.version, hello.name,
                                  hello.credit or 1, epoch=version.epoch,
                                  draining=passive or agent is None or agent.draining
                                  or self.lifecycle.instance_updates.holds(version, hello.agent.encode(), hello.name),
                                  kind=hello.instance_kind or "CPU",
                                  device=hello.device or 0, group=hello.group or 0, passive=passive)
        if not passive and not self._rate_limited(instance, version):
            return
        self.membership.add_instance(instance, version)
        for requests, *timings in hello.warmed or ():   # its warmup counts in the statistics, as in Triton
            version.stats.record_execution(requests, tuple(timings))
            version.stats.record_successes(requests, requests * sum(timings), 0, requests, tuple(timings))
        log.info("instance %s of model %s version %d is ready%s", instance.name, version.name, version.version,
                 " (passive: it gets no requests)" if passive else "")
        self.lifecycle.instance_joined(version, instance.name, instance.agent)
        if passive:
            return
        self.autoscaler.instance_joined(version)
        self.scheduler.instance_ready(instance)

    def _rate_limited(self, instance: InstanceRecord, version: ModelVersion) -> bool:
        """Whether the rate limiter (when on) takes the instance. When it cannot, the instance
        failed to be created, as in Triton: a loading version fails with the reason; otherwise
        (an instance restarted or added later, on a device the flags give less) the instance is
        refused, and exits without being restarted."""
        limiter = self.scheduler.rate_limiter
        if limiter is None:
            return True
        try:
            limiter.register_from_config(instance, version.definition.config)
        except InvalidArgument as exc:
            message = f"Invalid argument: {exc.message}"
            log.error("instance %s of model %s version %d: %s", instance.name, version.name, version.version, message)
            if version.state == VersionState.LOADING:
                self.lifecycle.version_failed(version, message)
            else:
                self._send_backend([instance.iid, Refused(message).encode()])
                self.autoscaler.instance_failed(version, instance.agent, message)
                self.lifecycle.instance_updates.failed(version, instance.agent, instance.name, message)
            return False
        return True

    def _assign_on_join(self, agent: AgentRecord) -> None:
        """Every load this host should run; the instances it still runs are offered to their loads."""
        models, scaled = [], []
        for version in self.lifecycle.loads_for(agent):
            assignment = self.adoption.offer(version.assignment(), version, agent.identity)
            if version.autoscale is None:
                models.append(assignment)
                continue
            running = len(self.adoption.candidates(version, agent.identity))
            count = self.autoscaler.adopt(version, agent.identity, running) if running else 0
            if count:
                scaled.append(ScaledAssignment(assignment, count))
        # "complete": after this, the agent stops whatever it runs that was not kept.
        self._send_backend([agent.identity, Assign(tuple(models), tuple(scaled), complete=True).encode()])

    def placed(self, peer: bytes, placed: Placed) -> None:
        if placed.boot == self.boot:   # not a late answer to a previous broker process
            self.lifecycle.placed(placed, peer)
            self._tell_adopted(placed)

    def _tell_adopted(self, placed: Placed) -> None:
        """The agent kept these running instances for a load: they say HELLO again, as its instances."""
        version = self.registry.epochs.get(placed.epoch)
        if version is None or not placed.adopted:
            return
        for iid in self.adoption.placed(version, placed.adopted):
            log.info("adopting running instance %s of model %s version %d", iid.decode(errors="replace"),
                     version.name, version.version)
            reset = self.adoption.rejoin(iid, self.boot)
            assert reset is not None   # placed() just took it for adoption
            self._send_backend([iid, reset.encode()])

    # -- living ---------------------------------------------------------------------------

    def heartbeat(self, peer: bytes, beat: Heartbeat, now: float) -> None:
        if beat.iid is not None:  # an instance's heartbeat thread, beating for its data socket
            iid = beat.iid.encode()
            if iid in self.registry.instances:
                self.liveness.heard(iid, now)
                if iid in self._kept_silent:
                    del self._kept_silent[iid]
                    log.info("instance %s answers heartbeats again", self.registry.instances[iid].name)
                self.liveness.beats_every(iid, beat.heartbeat_s or 0.0)
                if beat.pools is not None:
                    self.membership.record_tensor_pools(iid, beat.pools)
                if beat.custom_metrics is not None:
                    self.membership.record_custom_metrics(iid, beat.custom_metrics)
                self.registry.custom_metrics.heard(iid, beat.metrics_for)
            elif beat.joined:
                self._unknown_instance(iid, beat)
        elif beat.role is Role.AGENT and peer in self.registry.agents:
            if beat.working is not None:
                self.membership.record_working(self.registry.agents[peer], beat.working, now)
        elif beat.role is Role.AGENT:
            # Heartbeats queued while the broker was away arrive together: ask once per interval.
            if now - self._reset_sent.get(peer, 0.0) >= self._heartbeat_interval_s:
                self._reset_sent[peer] = now
                log.info("unknown host agent %s heartbeating; asking it to register", peer.decode(errors="replace"))
                self._send_backend([peer, Reset(boot=self.boot).encode()])

    def _unknown_instance(self, iid: bytes, beat: Heartbeat) -> None:
        """An instance this broker does not know (yet): adopted, about to be, or to exit and be restarted."""
        rejoin = self.adoption.rejoin(iid, self.boot)
        if rejoin is None:
            agent = (beat.agent or iid.decode(errors="replace").split("/", 1)[0]).encode()
            if agent not in self.registry.agents or self.adoption.pending(iid):
                return   # its agent has yet to register and list it, or adoption is being decided
        # Said again while it does not answer (the RESET sent on its adoption may not have reached
        # it), and to its heartbeat thread too: its main thread may wait in a model's execute on a
        # BLS call the previous broker process held, which that thread then answers with an error.
        reset = (rejoin or Reset()).encode()
        self._send_backend([iid, reset])
        self._send_backend([iid + HEARTBEAT_SUFFIX, reset])

    def host_metrics(self, metrics: HostMetrics) -> None:
        self.membership.record_host_metrics(metrics.host, metrics)

    def instance_health(self, peer: bytes, health: InstanceHealth) -> None:
        instance = self.registry.instances.get(peer)
        if instance is None or instance.healthy == health.ready:
            return
        self.membership.set_health(instance, health.ready)
        log.info("instance %s of model %s version %d reports %s", instance.name, instance.model, instance.version,
                 "ready" if instance.healthy else "not ready (its model's is_ready() did not answer True in time)")

    # -- leaving --------------------------------------------------------------------------

    def drain(self, peer: bytes) -> None:
        agent = self.registry.agents.get(peer)
        if agent is None:   # nothing of this broker runs there
            self._send_backend([peer, Drained().encode()])
            return
        self.membership.drain_agent(agent)   # first: a load that fails now is not retried on this host
        self.lifecycle.host_gone(peer, f"host {agent.host} began draining while the model was loading")
        self.autoscaler.agent_draining(peer)
        log.info("host agent %s (host %s) is draining: its instances get no new batches", peer.decode(),
                 agent.host)
        self.check_agent_drained(agent)

    def check_draining_agents(self) -> None:
        for agent in [a for a in self.registry.agents.values() if a.draining]:
            self.check_agent_drained(agent)

    def check_agent_drained(self, agent: AgentRecord) -> None:
        if not self.scheduler.holds_work(self.membership.instances_of(agent.identity)):
            self._send_backend([agent.identity, Drained().encode()])

    def drop_silent(self, peer: bytes, now: float) -> None:
        why = f"stopped answering heartbeats for {self.liveness.limit_for(peer):.0f} s"
        if peer in self.registry.instances and self._still_working(self.registry.instances[peer], now):
            self.liveness.heard(peer, now)   # asked again after another limit
            return
        self.liveness.forget(peer)
        self._kept_silent.pop(peer, None)
        if peer in self.registry.agents:
            self._drop_agent(peer, why)
        elif peer in self.registry.instances:
            instance = self.registry.instances[peer]
            log.error("instance %s of model %s version %d %s; dropping it", instance.name, instance.model,
                      instance.version, why)
            agent = self.registry.agents.get(instance.agent)
            self.membership.remove_instance(peer, why, restart_expected=agent is not None and not agent.draining)
            self._send_backend([peer, Reset().encode()])  # should it wake up: exit, be restarted
        elif peer in self.membership.gateways:
            log.warning("gateway %s %s; no longer pushing to it", peer.decode(errors="replace"), why)
            self.membership.remove_gateway(peer)

    def _still_working(self, instance: InstanceRecord, now: float) -> bool:
        """A silent instance that is running a batch, and whose process runs as its host agent's
        heartbeats say, is kept for up to ``KEEP_COMPUTING_S``, as Triton keeps a stub that computes
        (a model holding the GIL starves its heartbeats). One without work, one that exited, was
        stopped or went with its host, or one silent for longer, is not."""
        agent = self.registry.agents.get(instance.agent)
        if agent is None or not instance.inflight or instance.iid not in agent.working \
                or now - agent.working_at > self.liveness.limit_for(instance.agent):
            return False
        since = self._kept_silent.get(instance.iid)
        if since is None:
            self._kept_silent = {iid: at for iid, at in self._kept_silent.items() if iid in self.registry.instances}
            self._kept_silent[instance.iid] = since = now - self.liveness.limit_for(instance.iid)
            log.warning("instance %s of model %s version %d has not answered heartbeats for %.0f s while running a "
                        "batch, but its process runs (its host agent says so): kept. A model's execute holding "
                        "Python's GIL in a long call starves its heartbeats", instance.name, instance.model,
                        instance.version, now - since)
        return now - since < KEEP_COMPUTING_S

    def _drop_agent(self, peer: bytes, why: str) -> None:
        agent = self.membership.remove_agent(peer)
        self.autoscaler.agent_left(peer)
        self.lifecycle.host_gone(peer, f"host {agent.host} {why} while the model was loading")
        log.error("host agent %s (host %s) %s; dropping it and its %d instance(s)", peer.decode(errors="replace"),
                  agent.host, why, len(self.membership.instances_of(peer)))
        self.membership.remove_instances_of(peer, f"was lost with its host {agent.host}")
        self.adoption.forget_agent(peer)

    def _epoch_of(self, epoch: int | None, boot: int | None) -> ModelVersion | None:
        """The load an instance message is about; none when a previous broker process placed it."""
        if epoch is None or boot != self.boot:
            return None
        return self.registry.epochs.get(epoch)

    def instance_failed(self, failed: InstanceFailed) -> None:
        version = self._epoch_of(failed.epoch, failed.boot)
        message = failed.error.message
        log.error("instance %s of model %s version %s failed: %s", failed.name, failed.model, failed.version, message)
        if version is not None and version.state == VersionState.LOADING:
            self.lifecycle.version_failed(version, message)
        elif version is not None and version.autoscale is not None:
            self.autoscaler.instance_failed(version, failed.agent.encode(), message)
        elif version is not None:
            self.lifecycle.instance_updates.failed(version, failed.agent.encode(), failed.name, message)

    def instance_exited(self, peer: bytes, exited: InstanceExited) -> None:
        """``peer``: the agent that reports it."""
        iid = exited.iid.encode()
        why = exited.why
        instance = self.registry.instances.get(iid)
        agent = self.registry.agents.get(instance.agent) if instance else None
        self.membership.remove_instance(iid, why, restart_expected=agent is not None and not agent.draining)
        self.liveness.forget(iid)
        self._kept_silent.pop(iid, None)
        self.adoption.forget(iid)
        version = self._epoch_of(exited.epoch, exited.boot)
        name = exited.name
        # An instance stopped on purpose, or one that ended for good after it reported its own init
        # failure, fails no load and is not coming back (one the broker refused fails its load).
        expected = exited.stopped or (exited.final and exited.code == ExitCode.INIT_FAILED)
        if version is not None and expected:
            version.awaited.pop(name, None)
        if version is not None:
            self.lifecycle.instance_updates.exited(version, peer, name, why, expected)
        if version is not None and version.state == VersionState.LOADING and name not in version.seen_ready \
                and not expected:
            # It died before it was ready (a crash, not a reported init failure): the load fails,
            # rather than waiting on restarts that may never succeed.
            self.lifecycle.version_failed(version, f"instance {name} {why} before it was ready")
