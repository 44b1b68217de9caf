"""``tritium serve``: broker, host agent and gateways as child processes of one command.

The parts are the same processes ``tritium broker|worker|gateway`` run on their own;
this module only composes them. Children report readiness over an ``sd_notify``
socket; once every child is ready and the broker has finished its first load, one
line says what is served. A child that dies takes the whole server down (each part
is restartable on its own under systemd, see deploy/systemd), SIGINT/SIGTERM/SIGHUP stop
the children in order: gateways, agent, broker, and SIGTSTP (Ctrl-Z) pauses them all.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import zmq

from tritium.exit_codes import ExitCode
from tritium.lifetime import die_with_parent, stop_with_descendants
from tritium.ports import PortInUse, check_free
from tritium.protocol import Control, ControlReply, StatusQuery, read_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_enabled: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_enabled: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_enabled: bool = True
    metrics_port: int = 8002
    http_workers: int = 1
    reuse_http_port: bool = False   # Triton's --reuse-http-port: other servers may share the port
    reuse_grpc_port: bool = False
    exit_timeout_s: float = 30.0
    exit_on_error: bool = True
    # each child's flags, from the options table (tritium/options.py)
    broker_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    worker_args: tuple[str, ...] = ()
    # TRITIUM_* variables serve has already read: children get their values as flags, and
    # must not read them again under their own meaning (TRITIUM_MODELS is a worker's own setting).
    resolved_env: frozenset[str] = frozenset()


@dataclass(eq=False)
class ChildProcess:
    role: str
    process: subprocess.Popen
    ready: bool = False
    status: str = ""


@dataclass(eq=False)
class Supervisor:
    settings: ServeSettings
    children: list[ChildProcess] = field(default_factory=list)

    def run(self) -> int:
        try:
            self._check_ports()
        except PortInUse as exc:
            log.error("%s", exc)
            return ExitCode.ERROR
        runtime = Path(tempfile.mkdtemp(prefix="tritium-"))
        notify_path = runtime / "notify"
        notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify_sock.bind(str(notify_path))
        notify_sock.settimeout(0.2)
        frontend, backend = f"ipc://{runtime}/frontend", f"ipc://{runtime}/backend"
        stop: list[bool] = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # (SIGHUP: its terminal closed)
            signal.signal(sig, lambda *_: self._on_stop_signal(stop))
        signal.signal(signal.SIGTSTP, lambda *_: self._suspend())
        env = {name: value for name, value in os.environ.items() if name not in self.settings.resolved_env}
        env["NOTIFY_SOCKET"] = str(notify_path)
        try:
            code = self._start_and_wait(env, frontend, backend, notify_sock, stop)
            if code is None:
                code = self._supervise(stop)
        finally:
            self._stop_children()
            notify_sock.close()
            shutil.rmtree(runtime, ignore_errors=True)
        return ExitCode.FORCED if len(stop) > 1 else code

    def _on_stop_signal(self, stop: list[bool]) -> None:
        """The first stop signal stops the children in order (``_stop_children``); a second one
        (Ctrl-C twice) ends them now, without waiting for the requests in flight."""
        stop.append(True)
        if len(stop) == 2:
            log.warning("second stop signal: stopping every process now, without waiting for requests in flight")
            for child in self.children:
                if child.process.poll() is None:
                    child.process.kill()

    def _suspend(self) -> None:
        """Ctrl-Z: every process of the server stops with serve and resumes with it, as Triton's
        stubs do in its process group (the children's own groups keep the terminal's signal
        from them)."""
        stop_with_descendants()

    def _check_ports(self) -> None:
        """A port in use by any other program stops serve before anything starts (its own
        gateways then share theirs with --reuse-port), in Triton's order and words; with
        --reuse-http-port / --reuse-grpc-port, one that other servers share the same way does not."""
        s = self.settings
        if s.grpc_enabled:
            check_free("GRPC", s.grpc_address, s.grpc_port, s.reuse_grpc_port)
        if s.http_enabled:
            check_free("HTTP", s.http_address, s.http_port, s.reuse_http_port)
        if s.metrics_enabled:
            check_free("Metrics", s.metrics_address, s.metrics_port)

    def _spawn(self, role: str, args: list[str], env: dict) -> None:
        command = [sys.executable, "-m", "tritium.cli", role, *args]
        log.debug("starting %s", " ".join(command))
        # A serve killed outright takes its children with it (tritium/lifetime.py). Each child leads a
        # process group of its own: a signal to serve's group (Ctrl-C in a terminal, `kill -- -PGID`)
        # reaches serve alone, which stops the children in order (gateways first, the broker last), so
        # that what was accepted is answered; a child signalled too would drain out of order. Groups,
        # not sessions: a child stopped with serve (Ctrl-Z) whose serve is then killed is in a group
        # that the kernel finds orphaned, and continues (SIGHUP, SIGCONT) to take its parent-death SIGTERM.
        process = subprocess.Popen(command, env=env, preexec_fn=partial(_as_serve_s_child, os.getpid()))
        self.children.append(ChildProcess(role, process))

    def _start_and_wait(self, env, frontend, backend, notify_sock, stop) -> int | None:
        s = self.settings
        self._spawn("broker", ["--frontend", frontend, "--backend", backend, "--workers-on-this-host",
                               *s.broker_args], env)
        if not self._wait_ready(notify_sock, stop, roles={"broker"}):
            return ExitCode.ERROR
        self._spawn("worker", ["--broker", backend, *s.worker_args], env)
        for _ in range(s.http_workers):
            self._spawn("gateway", ["--broker", frontend, *s.gateway_args], env)
        if not self._wait_ready(notify_sock, stop, roles={"worker", "gateway"}):
            return ExitCode.ERROR
        status = self._wait_loaded(frontend, stop)
        if status is None:
            return ExitCode.ERROR
        failures = status["repository_errors"] + status["failures"]
        if failures and self.settings.exit_on_error:
            for failure in failures:
                log.error("%s", failure)
            log.error("failed to load all models")
            return ExitCode.MODEL_LOAD_FAILED
        endpoints = [f"http={s.http_address}:{s.http_port}"] if s.http_enabled else []
        endpoints += [f"grpc={s.grpc_address}:{s.grpc_port}"] if s.grpc_enabled else []
        endpoints += [f"metrics={s.metrics_address}:{s.metrics_port}"] if s.metrics_enabled else []
        print(f"tritium ready: {' '.join(endpoints)} "
              f"(gateways={s.http_workers}, models ready={status['ready']})", flush=True)
        return None

    def _wait_ready(self, notify_sock, stop, roles: set[str]) -> bool:
        pids = {c.process.pid: c for c in self.children}
        while not all(c.ready for c in self.children if c.role in roles):
            if stop or self._dead_child() is not None:
                return False
            try:
                message = notify_sock.recv(4096).decode(errors="replace")
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in message.splitlines() if "=" in line)
            child = pids.get(int(fields.get("MAINPID", -1)))
            if child is not None and fields.get("READY") == "1":
                child.ready, child.status = True, fields.get("STATUS", "")
        return True

    def _wait_loaded(self, frontend: str, stop) -> dict | None:
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(frontend)
        try:
            while not stop and self._dead_child() is None:
                sock.send(Control(1, StatusQuery()).encode())
                if sock.poll(1000):
                    reply, _, _ = read_record(sock.recv())
                    status = reply.result if isinstance(reply, ControlReply) else None
                    if status and status["loading_done"]:
                        return status
                    time.sleep(0.05)
            return None
        finally:
            sock.close(0)

    def _dead_child(self) -> ChildProcess | None:
        for child in self.children:
            if child.process.poll() is not None:
                log.error("%s (pid %d) exited with status %s", child.role, child.process.pid,
                          child.process.returncode)
                return child
        return None

    def _supervise(self, stop) -> int:
        while not stop:
            if self._dead_child() is not None:
                return ExitCode.ERROR
            time.sleep(0.2)
        return ExitCode.OK

    def _stop_children(self) -> None:
        order = {"gateway": 0, "worker": 1, "broker": 2}
        deadline = time.monotonic() + self.settings.exit_timeout_s
        for role in sorted(order, key=lambda role: order[role]):
            group = [c.process for c in self.children if c.role == role and c.process.poll() is None]
            for process in group:
                process.send_signal(signal.SIGTERM)
            for process in group:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s (pid %d) did not stop in time; killing it", role, process.pid)
                    process.kill()
                    process.wait()


def _as_serve_s_child(serve: int) -> None:
    """Run in each child between fork and exec: a process group of its own (see ``_spawn``). That
    group is not the terminal's foreground one: with `stty tostop` its log lines to the terminal
    would stop it (SIGTTOU), where serve's own go out. Ignored, the signal lets them out."""
    die_with_parent(serve)
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
