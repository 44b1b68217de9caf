"""The host agent: joins the broker, starts and supervises this host's instance processes.

It announces the host (name, GPUs, protocol version) to the broker, receives which
model versions to serve (ASSIGN), resolves their instance groups for this host's GPUs,
and starts one process per instance. A process that dies is reported to the broker
(which fails the requests it held) and restarted with backoff, unless it failed to
initialize: that is a load failure, reported by the instance itself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import zmq
from google.protobuf import json_format

from tritium.repo import ModelConfig, ModelLoadError
from tritium.repo.instance_groups import resolve_instance_groups
from tritium.repo.json_form import config_to_json_dict
from tritium.repo.names import name_problem, write_files
from tritium import logs, notify
from tritium.hostmetrics import HostSampler
from tritium.hosts import host_name
from tritium.errors import InternalError, Unavailable
from tritium.exit_codes import ExitCode
from tritium.lifetime import own_process_group, stop_with_descendants
from tritium.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    MISSED_HEARTBEATS,
    PROTOCOL_VERSION,
    RECONNECT_IVL_MAX_MS,
    RECONNECT_IVL_MS,
    Assign,
    Assignment,
    Drain,
    Drained,
    Heartbeat,
    Hello,
    HostMetrics,
    InstanceExited,
    LogSettings,
    Placed,
    Refused,
    Reset,
    Role,
    RunningInstance,
    Scale,
    Unassign,
    own_stall,
    read_record,
)
from tritium.security import CurveKeys, secure_client
from tritium.shared_pool import DEFAULT_POOL_BYTES
from tritium.signals import SignalWaker
from tritium.workers.repository_fetch import RepositoryFetcher
from tritium.workers.placement import (
    InstancePlan,
    plan_instances,
    plan_scaled,
    plan_signature,
    update_instance_groups,
)

log = logging.getLogger(__name__)

_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_BACKOFF_START_S = 1.0
_BACKOFF_MAX_S = 32.0
_HEALTHY_AFTER_S = 60.0  # a process that ran this long starts its next backoff from the beginning


@dataclass(frozen=True)
class WorkerSettings:
    broker: str
    model_repositories: tuple[str, ...]
    gpus: tuple[int, ...]
    models: tuple[str, ...] | None = None
    credit: int = 2
    log_verbose: int = 0
    log_file: str = ""   # where this agent and its instances log ("": standard error)
    exit_timeout_s: float = 30.0
    backend_directory: str | None = None
    backend_config: dict = field(default_factory=dict)   # backend name -> {key: value}
    metrics_interval_s: float = 2.0
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    max_cpu_instances: int = field(default_factory=lambda: os.cpu_count() or 1)   # room for autoscaled ones
    curve: CurveKeys | None = None   # also given to the instances, as file paths in their spec
    tensor_pool_bytes: int = DEFAULT_POOL_BYTES   # each instance's pool for large outputs (0: none)


@dataclass(eq=False)
class Child:
    """One instance process and what it takes to start it again."""

    plan: InstancePlan
    model: str
    version: int
    epoch: int          # the load it belongs to: a reload runs beside the one it replaces
    spec: dict
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    incarnation: int = 0
    backoff_s: float = _BACKOFF_START_S
    restart_at: float | None = None
    wanted: bool = True
    iid: str = field(default="")
    kill_at: float | None = None   # stopped on purpose: SIGKILL if still running then
    identity: str = ""  # the load identity the broker gave (what the process runs), for adoption
    scaled: bool = False   # started by SCALE (an autoscaled model), not from instance groups
    final_word: int | None = None   # the pipe on which the running process says why it ends for good

    def running(self) -> RunningInstance:
        """How the HELLO to a new broker describes this instance, so that it may keep it."""
        assert self.process is not None   # offered while it runs (_reap withdraws one that ended)
        return RunningInstance(self.iid, self.model, self.version, self.identity, self.plan.key, self.plan.name,
                               self.plan.kind, self.plan.device_id, self.spec.get("credit", 1), self.scaled,
                               self.process.pid)

    def adopted(self, epoch: int, boot: int | None) -> None:
        """It now belongs to load ``epoch`` of broker ``boot``; a restart starts it as such."""
        self.epoch = epoch
        self.spec = dict(self.spec, epoch=epoch, boot=boot)


class HostAgent:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.identity = f"agent-{host_name()}-{os.getpid()}"
        self.context: zmq.Context = zmq.Context.instance()
        self.sock = self.context.socket(zmq.DEALER)
        secure_client(self.sock, settings.curve, "worker")
        self.sock.setsockopt(zmq.IDENTITY, self.identity.encode())
        self.sock.setsockopt(zmq.LINGER, 1000)
        # After losing the broker, ZeroMQ reconnects by itself, backing off to once a second.
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        self.sock.connect(settings.broker)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)
        self._fetcher = RepositoryFetcher(settings.model_repositories)
        if self._fetcher.wake_fd is not None:
            self._poller.register(self._fetcher.wake_fd, zmq.POLLIN)
        self.children: list[Child] = []
        self._running = True
        self._exit_code = ExitCode.OK
        self._drain_deadline: float | None = None   # set by SIGTERM: the broker is moving work away
        self._stop_signals = self._stop_signals_handled = 0
        self._starts = 0
        self._broker_boot: int | None = None        # which broker process assigned the running instances
        self._adoptable: dict[str, Child] = {}       # iid -> running for a previous broker, offered to the new one
        self._last_heard = time.monotonic()
        self._broker_lost = False
        self._broker_interval = 0.0   # the broker's heartbeat interval, as its heartbeats say
        self._next_heartbeat = 0.0
        self._last_heartbeat = self._last_heard
        self._sampler = HostSampler()
        self._log_settings: dict | None = None
        self._shipped = Path(tempfile.mkdtemp(prefix="tritium-shipped-"))  # load API file overrides
        self._next_metrics = 0.0

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        waker = SignalWaker(self._stop, also_wake_on=[signal.SIGCHLD])  # a child's end wakes the loop
        # Ctrl-Z of a worker run by hand: its instances lead groups of their own, out of the
        # terminal's reach, so it stops them with itself (under serve, serve stops them all).
        signal.signal(signal.SIGTSTP, lambda *_: stop_with_descendants())
        self._poller.register(waker.fd, zmq.POLLIN)
        self.start()
        notify.ready(f"worker agent {self.identity} -> {self.settings.broker}")
        watchdog = notify.Watchdog.from_environment()
        while self._running:
            watchdog.tick()
            if waker.fd in self.turn():
                waker.clear()
                self._handle_stop_signals()
        return self.close()

    def start(self) -> None:
        """Say HELLO to the broker."""
        self._hello()
        log.info("worker agent %s connecting to %s (gpus %s)", self.identity, self.settings.broker,
                 list(self.settings.gpus))

    def turn(self, timeout_ms: int = 250) -> dict:
        """One turn of the loop: wait for the broker (or a signal) at most ``timeout_ms``, handle
        what arrived, supervise the instances, heartbeat; the poll's events (tests drive the
        agent turn by turn)."""
        events = dict(self._poller.poll(timeout_ms))
        if self.sock in events:
            self._drain()
        if self._fetcher.wake_fd in events:
            for message in self._fetcher.completed():
                self._handle(message)
        self._reap()
        if self._fetcher.wake_fd is not None:   # bucket snapshots of no load, once no instance runs from them
            self._fetcher.collect({Path(child.spec["model_dir"]) for child in self.children})
        self._kill_overdue()
        self._restart_due()
        self._report_host()
        self._keep_alive()
        if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
            log.warning("the broker did not confirm the drain within %.0f s; stopping anyway",
                        self.settings.exit_timeout_s)
            self._running = False
        return events

    @property
    def running(self) -> bool:
        """False once the agent has decided to stop (drained, refused, second stop)."""
        return self._running

    @property
    def broker_boot(self) -> int | None:
        """The boot id of the broker that answered this agent's last HELLO (None until one does)."""
        return self._broker_boot

    @property
    def broker_lost(self) -> bool:
        """The broker has been silent for MISSED_HEARTBEATS intervals (and not heard since)."""
        return self._broker_lost

    def request_stop(self) -> None:
        """What SIGTERM does: the first drains the host, a second (or one without a broker) stops now."""
        self._stop_signals += 1
        self._handle_stop_signals()

    def close(self) -> int:
        """Stop every instance, tell the broker, close the socket; the exit code."""
        notify.stopping()
        self._shutdown()
        return self._exit_code

    def _hello(self) -> None:
        self._send(Hello(Role.AGENT, PROTOCOL_VERSION, heartbeat_s=self.settings.heartbeat_interval_s,
                         host=host_name(), gpus=tuple(self.settings.gpus), models=tuple(self.settings.models or ()),
                         cpu_slots=self.settings.max_cpu_instances,
                         running=tuple(child.running() for child in self._adoptable.values())))

    def _stop(self, signum, _frame) -> None:
        self._stop_signals += 1   # handled in the loop: a signal handler must not touch the socket

    def _handle_stop_signals(self) -> None:
        """First signal: drain (the broker stops sending batches here); second: stop now."""
        if self._stop_signals == self._stop_signals_handled:
            return
        self._stop_signals_handled = self._stop_signals
        if self._drain_deadline is not None or self._broker_lost or self._stop_signals > 1:
            self._running = False
            if self._drain_deadline is not None or self._stop_signals > 1:
                self._exit_code = ExitCode.FORCED
            return
        notify.stopping()
        log.info("draining: the broker moves work away from this host before it stops")
        self._drain_deadline = time.monotonic() + self.settings.exit_timeout_s
        self._send(Drain())
        for message in self._fetcher.start_draining():   # loads are refused now: none waits for a download
            self._handle(message)

    def _send(self, message) -> None:
        """Never blocks: while the broker is away, what does not fit in ZeroMQ's queue is dropped
        (heartbeats and metrics are worthless late; the broker learns the rest when it is back)."""
        try:
            self.sock.send(message.encode(), zmq.NOBLOCK)
        except zmq.Again:
            log.debug("broker unreachable; dropped a %s", message.kind.name)

    def _keep_alive(self) -> None:
        """Heartbeat to the broker; notice when it has gone silent."""
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        interval = self.settings.heartbeat_interval_s
        self._next_heartbeat = now + interval
        self._send(Heartbeat(heartbeat_s=interval, role=Role.AGENT, working=self._working()))
        self._last_heard = min(now, self._last_heard + own_stall(self._last_heartbeat, now, interval))
        self._last_heartbeat = now
        if not self._broker_lost and now - self._last_heard > max(interval, self._broker_interval) * MISSED_HEARTBEATS:
            self._broker_lost = True
            log.warning("lost contact with the broker at %s; instances keep running while reconnecting",
                        self.settings.broker)

    def _working(self) -> list[str]:
        """The instances whose processes run: not exited, not stopped by a signal. The broker keeps
        one of them that falls silent, as Triton keeps a stub that computes: its main thread may hold
        Python's GIL in a long call (a library that does not release it), starving its heartbeats."""
        return [child.iid for child in self.children
                if child.iid and child.process is not None and child.process.poll() is None
                and not _stopped(child.process.pid)]

    def _register_again(self, why: str) -> None:
        """A new broker (or one that dropped this host) knows none of this host's instances: they are
        offered to it (it keeps those it would start anyway); a draining host stops them."""
        for message in self._fetcher.reset():   # the old broker's unloads still apply; its loads do not
            self._handle(message)
        keep = self._drain_deadline is None
        for child in self.children:
            if not (keep and child.wanted and child.process is not None):
                self._stop_child(child)
        self.children = [c for c in self.children if c.process is not None]
        self._adoptable = {c.iid: c for c in self.children if c.wanted}
        log.warning("%s: registering again, offering %d running instance(s)", why, len(self._adoptable))
        self._broker_boot = None   # until the broker's heartbeat answers this HELLO
        self._hello()
        if self._drain_deadline is not None:
            self._send(Drain())   # a new broker process must know this host is leaving

    def _drain(self) -> None:
        while True:
            try:
                message, _, _ = read_record(self.sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            if self._broker_lost:
                self._broker_lost = False
                log.info("the broker at %s answers again", self.settings.broker)
            for ready in self._fetcher.arrived(message):
                self._handle(ready)
            if self._exit_code is ExitCode.PROTOCOL_MISMATCH:   # refused: nothing more is read
                return

    def _handle(self, message) -> None:
        """One message of the broker's, in the order they came."""
        kind = type(message)
        if kind is Assign:
            for assignment in message.models:
                self._assign(assignment)
            for scaled in message.scale:
                self._assign(scaled.assignment, count=scaled.count)
            if message.complete:
                self._stop_unadopted()
        elif kind is Scale:
            self._assign(message.assignment, count=message.count, stop=message.stop)
        elif kind is Unassign:
            for load in message.models:
                self._unassign(load.epoch, load.instances)
        elif kind is Heartbeat:
            if self._broker_boot is not None and message.boot != self._broker_boot:
                self._register_again("the broker restarted")
            self._broker_boot = message.boot
            self._broker_interval = message.heartbeat_s or 0.0
            self._fetcher.broker_is(message.boot)
        elif kind is Reset:
            # RESETs queued before this host's last HELLO was answered are stale.
            if self._broker_boot is not None:
                self._register_again("the broker does not know this host")
            self._fetcher.broker_is(message.boot)   # (a restarted broker says so with a reset)
        elif kind is Drained:
            log.info("the broker moved all work away from this host")
            self._running = False
        elif kind is LogSettings:
            self._log_settings = message.settings   # instances started from now on log so too
            logs.apply_wire(self._log_settings)
        elif kind is Refused:
            log.error("the broker refused this agent: %s", message.reason)
            self._running = False
            self._exit_code = ExitCode.PROTOCOL_MISMATCH

    def _report_host(self) -> None:
        now = time.monotonic()
        if now < self._next_metrics:
            return
        self._next_metrics = now + self.settings.metrics_interval_s
        self._send(HostMetrics(host_name(), **self._sampler.sample()))

    # -- starting instances -------------------------------------------------------------

    def _assign(self, assignment: Assignment, count: int | None = None, stop: tuple[str, ...] = ()) -> None:
        """Start a model version's instances: its instance groups, or ``count`` when the broker scales it."""
        model, version, epoch = assignment.model, assignment.version, assignment.epoch
        placed = partial(Placed, model, version, epoch, self._broker_boot, update=assignment.update)
        running = [child for child in self.children
                   if child.epoch == epoch and child.wanted and child.iid not in self._adoptable]
        if running and count is None and not assignment.update:
            return  # already serving this load (the broker re-sent its assignments)
        if self._drain_deadline is not None:
            self._send(placed(error=Unavailable(f"host {host_name()} is draining")))
            return
        try:
            model_dir = self._model_dir(assignment)
            config = self._host_config(assignment.config)
            plans = plan_instances(config) if count is None else plan_scaled(config, count, self.settings.gpus)
            if count is None and all(plan.passive for plan in plans):   # none, or none taking requests
                raise ModelLoadError(model, f"model '{model}' has no instance to start on this host")
        except (ModelLoadError, json_format.ParseError, OSError) as exc:
            message = getattr(exc, "message", str(exc))
            log.error("cannot place model %s version %d: %s", model, version, message)
            self._send(placed(error=InternalError(message)))
            return
        if running and count is None:
            self._update_groups(assignment, model_dir, config, plans, running)
            return
        adopted = self._adopt(assignment, config, plans if count is None else None)
        if count is None:
            new_plans = [plan for plan in plans if plan.key not in {c.plan.key for c in adopted}]
        else:
            new_plans = self._rescale(running + adopted, count, stop, config)
            adopted = [c for c in adopted if c.wanted]
        config_json = config_to_json_dict(config)
        children = [Child(plan, model, version, epoch, self._spec(model, version, epoch, model_dir, config_json, plan),
                          identity=assignment.identity or "", scaled=count is not None)
                    for plan in new_plans]
        self._send(placed(instances=[c.plan.key for c in [*adopted, *children]],
                          adopted={c.plan.key: c.iid for c in adopted}))
        for child in children:
            self.children.append(child)
            self._start(child)

    def _host_config(self, config_json: dict) -> ModelConfig:
        """A load's host-independent config with its instance groups resolved for this host."""
        config = ModelConfig()
        json_format.ParseDict(config_json, config)
        resolve_instance_groups(config, self.settings.gpus)
        return config

    def _update_groups(self, assignment: Assignment, model_dir: Path, config: ModelConfig,
                       plans: list[InstancePlan], running: list[Child]) -> None:
        """New instance groups for a serving load, as Triton updates them in place: the running
        instances they match go on as they run (their names kept), the others are started; those
        left over are listed as leaving, and the broker stops them once their work is done."""
        signatures = [(child, plan_signature(self._host_config(child.spec["config"]), child.plan), child.plan.key)
                      for child in running]
        update = update_instance_groups(config, plans, signatures)
        config_json = config_to_json_dict(config)
        for child, plan in update.kept:   # (started again from the new config, should it die)
            child.plan = replace(plan, name=child.plan.name, key=child.plan.key)
            child.spec = dict(child.spec, config=config_json, group=plan.group)
            child.identity = assignment.identity or ""
        model, version, epoch = assignment.model, assignment.version, assignment.epoch
        children = [Child(plan, model, version, epoch, self._spec(model, version, epoch, model_dir, config_json, plan),
                          identity=assignment.identity or "") for plan in update.new]
        log.info("model %s version %d: instance groups updated: %d kept, %d to start, %d leaving", model, version,
                 len(update.kept), len(children), len(update.leaving))
        self._send(Placed(model, version, epoch, self._broker_boot, update=True,
                          instances=[child.plan.key for child, _ in update.kept] + [c.plan.key for c in children],
                          kept=[child.plan.key for child, _ in update.kept],
                          leaving=[child.plan.key for child in update.leaving]))
        for child in children:
            self.children.append(child)
            self._start(child)

    def _adopt(self, assignment: Assignment, config: ModelConfig, plans: list[InstancePlan] | None) -> list[Child]:
        """The running instances the broker offered for this load that its plan (when given) names,
        with the settings of the plan's group (after an in-place update, a kept instance's name may
        be another group's)."""
        offered = set(assignment.adopt)
        wanted = None if plans is None else {plan.key: plan_signature(config, plan) for plan in plans}
        adopted = []
        for iid in sorted(offered & set(self._adoptable)):
            child = self._adoptable[iid]
            if child.identity != assignment.identity or child.model != assignment.model \
                    or child.version != assignment.version:
                continue
            if wanted is not None:
                if wanted.get(child.plan.key) != plan_signature(self._host_config(child.spec["config"]), child.plan):
                    continue
                del wanted[child.plan.key]   # one instance per plan
            del self._adoptable[iid]
            assert child.process is not None   # an offered instance runs (_reap withdraws one that ended)
            child.adopted(assignment.epoch, self._broker_boot)
            adopted.append(child)
            log.info("kept running instance %s of %s version %d (pid %d) for the new broker", child.plan.key,
                     child.model, child.version, child.process.pid)
        return adopted

    def _stop_unadopted(self) -> None:
        """The new broker has said what it wants: the instances it did not keep stop."""
        for child in self._adoptable.values():
            log.info("stopping instance %s of %s version %d: the new broker does not keep it", child.plan.key,
                     child.model, child.version)
            self._stop_child(child)
        self._adoptable = {}

    def _rescale(self, running: list[Child], count: int, stop: tuple[str, ...], config: ModelConfig) -> list:
        """Match ``count`` instances: stop those named (or the last ones), plan new ones under free names."""
        keep: list[Child] = []
        for child in sorted(running, key=lambda c: c.plan.key):
            if child.plan.key in stop or len(keep) >= count:
                self._stop_child(child)
            else:
                keep.append(child)
        taken = {child.plan.key for child in running}   # a stopping instance's name is not reused yet
        free = [plan for plan in plan_scaled(config, count + len(running), self.settings.gpus)
                if plan.key not in taken]
        return free[:max(0, count - len(keep))]

    def _spec(self, model: str, version: int, epoch: int, model_dir: Path, config_json: dict,
              plan: InstancePlan) -> dict:
        return {"broker": self.settings.broker, "agent": self.identity, "model": model,
                "version": version, "epoch": epoch, "model_dir": str(model_dir), "config": config_json,
                "name": plan.name, "key": plan.key, "kind": plan.kind,
                "device_id": plan.device_id, "group": plan.group, "passive": plan.passive,
                "credit": self.settings.credit,
                "log_verbose": self.settings.log_verbose,
                "log_file": self.settings.log_file,
                "heartbeat_interval_s": self.settings.heartbeat_interval_s,
                "exit_timeout_s": self.settings.exit_timeout_s,
                "tensor_pool_bytes": self.settings.tensor_pool_bytes,
                "boot": self._broker_boot,
                "backend_directory": self.settings.backend_directory,
                "backend_config": self.settings.backend_config,
                "curve": self.settings.curve.as_spec() if self.settings.curve else None}

    def _model_dir(self, assignment: Assignment) -> Path:
        """The repository's folder (a bucket repository's: the snapshot its load was fetched into),
        or one holding the files a load request shipped."""
        model = assignment.model
        if assignment.files:
            return write_files(self._shipped / str(assignment.epoch), model, assignment.files)
        problem = name_problem(model)
        if problem is not None:
            raise ModelLoadError(str(model), f"cannot place model '{model}': {problem}")
        try:
            snapshot = self._fetcher.model_dir(assignment)
        except LookupError as exc:
            raise ModelLoadError(model, f"cannot fetch model '{model}': {exc.args[0]}") from None
        if snapshot is not None:
            return snapshot
        for root in self._fetcher.roots:
            candidate = root / model
            if candidate.is_dir():
                return candidate
        raise ModelLoadError(model, f"model '{model}' is not in this host's model repositories "
                             f"({', '.join(self.settings.model_repositories)})")

    def _start(self, child: Child) -> None:
        child.incarnation += 1
        self._starts += 1   # unique for the agent's life, across broker restarts that reuse epoch numbers
        child.iid = (f"{self.identity}/{child.model}/{child.version}/{child.epoch}/{child.plan.key}/"
                     f"{self._starts}")
        spec = dict(child.spec, iid=child.iid, log_settings=self._log_settings)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        env["TRITIUM_INSTANCE_NAME"] = child.plan.name
        env["TRITIUM_AGENT_PID"] = str(os.getpid())
        env["TRITIUM_MODEL"] = f"{child.model}/{child.version}"
        if child.plan.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(child.plan.gpu)
        # A process group of its own, as serve's children have (see tritium/supervisor.py): a signal
        # to the agent's group (Ctrl-C) reaches the agent alone, which stops its instances after their batch.
        # The instance writes here why it ends for good (it could not initialize, the broker refused
        # it): an exit status alone could as well come from its model's code, which is restarted.
        final_read, final_write = os.pipe()
        spec["final_fd"] = final_write
        try:
            child.process = subprocess.Popen(
                [sys.executable, "-m", "tritium.workers.instance", child.iid], stdin=subprocess.PIPE, env=env,
                pass_fds=(final_write,), **own_process_group())
        except BaseException:
            os.close(final_read)
            raise
        finally:
            os.close(final_write)
        os.set_blocking(final_read, False)
        child.final_word = final_read
        stdin = child.process.stdin
        assert stdin is not None   # (stdin=PIPE)
        stdin.write(json.dumps(spec).encode())
        stdin.close()
        child.started_at = time.monotonic()
        child.restart_at = None
        child.kill_at = None
        log.info("started instance %s of %s version %d (pid %d)", child.plan.key, child.model,
                 child.version, child.process.pid)

    # -- supervision --------------------------------------------------------------------

    def _reap(self) -> None:
        for child in list(self.children):
            if child.process is None:
                continue
            code = child.process.poll()
            if code is None:
                continue
            _end_its_group(child.process.pid)
            child.process = None
            final = _final_word(child)
            why = f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}"
            if self._adoptable.pop(child.iid, None) is not None:
                child.wanted = False   # it belonged to the previous broker: the new one starts its own
            self._send(InstanceExited(child.iid, why, code, child.epoch, child.plan.key, not child.wanted,
                                      child.spec.get("boot"), final=bool(final)))
            if not child.wanted or not self._running or self._drain_deadline is not None:
                self.children.remove(child)
                continue
            if final:
                log.error("instance %s of %s %s; not restarting it", child.plan.key, child.model, final)
                self.children.remove(child)
                continue
            if time.monotonic() - child.started_at >= _HEALTHY_AFTER_S:
                child.backoff_s = _BACKOFF_START_S
            child.restart_at = time.monotonic() + child.backoff_s
            log.warning("instance %s of %s %s; restarting in %.0f s", child.plan.key, child.model,
                        why, child.backoff_s)
            child.backoff_s = min(child.backoff_s * 2, _BACKOFF_MAX_S)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.process is None and child.restart_at is not None and child.restart_at <= now:
                self._start(child)

    def _stop_child(self, child: Child) -> None:
        child.wanted = False
        child.restart_at = None
        if child.process is not None and child.kill_at is None:   # (a second SIGTERM is "exit now")
            child.process.terminate()
            child.kill_at = time.monotonic() + self.settings.exit_timeout_s   # if SIGTERM is not enough

    def _kill_overdue(self) -> None:
        """An instance that ignores SIGTERM (stuck in a model call) must not hold its GPU forever."""
        now = time.monotonic()
        for child in self.children:
            if child.process is not None and child.kill_at is not None and now >= child.kill_at:
                log.warning("instance %s of %s did not stop within %.0f s; killing it", child.plan.key,
                            child.model, self.settings.exit_timeout_s)
                child.process.kill()
                child.kill_at = None

    def _unassign(self, epoch: int, keys: tuple[str, ...] = ()) -> None:
        """Stop a load's instances: all of them, or those ``keys`` name (an update's leaving ones)."""
        for child in self.children:
            if child.epoch == epoch and child.iid not in self._adoptable \
                    and (not keys or child.plan.key in keys):   # (epochs are per broker process)
                self._stop_child(child)
        self.children = [c for c in self.children if c.wanted or c.process is not None]
        if not keys:   # (the load's shipped files, or its snapshot, go with the whole load)
            shutil.rmtree(self._shipped / str(epoch), ignore_errors=True)
            self._fetcher.release(epoch)

    def _shutdown(self) -> None:
        log.info("worker agent stopping %d instance(s)", len(self.children))
        live = [(c, c.process) for c in self.children if c.process is not None]
        for child, process in live:
            child.wanted = False
            if child.kill_at is None:   # (a second SIGTERM tells an instance to exit at once)
                process.terminate()
        deadline = time.monotonic() + self.settings.exit_timeout_s
        for _, process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._reap()   # tells the broker each one is gone, so that nothing waits for them
        shutil.rmtree(self._shipped, ignore_errors=True)
        self._fetcher.close()
        self.sock.close(linger=1000)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): its state in ``/proc`` (Linux; elsewhere
    a process is taken as running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _end_its_group(pid: int) -> None:
    """What an instance that ended left of its own (it leads a process group: processes its model
    started, which no terminal signal reaches any more) ends with it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _final_word(child: Child) -> str:
    """Why the instance that just exited ended for good, in its own words; "" when it did not say
    (a crash, or its model ended the process): it is then started again."""
    if child.final_word is None:
        return ""
    try:
        return os.read(child.final_word, 4096).decode(errors="replace")
    except BlockingIOError:
        return ""
    finally:
        os.close(child.final_word)
        child.final_word = None
