"""The broker process: two ROUTER sockets, one poll loop, and the control plane.

``frontend`` faces gateways (INFER, CONTROL, HELLO); ``backend`` faces host agents and
instance processes (HELLO, PLACED, BATCH_DONE, ...). The loop drains every ready
message on each wake-up, and sleeps no longer than the earliest batching deadline.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import zmq

from tritium.broker.adoption import Adoption
from tritium.broker.autoscale import Autoscaler
from tritium.broker.lifecycle import ControlSettings, ModelLifecycle
from tritium.broker.liveness import PeerLiveness
from tritium.broker.response_cache import ResponseCache
from tritium.broker.metrics import (
    DEFAULT_HISTOGRAM_BUCKETS_MS,
    MetricsSettings,
    TritonCollector,
    start_metrics_server,
)
from tritium.broker.registry import (
    AgentRecord,
    InstanceRecord,
    ModelVersion,
    Registry,
    VersionState,
)
from tritium.broker.scheduler import Scheduler
from tritium.repo import ModelRepository, RepositoryOptions
from tritium import logs, notify
from tritium.logs import LogSettings
from tritium.errors import AlreadyExists, InternalError, InvalidArgument, ProtocolError, TritiumError, Unavailable
from tritium.gctune import tune_for_serving
from tritium.exit_codes import ExitCode
from tritium.ports import PortInUse
from tritium.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    PROTOCOL_VERSION,
    Kind,
    decode,
    encode,
)
from tritium.security import CurveKeys, secure_server
from tritium.signals import SignalWaker
from tritium.zmqio import recv_parts, send_parts

log = logging.getLogger(__name__)

# Each socket is drained of at most this many messages per turn, so that neither side starves.
_DRAIN_LIMIT = 512
_NOBLOCK = int(zmq.NOBLOCK)
_HWM = 100_000


@dataclass(frozen=True)
class BrokerSettings:
    model_repositories: tuple[str, ...]
    frontend: str
    backend: str
    repository: RepositoryOptions = RepositoryOptions()
    metrics: MetricsSettings | None = MetricsSettings()   # None: no metrics endpoint
    control: ControlSettings = ControlSettings()
    log_verbose: int = 0
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    exit_timeout_s: float = 30.0     # SIGTERM: how long queued and running requests may take to finish
    cache_bytes: int = 0             # --cache-config local,size=N; 0: no response cache
    curve: CurveKeys | None = None   # None: no CURVE (the ipc:// default of tritium serve)


class Broker:
    def __init__(self, settings: BrokerSettings, context: zmq.Context | None = None) -> None:
        self.settings = settings
        self.context = context or zmq.Context.instance()
        self.registry = Registry()
        self.frontend = self._bind(zmq.ROUTER, settings.frontend)
        self.backend = self._bind(zmq.ROUTER, settings.backend)
        cache = ResponseCache(settings.cache_bytes) if settings.cache_bytes else None
        self.scheduler = Scheduler(self.registry, self._send_backend, self._send_frontend, cache=cache)
        self.gateways: set[bytes] = set()
        self._to_gateways: dict[bytes, list] = {}   # this turn's messages, per gateway
        self._unreachable: set[bytes] = set()       # peers already warned about (see _peer_gone)
        self._pushed_generation = -1
        self._running = True
        # Told to peers in every heartbeat: a new value means the broker restarted and lost
        # whatever they had sent it.
        self.boot = int.from_bytes(os.urandom(6), "little")
        self.liveness = PeerLiveness(settings.heartbeat_interval_s)
        self._now = time.monotonic()
        self._next_heartbeat = 0.0
        self._reset_sent: dict[bytes, float] = {}   # unknown agents asked to register, and when
        self.adoption = Adoption()   # instances a previous broker process placed, which this one keeps
        self._stop_deadline: float | None = None   # set by the first SIGTERM: draining until then
        self.exit_code = ExitCode.OK
        self.repository = ModelRepository(settings.model_repositories, settings.repository)
        self.log_settings = LogSettings(log_verbose_level=settings.log_verbose)
        self.autoscaler = Autoscaler(self.registry, self._send_backend, self.scheduler, time.monotonic_ns)
        self.scheduler.autoscaler = self.autoscaler
        self.lifecycle = ModelLifecycle(self.registry, self.repository, self.scheduler, self._send_backend,
                                        settings.control, self._new_version, self.autoscaler)
        self._next_scaling = 0.0
        self._poller = zmq.Poller()
        for sock in (self.frontend, self.backend, self.lifecycle.wake_read):
            self._poller.register(sock, zmq.POLLIN)

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        secure_server(sock, self.settings.curve, address)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.RCVHWM, _HWM)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises instead of dropping silently
        sock.bind(address)
        return sock

    # -- sending ------------------------------------------------------------------------

    def _send_frontend(self, parts: list) -> None:
        """Queued per gateway until the end of the loop's turn: one message per gateway per turn,
        however many batches answered its requests (each message costs every process a wake-up)."""
        queued = self._to_gateways.get(parts[0])
        if queued is None:
            self._to_gateways[parts[0]] = list(parts)
        else:
            queued.extend(parts[1:])

    def _flush_frontend(self) -> None:
        if self._to_gateways:
            outgoing, self._to_gateways = self._to_gateways, {}
            for parts in outgoing.values():
                self._send(self.frontend, parts)

    def _send_backend(self, parts: list) -> None:
        self._send(self.backend, parts)

    def _send(self, sock: zmq.Socket, parts: list) -> None:
        """Never blocks the loop: a peer that stopped reading (paused, wedged) loses what does
        not fit in its queue, rather than every other peer losing the broker."""
        try:
            send_parts(sock, parts, _NOBLOCK)
        except zmq.Again:
            log.warning("peer %r is not reading (its queue is full); dropped a message to it", parts[0])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer's connection is gone
            self._peer_gone(parts, exc)

    def _peer_gone(self, parts: list, exc: zmq.ZMQError) -> None:
        """A peer that left stops getting heartbeats and model tables. Only lost answers are
        worth a warning (once per peer): a gateway that drained and stopped, as every clean
        shutdown's gateways do before the broker stops, lost nothing."""
        peer = parts[0]
        if peer in self.gateways:
            self.gateways.discard(peer)
            self.liveness.forget(peer)
            log.info("gateway %s disconnected", peer.decode(errors="replace"))
        if peer in self._unreachable or _only_notices(parts):
            return
        self._unreachable.add(peer)
        log.warning("cannot send to peer %r: %s; what it was sent is lost", peer, exc)

    # -- model loading ------------------------------------------------------------------

    def load_repository(self) -> None:
        """Load what the model control mode loads at startup."""
        self.lifecycle.start()

    def _new_version(self, version: ModelVersion) -> None:
        if self.settings.metrics is not None and self.settings.metrics.histogram_latencies:
            version.stats.enable_histogram(_histogram_buckets(version.definition.config))

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped by a signal; the process's exit code."""
        waker = SignalWaker(self._stop)
        self._poller.register(waker.fd, zmq.POLLIN)
        if self.settings.metrics is not None:
            try:
                self.metrics_server = start_metrics_server(TritonCollector(self.registry, self.settings.metrics),
                                                           self.settings.metrics)
            except OSError as exc:   # a taken port: Triton's one line, not a traceback
                metrics = self.settings.metrics
                log.error("%s", PortInUse.from_error("Metrics", metrics.address, metrics.port, exc))
                return ExitCode.ERROR
        tune_for_serving()
        notify.ready(f"broker frontend={self.settings.frontend} backend={self.settings.backend}")
        log.info("broker ready: frontend %s, backend %s", self.settings.frontend, self.settings.backend)
        watchdog = notify.Watchdog.from_environment()
        while self._running:
            watchdog.tick()
            if waker.fd in self.turn():
                waker.clear()
        return self.close()

    def turn(self, timeout_ms: int | None = None) -> dict:
        """One turn of the loop: wait for a message or a deadline, handle what is ready, send.

        ``timeout_ms`` caps the wait (tests drive the broker turn by turn); returns the
        poll's events.
        """
        wait_ms = self._timeout_ms() if timeout_ms is None else min(timeout_ms, self._timeout_ms())
        events = dict(self._poller.poll(wait_ms))
        self._now = time.monotonic()
        if self.backend in events:
            self._drain(self.backend, self._on_backend)
        if self.frontend in events:
            self._drain(self.frontend, self._on_frontend)
        if self.lifecycle.wake_read.fileno() in events:
            self.lifecycle.run_completed()
        self.scheduler.run_due()
        if self.lifecycle.draining:
            self.lifecycle.check_drained()
        if self.lifecycle.poll_due():
            self.lifecycle.poll()
        if self.registry.generation != self._pushed_generation:
            self._push_models()
        if self._now >= self._next_heartbeat:
            self._heartbeat()
        if self._now >= self._next_scaling:
            self._next_scaling = self._now + 0.25
            self.autoscaler.evaluate()
        if self._stop_deadline is not None:
            self._check_stopped()
        self._flush_frontend()
        return events

    def close(self) -> int:
        """Answer whatever is still held, let the answers leave, close; the exit code."""
        log.info("broker stopping")
        self.scheduler.fail_everything(Unavailable("the server is shutting down"))
        self._flush_frontend()
        self.lifecycle.close()
        # Linger: the last answers (results and errors) must leave before the sockets go.
        self.frontend.close(linger=2000)
        self.backend.close(linger=2000)
        return self.exit_code

    def _stop(self, signum, _frame) -> None:
        """First signal: finish what was accepted (new requests are refused); second: exit now."""
        if self._stop_deadline is not None:
            log.warning("second stop signal: exiting without waiting for requests in flight")
            self._running = False
            self.exit_code = ExitCode.FORCED
            return
        self._stop_deadline = time.monotonic() + self.settings.exit_timeout_s
        notify.stopping()

    def _check_stopped(self) -> None:
        if self.scheduler.idle():
            self._running = False
        elif self._now >= self._stop_deadline:
            log.warning("requests still in flight after %.0f s; answering them with errors",
                        self.settings.exit_timeout_s)
            self._running = False

    # -- liveness -----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """Tell gateways and agents the broker lives; drop the peers that went silent."""
        self._next_heartbeat = self._now + self.settings.heartbeat_interval_s
        beat = encode({"k": Kind.HEARTBEAT, "boot": self.boot, "hb": self.settings.heartbeat_interval_s})
        for gateway in list(self.gateways):
            self._send_frontend([gateway, beat])
        for agent in list(self.registry.agents):
            self._send_backend([agent, beat])
        for peer in self.liveness.silent(self._now):
            self._drop_silent(peer)
        self.scheduler.fail_unserviceable()
        for agent in [a for a in self.registry.agents.values() if a.draining]:
            self._check_agent_drained(agent)

    def _drop_silent(self, peer: bytes) -> None:
        why = f"stopped answering heartbeats for {self.liveness.limit_for(peer):.0f} s"
        self.liveness.forget(peer)
        if peer in self.registry.agents:
            self._drop_agent(peer, why)
        elif peer in self.registry.instances:
            instance = self.registry.instances[peer]
            log.error("instance %s of model %s version %d %s; dropping it", instance.name, instance.model,
                      instance.version, why)
            agent = self.registry.agents.get(instance.agent)
            self.scheduler.instance_lost(peer, why, restart_expected=agent is not None and not agent.draining)
            self._send_backend([peer, encode({"k": Kind.RESET})])  # should it wake up: exit, be restarted
        elif peer in self.gateways:
            log.warning("gateway %s %s; no longer pushing to it", peer.decode(errors="replace"), why)
            self.gateways.discard(peer)

    def _drop_agent(self, peer: bytes, why: str) -> None:
        agent = self.registry.agents.pop(peer)
        self.autoscaler.agent_left(peer)
        self.registry.host_metrics.pop(agent.host, None)
        self.lifecycle.host_gone(peer, f"host {agent.host} {why} while the model was loading")
        lost = [i.iid for i in self.registry.instances.values() if i.agent == peer]
        log.error("host agent %s (host %s) %s; dropping it and its %d instance(s)", peer.decode(errors="replace"),
                  agent.host, why, len(lost))
        for iid in lost:
            self.scheduler.instance_lost(iid, f"was lost with its host {agent.host}", restart_expected=False)
            self.liveness.forget(iid)
        self.adoption.forget_agent(peer)

    def _timeout_ms(self) -> int:
        """Until the earliest batching deadline, and never past the next heartbeat."""
        longest = max(1, int((self._next_heartbeat - time.monotonic()) * 1000) + 1)
        deadline = self.scheduler.next_deadline_ns()
        if deadline is None:
            return longest
        return max(0, min(longest, -(-(deadline - time.monotonic_ns()) // 1_000_000)))

    def _drain(self, sock: zmq.Socket, handle) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                parts = recv_parts(sock)
            except zmq.Again:
                return
            peer = parts[0].bytes
            self.liveness.heard(peer, self._now)
            position = 1
            while position < len(parts):
                try:
                    header, _, _ = decode(parts[position])
                    external_count = header.get("x", 0)
                    if not isinstance(external_count, int):
                        external_count = 0  # a list: BATCH_DONE counts per response
                    handle(peer, parts, position, header)
                except ProtocolError as exc:
                    log.warning("dropped a malformed message from %r: %s", peer, exc)
                    break
                except Exception:   # one record's failure must not cost the records after it
                    log.exception("error handling a message from %r", peer)
                if header["k"] in (Kind.BATCH_DONE, Kind.RESPONSE_PART):
                    break  # the records after it are its responses
                position += 1 + external_count

    # -- frontend: gateways and control clients -----------------------------------------

    def _on_frontend(self, peer: bytes, parts: list, position: int, header: dict) -> None:
        kind = header["k"]
        if kind == Kind.INFER:
            if self._stop_deadline is not None:
                self.scheduler.reply_error(peer, header.get("rid", 0), Unavailable("the server is shutting down"))
                return
            external = parts[position + 1:position + 1 + header["x"]] if "x" in header else None
            try:
                self.scheduler.submit(peer, parts[position], header, external)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                self.scheduler.reply_error(peer, header.get("rid", 0),
                                           InvalidArgument(f"malformed inference request: {exc!r}"))
        elif kind == Kind.CONTROL:
            self._on_control(peer, header)
        elif kind == Kind.HELLO or (kind == Kind.HEARTBEAT and peer not in self.gateways and "pv" in header):
            # A gateway of a previous broker process says hello again by heartbeating.
            self._on_gateway_hello(peer, header)
        elif kind != Kind.HEARTBEAT:
            raise ProtocolError(f"unexpected {Kind(kind).name} on the frontend")

    def _on_gateway_hello(self, peer: bytes, header: dict) -> None:
        if not self._protocol_ok(self.frontend, peer, header):
            return
        self.liveness.beats_every(peer, header.get("hb", 0.0))
        self.gateways.add(peer)
        self._unreachable.discard(peer)
        log.info("gateway %s connected", peer.decode(errors="replace"))
        self._send_frontend([peer, encode({"k": Kind.HEARTBEAT, "boot": self.boot,
                                           "hb": self.settings.heartbeat_interval_s})])
        self._send_frontend([peer, encode({"k": Kind.MODELS, **self.registry.table()})])
        self._send_frontend([peer, self._log_settings_message()])

    def _push_models(self) -> None:
        self._pushed_generation = self.registry.generation
        message = encode({"k": Kind.MODELS, **self.registry.table()})
        for gateway in list(self.gateways):
            self._send_frontend([gateway, message])

    def _on_control(self, peer: bytes, header: dict) -> None:
        rid = header.get("rid", 0)

        def reply(result) -> None:
            if self.registry.generation != self._pushed_generation:
                self._push_models()  # a client told "loaded" must find the model at once
            if isinstance(result, TritiumError):
                message = {"k": Kind.CONTROL_REPLY, "rid": rid, "err": result.to_wire()}
            else:
                message = {"k": Kind.CONTROL_REPLY, "rid": rid, "ok": result}
            self._send_frontend([peer, encode(message)])

        op, args = header.get("op"), header.get("args") or {}
        try:
            if op == "load":  # answered when the load is done, which may take a while
                self.lifecycle.load(_model_name(args), args.get("parameters") or {}, reply)
            else:
                reply(self._control(op, args))
        except TritiumError as exc:
            reply(exc)
        except Exception as exc:   # an unexpected failure still answers the asker
            log.exception("control operation %r failed", op)
            reply(InternalError(f"control operation '{op}' failed: {exc}"))

    def _control(self, op: str, args: dict):
        if op == "models":
            return self.registry.table()
        if op == "stats":
            return self._stats(args.get("model"), args.get("version"))
        if op == "status":
            return {"loading_done": self.registry.loading_done(), "ready": self.registry.server_ready(),
                    "failures": self._failures(), "repository_errors": list(self.lifecycle.repository_errors)}
        if op == "index":
            return self.lifecycle.index(bool(args.get("ready")))
        if op == "unload":
            self.lifecycle.unload(_model_name(args), bool(args.get("unload_dependents")))
            return {}
        if op == "log_settings":
            return self._change_log_settings(args.get("changes") or {})
        if op == "shm_register":
            return self._register_region(args)
        if op == "shm_unregister":
            self._unregister_region(args.get("name"))
            return {}
        raise InvalidArgument(f"unknown control operation '{op}'")

    def _change_log_settings(self, changes: dict) -> dict:
        """Triton's logging extension: the new settings reach every process."""
        settings = self.log_settings.updated(changes)
        if settings != self.log_settings:
            self.log_settings = settings
            logs.apply(settings)
            log.info("log settings changed: %s", settings.as_dict())
            for gateway in self.gateways:
                self._send_frontend([gateway, self._log_settings_message()])
            for peer in [*self.registry.agents, *self.registry.instances]:
                self._send_backend([peer, self._log_settings_message()])
        return settings.as_dict()

    def _log_settings_message(self) -> bytes:
        return encode({"k": Kind.LOG_SETTINGS, "settings": self.log_settings.as_dict()})

    def _register_region(self, args: dict) -> dict:
        """Record a client's shared memory region (the gateway checked it maps)."""
        name = args.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument("a shared memory region needs a name")
        if name in self.registry.shared_memory:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        self.registry.shared_memory[name] = {"name": name, "key": str(args["key"]), "offset": int(args["offset"]),
                                             "byte_size": int(args["byte_size"])}
        self.registry.generation += 1
        return {}

    def _unregister_region(self, name: str | None) -> None:
        if name is None:
            self.registry.shared_memory.clear()
        else:
            self.registry.shared_memory.pop(name, None)  # unknown names succeed, as in Triton
        self.registry.generation += 1

    def _failures(self) -> list[str]:
        failures = []
        for record in self.registry.models.values():
            if record.error:
                failures.append(f"{record.name}: {record.error}")
            for number, error in record.version_errors.items():
                failures.append(f"{record.name} version {number}: {error}")
            for number, version in record.versions.items():
                if version.state == VersionState.UNAVAILABLE:
                    failures.append(f"{record.name} version {number}: {version.reason}")
        return failures

    def _stats(self, model: str | None, version: int | None) -> list[dict]:
        if model is None:
            return [v.stats.as_dict(v.name, v.version) for v in self.registry.versions.values()
                    if v.state == VersionState.READY]
        record = self.registry.models.get(model)
        ready = {n: v for n, v in (record.versions.items() if record else []) if v.state == VersionState.READY}
        if not ready:
            raise InvalidArgument(f"requested model '{model}' is not available")
        if version is not None:
            if version not in ready:
                raise InvalidArgument(f"requested model version is not available for model '{model}'")
            return [ready[version].stats.as_dict(model, version)]
        return [v.stats.as_dict(model, n) for n, v in sorted(ready.items())]

    # -- backend: host agents and instances --------------------------------------------

    def _on_backend(self, peer: bytes, parts: list, position: int, header: dict) -> None:
        kind = header["k"]
        if kind == Kind.BATCH_DONE:
            self.scheduler.batch_done(peer, header, parts[position + 1:])
        elif kind == Kind.RESPONSE_PART:
            self.scheduler.response_part(peer, header, parts[position + 1:])
        elif kind == Kind.INFER:  # a model calling another model (BLS)
            external = parts[position + 1:position + 1 + header["x"]] if "x" in header else None
            try:
                self.scheduler.submit(peer, parts[position], header, external, from_backend=True)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                self.scheduler.reply_error(peer, header.get("rid", 0),
                                           InvalidArgument(f"malformed inference request: {exc!r}"), True)
        elif kind == Kind.HELLO:
            self._on_backend_hello(peer, header)
        elif kind == Kind.PLACED:
            if header.get("boot") == self.boot:   # not a late answer to a previous broker process
                self.lifecycle.placed(header, peer)
                self._tell_adopted(header)
        elif kind == Kind.INSTANCE_FAILED:
            self._on_instance_failed(header)
        elif kind == Kind.INSTANCE_EXITED:
            self._on_instance_exited(header)
        elif kind == Kind.INSTANCE_HEALTH:
            self._on_instance_health(peer, header)
        elif kind == Kind.HOST_METRICS:
            self.registry.host_metrics[header.get("host", peer.decode(errors="replace"))] = header
        elif kind == Kind.HEARTBEAT:
            self._on_backend_heartbeat(peer, header)
        elif kind == Kind.DRAIN:
            self._on_drain(peer)
        else:
            raise ProtocolError(f"unexpected {Kind(kind).name} on the backend")

    def _on_backend_heartbeat(self, peer: bytes, header: dict) -> None:
        iid = header.get("iid")
        if iid is not None:  # an instance's heartbeat thread, beating for its data socket
            iid = iid.encode()
            if iid in self.registry.instances:
                self.liveness.heard(iid, self._now)
                self.liveness.beats_every(iid, header.get("hb", 0.0))
            elif header.get("joined"):
                self._on_unknown_instance(iid, header)
        elif header.get("role") == "agent" and peer not in self.registry.agents:
            # Heartbeats queued while the broker was away arrive together: ask once per interval.
            if self._now - self._reset_sent.get(peer, 0.0) >= self.settings.heartbeat_interval_s:
                self._reset_sent[peer] = self._now
                log.info("unknown host agent %s heartbeating; asking it to register", peer.decode(errors="replace"))
                self._send_backend([peer, encode({"k": Kind.RESET, "boot": self.boot})])

    def _on_unknown_instance(self, iid: bytes, header: dict) -> None:
        """An instance this broker does not know (yet): adopted, about to be, or to exit and be restarted."""
        rejoin = self.adoption.rejoin_header(iid, self.boot)
        if rejoin is not None:   # the RESET sent on its adoption may not have reached it
            self._send_backend([iid, encode({"k": Kind.RESET, **rejoin})])
            return
        agent = str(header.get("agent") or iid.decode(errors="replace").split("/", 1)[0]).encode()
        if agent not in self.registry.agents or self.adoption.pending(iid):
            return   # its agent has yet to register and list it, or adoption is being decided
        self._send_backend([iid, encode({"k": Kind.RESET})])

    def _tell_adopted(self, header: dict) -> None:
        """The agent kept these running instances for a load: they say HELLO again, as its instances."""
        version = self.registry.epochs.get(header.get("e"))
        if version is None or not header.get("adopted"):
            return
        for iid in self.adoption.placed(version, header["adopted"]):
            log.info("adopting running instance %s of model %s version %d", iid.decode(errors="replace"),
                     version.name, version.version)
            self._send_backend([iid, encode({"k": Kind.RESET, **self.adoption.rejoin_header(iid, self.boot)})])

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
                scaled.append({"assignment": assignment, "count": count})
        # "complete": after this, the agent stops whatever it runs that was not kept.
        self._send_backend([agent.identity, encode({"k": Kind.ASSIGN, "models": models, "scale": scaled,
                                                    "complete": True})])

    def _on_drain(self, peer: bytes) -> None:
        agent = self.registry.agents.get(peer)
        if agent is None:   # nothing of this broker runs there
            self._send_backend([peer, encode({"k": Kind.DRAINED})])
            return
        agent.draining = True
        self.lifecycle.host_gone(peer, f"host {agent.host} began draining while the model was loading")
        self.autoscaler.agent_draining(peer)
        for instance in self.registry.instances.values():
            if instance.agent == peer:
                instance.draining = True
        log.info("host agent %s (host %s) is draining: its instances get no new batches", peer.decode(),
                 agent.host)
        self._check_agent_drained(agent)

    def _check_agent_drained(self, agent: AgentRecord) -> None:
        instances = [i for i in self.registry.instances.values() if i.agent == agent.identity]
        if not self.scheduler.holds_work(instances):
            self._send_backend([agent.identity, encode({"k": Kind.DRAINED})])

    def _protocol_ok(self, sock: zmq.Socket, peer: bytes, header: dict) -> bool:
        if header.get("pv") == PROTOCOL_VERSION:
            return True
        reason = (f"protocol version {header.get('pv')} refused; this broker speaks "
                  f"version {PROTOCOL_VERSION}")
        log.error("peer %s (%s): %s", peer.decode(errors="replace"), header.get("role"), reason)
        self._send(sock, [peer, encode({"k": Kind.REFUSED, "reason": reason})])
        return False

    def _on_backend_hello(self, peer: bytes, header: dict) -> None:
        if not self._protocol_ok(self.backend, peer, header):
            return
        self.liveness.beats_every(peer, header.get("hb", 0.0))
        self._unreachable.discard(peer)
        role = header.get("role")
        if role == "agent":
            models = header.get("models")
            agent = AgentRecord(peer, header.get("host", "?"), tuple(header.get("gpus") or ()),
                                tuple(models) if models else None, cpu_slots=int(header.get("cpu_slots", 0)))
            self.registry.agents[peer] = agent
            self._reset_sent.pop(peer, None)
            self.adoption.announce(peer, header.get("running"))
            log.info("host agent %s joined (host %s, gpus %s)", peer.decode(), agent.host, list(agent.gpus))
            self._send_backend([peer, encode({"k": Kind.HEARTBEAT, "boot": self.boot,
                                              "hb": self.settings.heartbeat_interval_s})])
            self._send_backend([peer, self._log_settings_message()])
            self._assign_on_join(agent)
        elif role == "instance":
            self._on_instance_hello(peer, header)
        else:
            raise ProtocolError(f"unknown role {role!r} in HELLO")

    def _on_instance_hello(self, peer: bytes, header: dict) -> None:
        if peer in self.registry.instances:
            return   # an adopted instance told the new epoch twice (its RESET was sent again) says HELLO twice
        version = self._epoch_of(header)
        # A draining version takes back a restarted instance: its queue still needs one.
        if version is None or version.state not in (VersionState.LOADING, VersionState.READY,
                                                     VersionState.UNLOADING):
            log.warning("instance %s of %s version %s (load %s) is not wanted; ignoring it",
                        header.get("name"), header["m"], header["v"], header.get("e"))
            return
        agent = self.registry.agents.get(header["agent"].encode())
        if agent is None:   # its host must register first; it will start it again
            self._send_backend([peer, encode({"k": Kind.RESET})])
            return
        version.awaited.pop(header["name"], None)
        self.adoption.forget(peer)
        instance = InstanceRecord(peer, header["agent"].encode(), header["m"], header["v"],
                                  header["name"], int(header.get("credit", 1)), epoch=version.epoch,
                                  draining=agent is None or agent.draining, kind=header.get("kind", "CPU"))
        self.registry.instances[peer] = instance
        version.instances.append(instance)
        if len(version.instances) == 1:
            self.registry.generation += 1   # ready again: gateways must hear of it
        log.info("instance %s of model %s version %d is ready", instance.name, version.name, version.version)
        self.lifecycle.instance_joined(version, instance.name)
        self.autoscaler.instance_joined(version)
        self.scheduler.instance_ready(instance)

    def _epoch_of(self, header: dict) -> ModelVersion | None:
        """The load an instance message is about; none when a previous broker process placed it."""
        return self.registry.epochs.get(header.get("e")) if header.get("boot") == self.boot else None

    def _on_instance_failed(self, header: dict) -> None:
        version = self._epoch_of(header)
        message = header.get("err", "instance failed to initialize")
        log.error("instance %s of model %s version %s failed: %s", header.get("name"),
                  header["m"], header["v"], message)
        if version is not None and version.state == VersionState.LOADING:
            self.lifecycle.version_failed(version, message)
        elif version is not None and version.autoscale is not None:
            self.autoscaler.instance_failed(version, header.get("agent", "").encode(), message)

    def _on_instance_health(self, peer: bytes, header: dict) -> None:
        instance = self.registry.instances.get(peer)
        if instance is None or instance.healthy == bool(header.get("ready")):
            return
        instance.healthy = bool(header.get("ready"))
        self.registry.generation += 1  # gateways answer readiness from the table
        log.info("instance %s of model %s version %d reports %s", instance.name, instance.model,
                 instance.version, "ready" if instance.healthy else "not ready (is_ready() returned False)")

    def _on_instance_exited(self, header: dict) -> None:
        iid = header["iid"].encode() if isinstance(header["iid"], str) else header["iid"]
        why = header.get("why", "exited")
        instance = self.registry.instances.get(iid)
        agent = self.registry.agents.get(instance.agent) if instance else None
        self.scheduler.instance_lost(iid, why, restart_expected=agent is not None and not agent.draining)
        self.liveness.forget(iid)
        self.adoption.forget(iid)
        version = self._epoch_of(header)
        name = header.get("name")
        # An instance stopped on purpose, or one that reported its own init failure, fails no load
        # and is not coming back.
        expected = header.get("stopped") or header.get("code") == ExitCode.INIT_FAILED
        if version is not None and expected:
            version.awaited.pop(name, None)
        if version is not None and version.state == VersionState.LOADING and name not in version.seen_ready \
                and not expected:
            # It died before it was ready (a crash, not a reported init failure): the load fails,
            # rather than waiting on restarts that may never succeed.
            self.lifecycle.version_failed(version, f"instance {name} {why} before it was ready")


# What the broker tells a peer unasked: losing these to a peer that left loses nothing.
_NOTICES = frozenset({Kind.HEARTBEAT, Kind.MODELS, Kind.LOG_SETTINGS, Kind.RESET, Kind.DRAINED})


def _only_notices(parts: list) -> bool:
    position = 1
    while position < len(parts):
        try:
            header, _, _ = decode(parts[position])
        except ProtocolError:
            return False
        if header["k"] not in _NOTICES:
            return False
        external = header.get("x", 0)
        position += 1 + (external if isinstance(external, int) else 0)
    return True


def _model_name(args: dict) -> str:
    name = args.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a model name is required")
    return name


def _histogram_buckets(config) -> tuple[float, ...]:
    """A model's own buckets for the first-response histogram (model_metrics), or Triton's."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == "nv_inference_first_response_histogram_ms":
            return tuple(control.histogram_options.buckets)
    return DEFAULT_HISTOGRAM_BUCKETS_MS
