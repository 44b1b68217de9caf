"""The broker process's loop: its two ROUTER sockets, the poll, and each message kind handed to its owner.

``frontend`` faces gateways (INFER, CONTROL, HELLO); ``backend`` faces host agents and
instance processes (HELLO, PLACED, BATCH_DONE, ...). The loop drains every ready
message on each wake-up, and sleeps no longer than the earliest batching deadline.
Requests and results go to the ``Scheduler``, CONTROL to ``Control``, what peers say of
themselves to ``Peers`` (which changes ``Membership``), model loading to ``ModelLifecycle``.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from tritium.broker.adoption import Adoption
from tritium.broker.autoscale import Autoscaler
from tritium.broker.control import Control
from tritium.broker.latency_summary import LatencySummaries
from tritium.broker.lifecycle import ControlSettings, ModelLifecycle
from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.peers import Peers
from tritium.broker.rate_limiter import RateLimiter, ResourceFlag
from tritium.broker.response_cache import ResponseCache
from tritium.broker.metrics import (
    DEFAULT_HISTOGRAM_BUCKETS_MS,
    MetricsSettings,
    TritonCollector,
    start_metrics_server,
)
from tritium.broker.registry import ModelVersion, Registry
from tritium.broker.scheduler import Scheduler
from tritium.broker.startup_hold import StartupHold
from tritium.repo import ModelRepository, RepositoryOptions
from tritium import notify
from tritium.logs import LogSettings
from tritium.errors import InvalidArgument, ProtocolError, Unavailable
from tritium.gctune import tune_for_serving
from tritium.exit_codes import ExitCode
from tritium.ports import PortInUse
from tritium.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    HEARTBEAT_SUFFIX,
    PROTOCOL_VERSION,
    RECONNECT_IVL_MAX_MS,
    BatchDone,
    Cancel,
    CancelRunning,
    ControlReply,
    Drain,
    Drained,
    Heartbeat,
    Hello,
    HostMetrics,
    Infer,
    InstanceExited,
    InstanceFailed,
    InstanceHealth,
    Kind,
    LogSettings as LogSettingsMessage,
    Message,
    MetricsAsk,
    Models,
    Placed,
    Refused,
    Reset,
    ResponsePart,
    decode,
    own_stall,
    read_record,
)
from tritium.protocol import Control as ControlRequest
from tritium.links import LinkSocket, bind_router
from tritium.security import CurveKeys
from tritium.signals import SignalWaker
from tritium.zmqio import POLL_WHILE_AT_MOST, cpu_is_free

log = logging.getLogger(__name__)

# Each socket is drained of at most this many messages per turn, so that neither side starves.
_DRAIN_LIMIT = 512
# What handles one record of a socket's message: (peer, the message's parts, the record's position, its header).
Handler = Callable[[bytes, list, int, Message], None]
_NOBLOCK = int(zmq.NOBLOCK)
_HWM = 100_000
# How long a /metrics scrape waits for the instances' latest custom metrics.
SCRAPE_WAIT_S = 0.5


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
    spin_s: float = 0.0              # --broker-spin-us: how long to poll for the next message before sleeping
    # --rate-limit=execution_count: the --rate-limit-resource counts; None: --rate-limit=off
    rate_limit_resources: tuple[ResourceFlag, ...] | None = None


class Broker:
    def __init__(self, settings: BrokerSettings, context: zmq.Context | None = None) -> None:
        self.settings = settings
        self.context = context or zmq.Context.instance()
        self.registry = Registry()
        self.frontend = self._bind(settings.frontend)
        self.backend = self._bind(settings.backend)
        cache = ResponseCache(settings.cache_bytes) if settings.cache_bytes else None
        limiter = None if settings.rate_limit_resources is None else RateLimiter(settings.rate_limit_resources)
        self.scheduler = Scheduler(self.registry, self._send_backend, self._send_frontend, cache=cache,
                                   rate_limiter=limiter)
        self.hold = StartupHold(HOLD_HEARTBEATS * settings.heartbeat_interval_s, time.monotonic_ns,
                                rejoin_s=settings.heartbeat_interval_s + RECONNECT_IVL_MAX_MS / 1000)
        self.scheduler.hold = self.hold
        self._to_gateways: dict[bytes, list] = {}   # this turn's messages, per gateway
        self._unreachable: set[bytes] = set()       # peers already warned about (see _peer_gone)
        self._pushed_generation = -1
        self._running = True
        # Told to peers in every heartbeat: a new value means the broker restarted and lost
        # whatever they had sent it.
        self.boot = int.from_bytes(os.urandom(6), "little")
        self.liveness = PeerLiveness(settings.heartbeat_interval_s)
        self.membership = Membership(self.registry, self.scheduler, self.liveness)
        self._now = time.monotonic()
        self._next_heartbeat = 0.0
        self._last_heartbeat = self._now
        self._metrics_asks = 0   # METRICS_ASKs sent: the number of the last
        self._stop_deadline: float | None = None   # set by the first SIGTERM: draining until then
        # While draining: the gateways that hold their new requests for the next broker process (all
        # they sent before has arrived), and until when the drain waits for the others to say so.
        self._holding_gateways: set[bytes] = set()
        self._holding_wait_until = 0.0
        self.exit_code = ExitCode.OK
        self.repository = ModelRepository(settings.model_repositories, settings.repository)
        self.autoscaler = Autoscaler(self.registry, self._send_backend, self.scheduler, time.monotonic_ns,
                                     self.membership.changed, self.hold)
        self.scheduler.autoscaler = self.autoscaler
        self.lifecycle = ModelLifecycle(self.registry, self.repository, self.scheduler, self._send_backend,
                                        settings.control, self.membership, self._new_version, self.autoscaler)
        self.control = Control(self.registry, self.membership, self.lifecycle, self._send_frontend,
                               self._send_backend, self._push_models_if_changed,
                               LogSettings(log_verbose_level=settings.log_verbose))
        self.peers = Peers(self.registry, self.membership, self.lifecycle, self.autoscaler, self.scheduler,
                           self.liveness, Adoption(), self._send_frontend, self._send_backend,
                           self.control.log_settings_message, self.boot, settings.heartbeat_interval_s,
                           self.hold)
        self._next_scaling = 0.0
        self._waiter = select.poll()
        self._socket_fds = [(sock, sock.fileno()) for sock in (self.backend, self.frontend)]
        self._socket_of = {fd: sock for sock, fd in self._socket_fds}
        for fd in [fd for _, fd in self._socket_fds] + [self.lifecycle.reader.wake_read.fileno()]:
            self._waiter.register(fd, select.POLLIN)

    @property
    def gateways(self) -> set[bytes]:
        return self.membership.gateways

    @property
    def log_settings(self) -> LogSettings:
        """What every gateway, agent and instance is handed (Control owns and changes them)."""
        return self.control.log_settings

    @log_settings.setter
    def log_settings(self, settings: LogSettings) -> None:
        self.control.log_settings = settings

    def _bind(self, address: str) -> LinkSocket:
        return bind_router(address, self.settings.curve, _HWM, self.context)

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

    def _send(self, sock: LinkSocket, parts: list) -> bool:
        """Never blocks the loop: a peer that stopped reading (paused, wedged) loses what does
        not fit in its queue, rather than every other peer losing the broker. Whether it was sent."""
        try:
            sock.send_parts(parts, _NOBLOCK)
            return True
        except zmq.Again:
            log.warning("peer %r is not reading (its queue is full); dropped a message to it", parts[0])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer's connection is gone
            self._peer_gone(parts, exc)
        return False

    def _peer_gone(self, parts: list, exc: zmq.ZMQError) -> None:
        """A peer that left stops getting heartbeats and model tables. Only lost answers are
        worth a warning (once per peer): a gateway that drained and stopped, as every clean
        shutdown's gateways do before the broker stops, lost nothing."""
        peer = parts[0]
        if self.membership.remove_gateway(peer):
            log.info("gateway %s disconnected", peer.decode(errors="replace"))
        if peer in self._unreachable or _only_notices(parts):
            return
        self._unreachable.add(peer)
        log.warning("cannot send to peer %r: %s; what it was sent is lost", peer, exc)

    def _push_models_if_changed(self) -> None:
        if self.hold.open and self.hold.close_if_over(self.lifecycle.loading) is not None:
            self.scheduler.hold_ended()
            self._pushed_generation = -1   # the gateways whose table waited get it now
        if self.registry.generation != self._pushed_generation:
            self._pushed_generation = self.registry.generation
            message = self.registry.table().encode()
            for gateway in list(self.membership.gateways):
                if not self.hold.deferred(gateway):
                    self._send_frontend([gateway, message])

    # -- model loading ------------------------------------------------------------------

    def load_repository(self) -> None:
        """Load what the model control mode loads at startup."""
        self.lifecycle.start()
        self.registry.startup_begun = True
        self.membership.changed()   # gateways hear of it even when nothing was to load

    def _new_version(self, version: ModelVersion) -> None:
        metrics = self.settings.metrics
        if metrics is not None and metrics.histogram_latencies:
            version.stats.enable_histogram(_histogram_buckets(version.definition.config))
        if metrics is not None and metrics.summary_latencies:
            version.stats.summaries = LatencySummaries()

    # -- custom metrics ---------------------------------------------------------------------

    def _scrape_custom_metrics(self) -> None:
        """In the metrics server's thread, before a scrape: the loop asks every instance of a
        Python model for its custom metrics, and the scrape waits for their answers (not past
        ``SCRAPE_WAIT_S``: then it shows what the instances' last heartbeats said)."""
        done = threading.Event()
        self.lifecycle.reader.post(lambda: self._ask_custom_metrics(done))
        done.wait(SCRAPE_WAIT_S)
        done.set()

    def _ask_custom_metrics(self, done: threading.Event) -> None:
        custom = self.registry.custom_metrics
        if done.is_set() or custom.waiting(done):   # (the scrape gave up, or it waits for the ask out)
            return
        self._metrics_asks += 1
        ask = MetricsAsk(self._metrics_asks).encode()
        asked = set()
        for iid, instance in self.registry.instances.items():
            version = self.registry.epochs.get(instance.epoch)
            if version is not None and version.definition.runs_python \
                    and self._send(self.backend, [iid + HEARTBEAT_SUFFIX, ask]):
                asked.add(iid)
        custom.asked(self._metrics_asks, asked, done)

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped by a signal; the process's exit code."""
        waker = SignalWaker(self._stop)
        self._waiter.register(waker.fd, select.POLLIN)
        if self.settings.metrics is not None:
            try:
                collector = TritonCollector(self.registry, self.settings.metrics, self._scrape_custom_metrics,
                                            self.scheduler.cache)
                self.metrics_server = start_metrics_server(collector, self.settings.metrics)
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

    def turn(self, timeout_ms: int | None = None) -> set[int]:
        """One turn of the loop: wait for a message or a deadline, handle what is ready, send.

        ``timeout_ms`` caps the wait (tests drive the broker turn by turn); returns the
        descriptors the wait found readable.
        """
        ready, fired = self._wait(timeout_ms)
        self._now = time.monotonic()
        with self.scheduler.turn():
            if self.backend in ready:
                self._drain(self.backend, self._on_backend)
            if self.frontend in ready:
                self._drain(self.frontend, self._on_frontend)
        reader = self.lifecycle.reader
        if not reader.completed.empty() or reader.wake_read.fileno() in fired:
            reader.run_completed()
        self.scheduler.run_due()
        if self.lifecycle.draining:
            self.lifecycle.check_drained()
        if self.lifecycle.instance_updates:
            self.lifecycle.instance_updates.check()
        if self.lifecycle.poller.poll_due():
            self.lifecycle.poller.poll()
        self._push_models_if_changed()
        if self._now >= self._next_heartbeat:
            self._heartbeat()
        if self._now >= self._next_scaling:
            self._next_scaling = self._now + 0.25
            self.autoscaler.evaluate()
        self._flush_frontend()   # before the stop check: a gateway that is gone shows it on a send
        if self._stop_deadline is not None:
            self._check_stopped(self._stop_deadline)
        return fired

    def _wait(self, timeout_ms: int | None) -> tuple[list[LinkSocket], set[int]]:
        """The sockets to drain and the descriptors that woke the wait.

        Blocks only when neither socket has a message read and waiting, even after polling for
        ``spin_s``, on the sockets' descriptors (``select.poll``, not ``zmq.Poller``, whose
        zero-timeout first pass and repeated ``EVENTS`` checks cost five system calls a turn);
        after a wait, a socket is drained if its descriptor fired, the drain's last receive
        clearing the edge. What arrived and was not read yet keeps a tritium socket's descriptor
        readable, so the wait returns at once for it without a check of its own (a system call
        per socket and turn); a libzmq socket, whose descriptor signals an arrival once, is asked.
        """
        if self.backend.has_message_read() or self.frontend.has_message_read():
            # The other socket's arrivals too: a backlog of one must not starve the other.
            fired = {fd for fd, _ in self._waiter.poll(0)}
            return [sock for sock, fd in self._socket_fds if fd in fired or sock.has_message_read()], fired
        wait_ms = self._wait_ms(timeout_ms)
        if self.settings.spin_s:
            ready = self._spin_for_message(wait_ms)
            if ready:
                return ready, set()
            wait_ms = self._wait_ms(timeout_ms)   # the polling took some of it
        fired = {fd for fd, _ in self._waiter.poll(wait_ms)}
        if len(fired) == 1:   # (the usual: one socket; a list built for one costs more, once per turn)
            sock = self._socket_of.get(next(iter(fired)))
            return ([] if sock is None else [sock]), fired
        return [sock for sock, fd in self._socket_fds if fd in fired], fired

    def _wait_ms(self, timeout_ms: int | None) -> int:
        return self._timeout_ms() if timeout_ms is None else min(timeout_ms, self._timeout_ms())

    def _spin_for_message(self, wait_ms: int) -> list[LinkSocket]:
        """The sockets with a message queued, polled while requests come one at a time: for up to
        ``spin_s`` while instances run the one request, or until ``spin_s`` after its answer (its
        client's next request is likely on its way), and never longer than the wait ahead
        (``wait_ms``: a batch's queue delay and heartbeats are not held up); none: sleep.

        Waking a sleeping process costs tens of microseconds, and more when its CPU has gone
        idle (on a virtual machine, a trip through the hypervisor); the next message often
        comes sooner than that. Between checks the CPU is yielded, and the polling stops as
        soon as another thread takes it: it uses only time the CPU would have spent idle.
        """
        until = self._polling_ends(wait_ms)
        while until is not None and time.monotonic() < until and cpu_is_free():
            ready = self._queued()
            if ready:
                return ready
        return []

    def _polling_ends(self, wait_ms: int) -> float | None:
        """When polling should end (``time.monotonic``); None: not worth it, as requests do not
        come one at a time (under load the next message is usually queued before the broker looks)."""
        if not self.scheduler.one_at_a_time:
            return None
        now = time.monotonic()
        running = self.scheduler.requests_running
        if 0 < running <= POLL_WHILE_AT_MOST:   # for its answer
            return now + min(self.settings.spin_s, wait_ms / 1000)
        if running == 0:   # for its client's next request, after the answer (the clock is time.monotonic_ns)
            return min(self.scheduler.last_done_ns / 1e9 + self.settings.spin_s, now + wait_ms / 1000)
        return None

    def _queued(self) -> list[LinkSocket]:
        return [sock for sock, _ in self._socket_fds if sock.has_message()]

    def close(self) -> int:
        """Answer whatever is still held, let the answers leave, close; the exit code."""
        log.info("broker stopping")
        self.scheduler.fail_everything(Unavailable("the server is shutting down"))
        self._flush_frontend()
        self.lifecycle.close()
        self.control.tracing.close()
        # Linger: the last answers (results and errors) must leave before the sockets go.
        self.frontend.close(2.0)
        self.backend.close(2.0)
        return self.exit_code

    def _stop(self, signum: int, _frame: object) -> None:
        """First signal: drain (``drain``: the gateways hold their new requests for the next
        broker process, what they sent before is served); second: exit now."""
        if self._stop_deadline is not None:
            log.warning("second stop signal: exiting without waiting for requests in flight")
            self._running = False
            self.exit_code = ExitCode.FORCED
            return
        self.drain()

    def drain(self) -> None:
        """Refuse nothing already sent, finish what was accepted, then exit; the gateways hear of
        it in the next turn's heartbeat (sent from the loop, not from a signal handler) and hold
        their new requests for the next broker process."""
        self._stop_deadline = time.monotonic() + self.settings.exit_timeout_s
        self._holding_wait_until = time.monotonic() + 2 * self.settings.heartbeat_interval_s
        self._next_heartbeat = 0.0
        notify.stopping()

    def _check_stopped(self, deadline: float) -> None:
        """Exit once nothing is left to answer: no request is queued or running, and every gateway
        holds its new requests for the next broker process (or did not say so in time)."""
        gateways_hold = self.membership.gateways <= self._holding_gateways or self._now >= self._holding_wait_until
        if self.scheduler.idle() and gateways_hold:
            self._running = False
        elif self._now >= deadline:
            log.warning("requests still in flight after %.0f s; answering them with errors",
                        self.settings.exit_timeout_s)
            self._running = False

    def _heartbeat(self) -> None:
        """Tell gateways and agents the broker lives; drop the peers that went silent."""
        self._next_heartbeat = self._now + self.settings.heartbeat_interval_s
        self.liveness.excuse(own_stall(self._last_heartbeat, self._now, self.settings.heartbeat_interval_s), self._now)
        self._last_heartbeat = self._now
        beat = Heartbeat(self.boot, self.settings.heartbeat_interval_s,
                         draining=self._stop_deadline is not None).encode()
        for gateway in list(self.membership.gateways):
            self._send_frontend([gateway, beat])
        for agent in list(self.registry.agents):
            self._send_backend([agent, beat])
        for peer in self.liveness.silent(self._now):
            self.peers.drop_silent(peer, self._now)
        self.scheduler.fail_unserviceable()
        self.peers.check_draining_agents()

    def _timeout_ms(self) -> int:
        """Until the earliest batching deadline, and never past the next heartbeat."""
        longest = max(1, int((self._next_heartbeat - time.monotonic()) * 1000) + 1)
        deadline = self.scheduler.next_deadline_ns()
        if deadline is None:
            return longest
        return max(0, min(longest, -(-(deadline - time.monotonic_ns()) // 1_000_000)))

    def _drain(self, sock: LinkSocket, handle: Handler) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                parts = sock.recv_parts()
            except zmq.Again:
                return
            peer = parts[0]
            self.liveness.heard(peer, self._now)
            position = 1
            while position < len(parts):
                try:
                    message = read_record(parts[position])[0]
                except ProtocolError as exc:
                    external = self._malformed(sock, peer, parts[position], exc)
                    if external is None:
                        break
                    position += 1 + external   # the records after it are other requests, answered as usual
                    continue
                try:
                    handle(peer, parts, position, message)
                except ProtocolError as exc:
                    log.warning("dropped a malformed message from %r: %s", peer, exc)
                    break
                except Exception:   # one record's failure must not cost the records after it
                    log.exception("error handling a message from %r", peer)
                if isinstance(message, (BatchDone, ResponsePart)):
                    break  # the records after it are its responses
                position += 1 + message.external

    def _malformed(self, sock: LinkSocket, peer: bytes, record: object, exc: ProtocolError) -> int | None:
        """A record that does not read as its kind: a peer of another protocol version is refused, a
        malformed INFER or CONTROL answered with the error. Returns how many external frames follow
        an answered record, when its header says, so that the records after it are read; None drops
        the rest of the message."""
        log.warning("dropped a malformed message from %r: %s", peer, exc)
        try:
            header, _, _ = decode(record)
        except ProtocolError:
            return None
        if header["k"] in (Kind.HELLO, Kind.HEARTBEAT) and "pv" in header:
            self._protocol_ok(sock, peer, header["pv"], header.get("role"))
            return None
        if header["k"] == Kind.INFER and isinstance(header.get("rid"), int):
            self.scheduler.reply_error(peer, header["rid"], InvalidArgument(f"malformed inference request: {exc}"),
                                       sock is self.backend)
        elif header["k"] == Kind.BATCH_DONE and isinstance(header.get("b"), int) and sock is self.backend:
            self.scheduler.batch_unreadable(peer, header["b"], str(exc))
            return None   # the records after it are its responses
        elif header["k"] == Kind.CONTROL and isinstance(header.get("rid"), int):   # a gateway's, or a model's
            error = InvalidArgument(f"malformed control request: {exc}")
            self._send(sock, [peer, ControlReply(header["rid"], error=error).encode()])
        else:
            return None
        external = header.get("x", 0)   # a gateway's message holds its turn's requests: the others are served
        return external if type(external) is int and external >= 0 else None

    # -- dispatch of message kinds ------------------------------------------------------

    def _on_frontend(self, peer: bytes, parts: list, position: int, message: Message) -> None:
        if type(message) is Infer:
            self.membership.note_gateway_request(peer, message.rid)
            # While draining, what a gateway sent before it heard so is served; after, it holds its
            # requests (one that never says so is refused once it had time to).
            if self._stop_deadline is not None and (peer in self._holding_gateways
                                                    or self._now >= self._holding_wait_until):
                self.scheduler.reply_error(peer, message.rid, Unavailable("the server is shutting down"))
                return
            self._submit(peer, parts, position, message, False)
        elif type(message) is Cancel:
            self.scheduler.cancel(peer, message)
        elif type(message) is ControlRequest:
            self.membership.note_gateway_request(peer, message.rid)
            if self.hold.undefer(peer):
                self._pushed_generation = -1   # its call may change the table: it must see the result
            self.control.handle(peer, message)
        elif type(message) is Hello or (type(message) is Heartbeat and peer not in self.membership.gateways
                                        and message.protocol_version is not None):
            # A gateway of a previous broker process says hello again by heartbeating.
            since = self.membership.gateway_boundary(peer, message.next_rid if type(message) is Heartbeat else None)
            if self._protocol_ok(self.frontend, peer, message.protocol_version, message.role):
                self._unreachable.discard(peer)
                draining = self._stop_deadline is not None
                self.peers.gateway_hello(peer, message, since, draining=draining)
                if draining:   # told to hold by that heartbeat: it has two intervals to say it does
                    self._holding_wait_until = max(self._holding_wait_until,
                                                   self._now + 2 * self.settings.heartbeat_interval_s)
        elif type(message) is Heartbeat:
            if message.pools is not None:
                self.membership.record_tensor_pools(peer, message.pools)
            # A gateway holds for this process's drain (not still for a previous process's).
            if message.holding and message.boot == self.boot and self._stop_deadline is not None:
                self._holding_gateways.add(peer)
        else:
            raise ProtocolError(f"unexpected {message.kind.name} on the frontend")

    def _on_backend(self, peer: bytes, parts: list, position: int, message: Message) -> None:
        if type(message) is BatchDone:
            self.scheduler.batch_done(peer, message, parts[position + 1:])
        elif type(message) is ResponsePart:
            first = self.scheduler.streams.response_part(peer, message, parts[position + 1:])
            if first and self.scheduler.one_at_a_time:
                # A stream's first response, when requests come one at a time, leaves now: not with
                # the responses its model sends meanwhile, which this turn would read first.
                self._flush_frontend()
        elif type(message) is Infer:  # a model calling another model (BLS)
            self.membership.note_bls_call(peer, message.rid)
            self._submit(peer, parts, position, message, True)
        elif type(message) is Cancel:  # a model giving up on its BLS request
            self.scheduler.cancel(peer, message)
        elif type(message) is ControlRequest:  # a model loading, unloading or asking after a model
            self.membership.note_bls_call(peer, message.rid)
            self.control.handle(peer, message, self._send_backend)
        elif type(message) is Hello:
            if self._protocol_ok(self.backend, peer, message.protocol_version, message.role):
                self._unreachable.discard(peer)
                self.peers.backend_hello(peer, message)
        elif type(message) is Placed:
            self.peers.placed(peer, message)
        elif type(message) is InstanceFailed:
            self.peers.instance_failed(message)
        elif type(message) is InstanceExited:
            self.peers.instance_exited(peer, message)
        elif type(message) is InstanceHealth:
            self.peers.instance_health(peer, message)
        elif type(message) is HostMetrics:
            self.peers.host_metrics(message)
        elif type(message) is Heartbeat:
            if message.next_rid is not None:   # a BLS socket of the previous process asks what this one got
                since = self.membership.bls_boundary(peer, message.next_rid)
                self._send_backend([peer, Heartbeat(self.boot, since=since).encode()])
            else:
                self.peers.heartbeat(peer, message, self._now)
        elif type(message) is Drain:
            self.peers.drain(peer)
        else:
            raise ProtocolError(f"unexpected {message.kind.name} on the backend")

    def _submit(self, peer: bytes, parts: list, position: int, request: Infer, from_backend: bool) -> None:
        external = parts[position + 1:position + 1 + request.external] if request.external else None
        try:
            self.scheduler.submit(peer, parts[position], request, external, from_backend)
        except (TypeError, ValueError, IndexError) as exc:   # descriptors that do not describe tensors
            self.scheduler.reply_error(peer, request.rid, InvalidArgument(f"malformed inference request: {exc!r}"),
                                       from_backend)

    def _protocol_ok(self, sock: LinkSocket, peer: bytes, version: object, role: object) -> bool:
        """``version`` and ``role`` as the peer sent them: a malformed header's may be anything."""
        if version == PROTOCOL_VERSION:
            return True
        reason = f"protocol version {version} refused; this broker speaks version {PROTOCOL_VERSION}"
        log.error("peer %s (%s): %s", peer.decode(errors="replace"), getattr(role, "value", role), reason)
        self._send(sock, [peer, Refused(reason).encode()])
        return False


# How long a new broker process holds requests for versions it is still taking over (in its
# heartbeat intervals; broker/startup_hold.py): the takeover takes two or three.
HOLD_HEARTBEATS = 10

# What the broker tells a peer unasked: losing these to a peer that left loses nothing.
_NOTICES = (Heartbeat, Models, LogSettingsMessage, Reset, Drained, CancelRunning, MetricsAsk)


def _only_notices(parts: list) -> bool:
    position = 1
    while position < len(parts):
        try:
            message = read_record(parts[position])[0]
        except ProtocolError:
            return False
        if not isinstance(message, _NOTICES):
            return False
        position += 1 + message.external
    return True


def _histogram_buckets(config) -> tuple[float, ...]:
    """A model's own buckets for the first-response histogram (model_metrics), or Triton's."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == "nv_inference_first_response_histogram_ms":
            return tuple(control.histogram_options.buckets)
    return DEFAULT_HISTOGRAM_BUCKETS_MS
