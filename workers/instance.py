"""The instance process: one model instance, one backend, one DEALER socket to the broker.

Started by the host agent as ``python -m tritium.workers.instance <iid>`` with its spec as JSON
on stdin. It initializes the model, says HELLO (granting credit), then executes every
BATCH it receives. If initialization fails it reports INSTANCE_FAILED, tells the agent not to
start it again and exits with ``ExitCode.INIT_FAILED``.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import zmq
from google.protobuf import json_format

from tritium.repo import ModelConfig
from tritium import logs
from tritium.gctune import tune_for_serving
from tritium.errors import InternalError, TritiumError
from tritium.exit_codes import ExitCode
from tritium.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    HEARTBEAT_SUFFIX,
    MISSED_HEARTBEATS,
    PROTOCOL_VERSION,
    Batch,
    CancelRunning,
    Heartbeat,
    Hello,
    InstanceFailed,
    InstanceHealth,
    LogSettings,
    MetricsAsk,
    Refused,
    Reset,
    ProtocolError,
    Role,
    read_record,
)
from tritium.lifetime import die_with_parent
from tritium.pb_utils.metrics import SERIES as CUSTOM_METRICS
from tritium.pb_utils.types import runtime
from tritium.links import LinkSocket, connect_dealer
from tritium.zmtp import PoolUse, ZmtpDealer
from tritium.security import CurveKeys, secure_client
from tritium.shared_pool import DEFAULT_POOL_BYTES, AnswerSlots, answer_slots
from tritium.workers.backends import load_backend
from tritium.workers.backends.base import BackendConfig, InstanceContext, ModelContext
from tritium.workers.executor import BatchExecutor
from tritium.workers.sequence_state import SequenceInputs
from tritium.workers.warmup import WarmupFailed, warm_up

log = logging.getLogger(__name__)

# How much longer than its agent's exit timeout a stopping instance may take: its agent kills it
# at that timeout, so only an instance whose agent is gone waits this long.
FINALIZE_GRACE_S = 5.0

_LINGER_S = 2.0   # how long a failing instance tries to deliver the message that says why
_STOP_CHECK_S = 0.25   # how soon the heartbeat thread notices it is to stop
_POOL_REPORT_S = 1.0   # how often the main thread refreshes the figures of its pool for the heartbeats
_SEND_WAIT_S = 0.05    # a model's thread waits this long for the main thread's send, then queues its message


class Outbox:
    """Sends on the instance's socket from any thread.

    Whoever uses the socket holds ``_lock``: the main thread all the time, but while the model
    runs (``model_runs``). A decoupled model may answer from threads of its own: while its
    ``execute`` runs (a model waiting for its threads to finish, say) they send at once, as
    Triton's stub does; at other times their messages are queued and the main loop, woken
    through a socket pair, sends them. On a local link each large output is placed in the
    instance's pool as it is sent (``answers``; tritium/shared_pool.py).
    """

    def __init__(self, sock: LinkSocket, answers: AnswerSlots | None = None) -> None:
        self.sock = sock
        self.answers = answers
        # The figures of the answer pool and of the model's BLS calls' pool, refreshed by the main
        # thread (which owns the answer pool) and read by the heartbeat thread, which carries them
        # to the broker's /metrics.
        self.pools: list | None = None
        self._next_report = 0.0
        self.main_thread = threading.get_ident()
        self.queue: deque[list] = deque()
        self.wake_read, self._wake_write = socket.socketpair()
        self.wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._lock = threading.RLock()
        self._lock.acquire()   # by the main thread, which makes the outbox
        self._model_running = False

    def send(self, parts: list) -> None:
        if threading.get_ident() == self.main_thread:
            with self._lock:
                self._drain()   # what the model's threads queued goes first
                self._send_now(parts)
            return
        # While the model runs, the main thread takes the lock only to send; at other times it
        # holds it, and the message waits for the main loop.
        if self._lock.acquire(timeout=_SEND_WAIT_S) if self._model_running else self._lock.acquire(blocking=False):
            try:
                self._drain()
                self._send_now(parts)
            finally:
                self._lock.release()
            return
        self.queue.append(parts)
        try:
            self._wake_write.send(b"\0")
        except BlockingIOError:
            pass  # already woken
        # The model may have begun to run since the lock was refused: then nothing would send the
        # message before the batch ends.
        if self._model_running and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def model_runs(self) -> None:
        """The main thread lets go of the socket while the model runs (it sends with the lock then,
        as the model's threads do), until ``model_ran``."""
        self._drain()
        self._model_running = True
        self._lock.release()

    def model_ran(self) -> None:
        self._model_running = False   # first: a thread sending now queues its message, not waits
        self._lock.acquire()

    def flush(self) -> None:
        try:
            self.wake_read.recv(4096)
        except BlockingIOError:
            pass
        self._drain()

    def _drain(self) -> None:
        while self.queue:
            self._send_now(self.queue.popleft())

    def _send_now(self, parts: list) -> None:
        self.sock.send_parts(parts if self.answers is None else self.answers.place(parts))

    def report_pools(self, now: float) -> None:
        if now < self._next_report:
            return
        self._next_report = now + _POOL_REPORT_S
        pools = [] if self.answers is None else [("answer", *self.answers.usage())]
        bls = runtime.bls   # a Python model's client for its BLS calls, once it has made one
        if bls is not None and (usage := bls.pool_usage()) is not None:
            pools.append(("bls", *usage))
        self.pools = pools or None


def _signals_as_a_plain_process() -> None:
    """A process the model forks (a multiprocessing pool's worker) is not this instance: SIGTERM ends
    it, as a pool's terminate() expects, instead of asking it to stop serving."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def broker_restarted(reset: Reset, interval_s: float) -> None:
    """A RESET came: the BLS calls in flight to the broker process that is gone get their errors
    (a model blocked on one would otherwise never return, and its instance never rejoin); those
    the new process got wait for its answers (workers/bls.py)."""
    bls = runtime.bls
    if bls is not None:
        bls.broker_restarted(reset.boot, MISSED_HEARTBEATS * interval_s)


def bls_tick() -> None:
    """Every heartbeat interval: a new broker process that did not say which BLS calls it got."""
    bls = runtime.bls
    if bls is not None:
        bls.tick()


class HeartbeatThread(threading.Thread):
    """Tells the broker this instance lives, on a socket of its own, even while a batch runs;
    and hears on it which running requests their clients cancelled.

    The main thread owns the data socket and blocks in ``execute``; this thread needs the
    GIL only for a moment each interval (backends release it while computing). The broker
    sends each CANCEL_RUNNING here as well as on the data socket, so that a model streaming
    from inside its execute sees ``is_cancelled()`` at once; one that overtakes its batch
    finds nothing here and is applied by the main loop, which reads it after the batch. It
    sends a RESET here too while the main thread does not answer it (``on_reset``): a model
    waiting in execute for a BLS call the previous broker process held is answered that way.
    """

    def __init__(self, broker: str, iid: str, interval_s: float, curve: CurveKeys | None = None,
                 agent: str = "", on_cancel: Callable[[int, int], None] | None = None,
                 pools: Callable[[], list | None] = lambda: None,
                 on_reset: Callable[[Reset], None] | None = None,
                 on_beat: Callable[[], None] = lambda: None,
                 custom_metrics: Callable[[], list | None] = lambda: None) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.broker, self.iid, self.interval_s, self.curve, self.agent = broker, iid, interval_s, curve, agent
        self.on_cancel = on_cancel
        self.on_reset = on_reset
        self.on_beat = on_beat
        self.pools = pools
        self.custom_metrics = custom_metrics
        self._metrics_failed = False   # logged once
        self.stopped = threading.Event()

    def run(self) -> None:
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        secure_client(sock, self.curve, "instance")
        sock.setsockopt(zmq.IDENTITY, self.iid.encode() + HEARTBEAT_SUFFIX)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)   # beats that cannot leave are worthless later
        sock.connect(self.broker)
        next_beat = time.monotonic() + self.interval_s
        try:
            while not self.stopped.is_set():
                wait_s = next_beat - time.monotonic()
                if wait_s > 0:
                    if sock.poll(int(min(wait_s, _STOP_CHECK_S) * 1000) + 1, zmq.POLLIN):
                        self._read(sock)
                    continue
                next_beat += self.interval_s
                try:
                    sock.send(self._beat(), zmq.NOBLOCK)
                except zmq.Again:
                    pass
                try:   # a failure here must not end the thread: the instance would look dead
                    self.on_beat()
                except Exception:
                    log.exception("the heartbeat's periodic work failed")
        finally:
            sock.close(0)
            context.term()

    def _beat(self, metrics_for: int | None = None) -> bytes:
        """This interval's heartbeat (or the answer to METRICS_ASK ``metrics_for``). Figures that
        cannot be read or sent cost only themselves: the instance must not look dead for them."""
        try:
            return Heartbeat(heartbeat_s=self.interval_s, iid=self.iid, agent=self.agent, joined=True,
                             pools=self.pools(), custom_metrics=self.custom_metrics(),
                             metrics_for=metrics_for).encode()
        except Exception:
            if not self._metrics_failed:
                self._metrics_failed = True
                log.exception("the figures of this instance's pools or its model's custom metrics cannot be sent "
                              "to the broker")
            return Heartbeat(heartbeat_s=self.interval_s, iid=self.iid, agent=self.agent, joined=True).encode()

    def _read(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = read_record(frames[0])[0]
            except ProtocolError as exc:
                log.warning("unreadable message on the heartbeat socket: %s", exc)
                continue
            try:   # a failure here must not end the thread: the instance would look dead
                if type(message) is CancelRunning and self.on_cancel is not None:
                    self.on_cancel(message.batch, message.index)
                elif type(message) is MetricsAsk:   # a /metrics scrape: its model's custom metrics, now
                    try:
                        sock.send(self._beat(message.number), zmq.NOBLOCK)
                    except zmq.Again:   # (the scrape shows the last beat's figures)
                        pass
                elif type(message) is Reset and self.on_reset is not None:
                    self.on_reset(message)
            except Exception:
                log.exception("handling a %s on the heartbeat socket failed", type(message).__name__)


class HealthReporter:
    """Asks the instance whether it can serve, every few seconds, from a thread of its own: a
    slow ``is_ready()`` holds up neither batches nor the messages the main loop sends. The main
    loop tells the broker of changes (``check``); an answer still awaited after ``TIMEOUT_S``
    counts as not ready meanwhile, as Triton's backend waits 5 s for it."""

    INTERVAL_S = 2.0
    TIMEOUT_S = 5.0

    def __init__(self, instance, outbox: Outbox) -> None:
        self.instance = instance
        self.outbox = outbox
        self.reported = True   # what the broker assumes of a new instance
        self._answer = True    # the last answer; written by the asking thread only
        self._asked_at: float | None = None   # when the call in progress began
        self._timed_out = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._ask_until_stopped, name="is-ready", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more questions: the instance is finalizing (its model may not be asked then). Waits
        a while for a question in progress."""
        self._stopping.set()
        self._thread.join(self.TIMEOUT_S)

    def _ask_until_stopped(self) -> None:
        while not self._stopping.is_set():
            self._asked_at = time.monotonic()
            try:
                ready = bool(self.instance.is_ready())
            except BaseException as exc:   # SystemExit or a cancelled coroutine too: the thread goes on
                log.error("is_ready() failed; the instance counts as not ready: %s: %s", type(exc).__name__, exc)
                ready = False
            self._answer, self._asked_at = ready, None
            self._stopping.wait(self.INTERVAL_S)

    def check(self) -> None:
        """Called by the main loop each turn: the broker hears of a change."""
        asked_at = self._asked_at
        ready = self._answer
        if asked_at is not None and time.monotonic() - asked_at > self.TIMEOUT_S:
            if not self._timed_out:
                log.error("Timed out waiting for user-defined is_ready() response; the instance counts as "
                          "not ready until it answers")
            self._timed_out = True
            ready = False
        elif asked_at is None:
            self._timed_out = False
        if ready != self.reported:
            self.reported = ready
            self.outbox.send([InstanceHealth(ready).encode()])


def build_executor(spec: dict, outbox: Outbox | None = None) -> tuple[BatchExecutor, list]:
    """The executor, and what to finalize at the end: instance, model, backend, in that order."""
    config = ModelConfig()
    json_format.ParseDict(spec["config"], config)
    model_context = ModelContext(name=spec["model"], version=spec["version"],
                                 model_dir=Path(spec["model_dir"]), config=config,
                                 config_json=spec["config"])
    directory = spec.get("backend_directory")
    backend = load_backend(config.backend, model_context.version_dir, model_context.model_dir, BackendConfig(
        name=config.backend, backend_directory=Path(directory) if directory else None,
        options=spec.get("backend_config", {}).get(config.backend, {})))
    model = backend.create_model(model_context)
    instance = model.create_instance(InstanceContext(
        model=model_context, name=spec["name"], kind=spec["kind"], device_id=spec["device_id"],
        broker=spec.get("broker", ""), instance_id=spec.get("iid", ""),
        curve=CurveKeys.from_spec(spec.get("curve"))))
    return BatchExecutor(instance, config, outbox.send if outbox else None, model_context.model_dir), \
        [instance, model, backend]


def main() -> None:
    # The agent's pid as the agent gave it: were it gone before this line, getppid() would name
    # whoever adopted the process, and the instance would serve on with no agent.
    agent = int(os.environ.get("TRITIUM_AGENT_PID", os.getppid()))
    die_with_parent(agent)   # if the agent is gone already, this exits
    # Its own process group is not a terminal's foreground one: with `stty tostop` a log line to the
    # agent's terminal would stop it (an agent run by hand; serve's children ignore the signal already).
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    spec = json.loads(sys.stdin.read())
    final_fd = spec.get("final_fd")   # where it tells its agent why it ends for good
    if final_fd is not None:
        os.set_inheritable(final_fd, False)   # not for the programs its model may start
    logs.configure(f"instance:{spec['model']}:{spec['key']}", spec.get("log_verbose", 0), spec.get("log_file"))
    if spec.get("log_settings"):
        logs.apply_wire(spec["log_settings"])
    curve = CurveKeys.from_spec(spec.get("curve"))
    context = zmq.Context()
    sock = connect_dealer(spec["broker"], spec["iid"], curve, "instance", context=context, pools=PoolUse.COPY)
    # The load it serves, of which broker process: a new broker process that keeps it changes both.
    load = {"epoch": spec.get("epoch", 0), "boot": spec.get("boot")}

    def failed(why: str) -> bytes:
        return InstanceFailed(spec["model"], spec["version"], load["epoch"], spec["key"], load["boot"], spec["agent"],
                              spec.get("kind", "CPU"), spec.get("heartbeat_interval_s", 1.0),
                              InternalError(why)).encode()

    pool_bytes = spec.get("tensor_pool_bytes", DEFAULT_POOL_BYTES)
    outbox = Outbox(sock, answer_slots(pool_bytes) if pool_bytes and isinstance(sock, ZmtpDealer) else None)
    try:
        executor, lifecycle = build_executor(spec, outbox)
    except Exception as exc:
        if isinstance(exc, TritiumError):   # tritium's own words (a config it could not apply)
            message = exc.message
        else:
            message = f"{type(exc).__name__}: {exc}" if not str(exc).startswith(type(exc).__name__) else str(exc)
        log.error("initialization failed: %s", message)
        sock.send_parts([failed(message)])
        sock.close(_LINGER_S)
        context.term()
        _end_for_good(final_fd, "failed to initialize", ExitCode.INIT_FAILED)
    try:   # Triton warms up only the instances it schedules on: not a passive group's
        warmed = [] if spec.get("passive") else warm_up(executor, executor.config, Path(spec["model_dir"]))
    except Exception as exc:   # a model that cannot run its warmup is not ready, as in Triton
        message = str(exc) if isinstance(exc, WarmupFailed) else f"warmup failed: {exc}"
        log.error("%s", message)
        sock.send_parts([failed(message)])
        sock.close(_LINGER_S)
        context.term()
        _end_for_good(final_fd, "failed its warmup", ExitCode.INIT_FAILED)
    stopping: list = []
    signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, stopping, agent,
                                                    spec.get("exit_timeout_s", 30.0) + FINALIZE_GRACE_S))
    os.register_at_fork(after_in_child=_signals_as_a_plain_process)
    interval_s = spec.get("heartbeat_interval_s", DEFAULT_HEARTBEAT_INTERVAL_S)

    def hello() -> None:
        sock.send_parts([Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=interval_s,
                        agent=spec["agent"], model=spec["model"], version=spec["version"], epoch=load["epoch"],
                        boot=load["boot"], name=spec["key"], instance_kind=spec.get("kind", "CPU"),
                        credit=spec.get("credit", 2), device=spec.get("device_id", 0),
                        group=spec.get("group", 0), passive=spec.get("passive") or None,
                        warmed=warmed or None).encode()])
        warmed.clear()   # counted once: a HELLO said again (a new broker process) brings none

    def rejoin(reset: Reset) -> None:
        """A new broker process keeps this instance: what the old one bound to it is gone."""
        if (reset.boot, reset.epoch) == (load["boot"], load["epoch"]):
            # The broker says it again until it hears the HELLO (several wait here after a long batch).
            hello()
            return
        load.update(boot=reset.boot, epoch=reset.epoch)
        broker_restarted(reset, interval_s)
        executor.numbered_anew()
        # Slots handed to the old broker process may never be released: a pool of its own for the
        # new one (the old one's memory goes with its last mapping).
        if outbox.answers is not None:
            outbox.answers.renew()
        if executor.sequences is not None:   # its sequences' slots and implicit state
            executor.sequences = SequenceInputs(executor.config, Path(spec["model_dir"]))
        log.info("kept by a new broker process (load %s); saying HELLO again", reset.epoch)
        hello()

    hello()
    log.info("serving model %s version %d as %s", spec["model"], spec["version"], spec["key"])
    heartbeat = HeartbeatThread(spec["broker"], spec["iid"], interval_s, curve,
                                spec["agent"], executor.cancel, lambda: outbox.pools,
                                functools.partial(broker_restarted, interval_s=interval_s), bls_tick,
                                custom_metrics=CUSTOM_METRICS.wire)
    heartbeat.start()
    tune_for_serving()
    try:
        _serve(sock, executor, outbox, stopping, rejoin, final_fd)
    finally:
        heartbeat.stopped.set()
        for part in lifecycle:  # instance, model, backend
            try:
                part.finalize()
            except Exception:
                log.exception("finalize of %s failed", type(part).__name__)
        sock.close()
        context.term()


def _on_sigterm(stopping: list, agent: int, within_s: float, *_) -> None:
    """The first SIGTERM from its agent stops the instance after its batch, its model finalized.
    A second one, one after its agent is gone (the kernel's parent-death signal), or ``within_s``
    running out while the model still finalizes ends the process at once (the last with every
    thread's stack in its log), so that no instance outlives its server."""
    if stopping or os.getppid() != agent:
        os._exit(ExitCode.FORCED)
    stopping.append(True)
    faulthandler.dump_traceback_later(within_s, exit=True)   # a C thread: needs neither the GIL nor a lock


def _end_for_good(fd: int | None, why: str, code: ExitCode) -> NoReturn:
    """Exit, telling the agent first not to start this instance again: it would end the same way."""
    if fd is not None:
        try:
            os.write(fd, why.encode())
        except OSError:   # the agent is gone: nobody to tell
            pass
    sys.exit(code)


def _serve(sock: LinkSocket, executor: BatchExecutor, outbox: Outbox, stopping: list, rejoin,
           final_fd: int | None) -> None:
    """Read and answer the broker's messages until stopped.

    The loop asks the socket whether a message was read and waits, and blocks on its descriptor
    only when none does (right for both kinds of link: a libzmq socket's descriptor is
    edge-triggered, and asking it looks at what arrived; a ZMTP socket's is level-triggered, and
    what arrived unread keeps it readable): a batch costs one wait, one receive and one send,
    without the zero-timeout poll and the failed receive that ``zmq.Poller`` and draining until
    ``zmq.Again`` add to every batch.
    """
    waiter = select.poll()
    waiter.register(sock.fileno(), select.POLLIN)
    wake = outbox.wake_read.fileno()
    waiter.register(wake, select.POLLIN)
    health = HealthReporter(executor.instance, outbox)
    try:
        while not stopping:
            health.check()
            outbox.report_pools(time.monotonic())
            if outbox.queue:   # a model's own threads queued answers: checked every turn, so a busy socket cannot starve them
                outbox.flush()
            if not sock.has_message_read():
                if any(fd == wake for fd, _ in waiter.poll(500)):   # also reads the wake-up, or the poll would spin on it
                    outbox.flush()
                if not sock.has_message():   # reads what woke the wait (or writes what waited for room)
                    continue
            frames = sock.recv_parts()
            message, _, _ = read_record(frames[0])
            if type(message) is Batch:
                outbox.model_runs()
                try:
                    done = executor.run(frames)
                finally:
                    outbox.model_ran()
                if outbox.queue:   # responses the model's threads sent during the batch go before its BATCH_DONE
                    outbox.flush()
                outbox.send(done)
            elif type(message) is CancelRunning:
                executor.cancel(message.batch, message.index)
            elif type(message) is LogSettings:
                logs.apply_wire(message.settings)
            elif type(message) is Refused:   # its agent does not restart it: it would be refused again
                log.error("broker refused this instance: %s", message.reason)
                _end_for_good(final_fd, "was refused by the broker", ExitCode.PROTOCOL_MISMATCH)
            elif type(message) is Reset:
                reset = message
                if reset.epoch is None:
                    log.error("the broker no longer knows this instance; exiting so that the agent restarts it")
                    sys.exit(ExitCode.ERROR)
                rejoin(reset)
    finally:   # the model is not asked is_ready() while it finalizes
        health.stop()


if __name__ == "__main__":
    main()
