"""The parts of tritium as separate processes, for tests of what happens between them.

``tritium serve`` (tests/servers.py) composes broker, agent and gateways and stops them
all when one dies; the reliability tests need to kill and restart one part and watch
the others cope. Each ``Part`` here is one ``tritium broker|worker|gateway`` process with
its own log file, started with a ``NOTIFY_SOCKET`` of its own so that ``wait_ready`` knows
when it really serves (the sd_notify protocol systemd uses).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import PROJECT_ROOT, exiting_with_test_run, free_port, instance_processes


class Part:
    """One tritium process; ``netns`` runs it inside a network namespace (``ip netns exec``)."""

    def __init__(self, role: str, args: list[str], env: dict | None = None, netns: str | None = None) -> None:
        self.role = role
        self.args = args
        self.extra_env = env or {}
        self.netns = netns
        self.runtime = Path(tempfile.mkdtemp(prefix=f"tritium-{role}-"))
        self.log_path = self.runtime / "log"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        notify_path = self.runtime / "notify"
        notify_path.unlink(missing_ok=True)
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(notify_path))
        env = dict(os.environ, PYTHONUNBUFFERED="1", NOTIFY_SOCKET=str(notify_path), **self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "tritium.cli", self.role, *self.args]
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(exiting_with_test_run(command), stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        self._notify.settimeout(0.2)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.role} exited with {self.process.returncode}:\n{self.logs()}")
            try:
                message = self._notify.recv(4096).decode(errors="replace")
            except TimeoutError:
                continue
            if "READY=1" in message.splitlines():
                return
        raise RuntimeError(f"{self.role} was not ready within {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the process and everything it started (its instances die with it too)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._close()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float = 30.0) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close()
        return code

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.process is None:
            return None
        self.terminate()
        try:
            return self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _close(self) -> None:
        self._notify.close()
        self._log.close()


def tcp(host: str = "127.0.0.1") -> str:
    return f"tcp://{host}:{free_port()}"


def broker(repository: Path, *args: str, frontend: str | None = None, backend: str | None = None,
           netns: str | None = None) -> Part:
    frontend, backend = frontend or tcp(), backend or tcp()
    part = Part("broker", ["--model-repository", str(repository), "--frontend", frontend, "--backend", backend,
                           "--allow-metrics", "false", *args], netns=netns)
    part.frontend, part.backend = frontend, backend
    return part


def worker(backend: str, repository: Path, *args: str, env: dict | None = None, netns: str | None = None) -> Part:
    return Part("worker", ["--broker", backend, "--model-repository", str(repository), *args], env=env,
                netns=netns)


def gateway(frontend: str, *args: str, host: str = "127.0.0.1", netns: str | None = None) -> Part:
    http_port, grpc_port = free_port(), free_port()
    part = Part("gateway", ["--broker", frontend, "--http-address", host, "--http-port", str(http_port),
                            "--grpc-address", host, "--grpc-port", str(grpc_port), *args], netns=netns)
    part.url, part.grpc_url = f"{host}:{http_port}", f"{host}:{grpc_port}"
    return part


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


# -- load through the whoami model (tests/e2e/cluster_repo) ---------------------------------

@dataclass
class Outcome:
    started: float
    ended: float
    pid: int | None = None
    status: str | None = None
    message: str = ""


@dataclass
class Load:
    """Threads sending whoami requests until stopped; every outcome is recorded."""

    url: str
    threads: int = 4
    delay_ms: float = 20.0
    model: str = "whoami"
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]

    def __enter__(self) -> "Load":
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(60)
            assert not worker.is_alive(), "a request was never answered"

    def _run(self) -> None:
        # Closed in this thread: collected in another, the client's gevent pool fails in __del__.
        with httpclient.InferenceServerClient(self.url, network_timeout=30, connection_timeout=30) as client:
            self._send_until_stopped(client)

    def _send_until_stopped(self, client: httpclient.InferenceServerClient) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                pid = int(whoami(client, self.delay_ms, self.model)[0])
                self.outcomes.append(Outcome(started, time.monotonic(), pid=pid))
            except InferenceServerException as exc:
                self.outcomes.append(Outcome(started, time.monotonic(), status=exc.status(), message=exc.message()))
            except Exception as exc:  # connection refused or reset: the gateway itself is gone
                self.outcomes.append(Outcome(started, time.monotonic(), status="connection", message=repr(exc)))
                time.sleep(0.05)

    def since(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.started >= moment]


def whoami(client, delay_ms: float = 0.0, model: str = "whoami") -> np.ndarray:
    delay = httpclient.InferInput("DELAY_MS", [1, 1], "FP32")
    delay.set_data_from_numpy(np.array([[delay_ms]], dtype=np.float32))
    return client.infer(model, [delay]).as_numpy("PID")[:, 0]


def instance_pids(worker: Part, model: str = "whoami") -> set[int]:
    """The pids of the instance processes of ``model`` a worker agent started."""
    return {p["pid"] for p in instance_processes()
            if p["env"].get("TRITIUM_MODEL") == f"{model}/1" and p["ppid"] == worker.pid}


def model_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/whoami/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def served_by(outcomes: list[Outcome]) -> set[int]:
    return {o.pid for o in outcomes if o.pid is not None}


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.pid is None]
