"""Real tritium servers for end-to-end tests: started as processes, on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tritium.lifetime import descendants

PROJECT_ROOT = Path(__file__).resolve().parent.parent

_LAUNCHER = PROJECT_ROOT / "tests" / "exit_with_test_run.py"


def exiting_with_test_run(command: list[str]) -> list[str]:
    """``command``, run so that the kernel sends it SIGTERM when the test run that started it
    dies, even by SIGKILL (a run stopped by ``timeout``), where no fixture's teardown runs. The
    server then stops as it does on any SIGTERM, children and all.

    The child sets that itself, through a launcher, and not as ``preexec_fn``: a ``preexec_fn``
    makes subprocess fork() where it would vfork(), and in a test run that has used gRPC,
    grpcio's fork handlers restart its poller thread in the child, which aborts the child
    (SIGABRT, "epoll_wait error: Bad file descriptor") when subprocess closes the inherited
    descriptors before exec: measured, 4 starts in 300."""
    return [sys.executable, "-S", str(_LAUNCHER), str(os.getpid()), *command]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_ATTEMPTS = 3


def lost_a_port(output: str, ports: list[int]) -> bool:
    """Whether a server's startup ``output`` says one of ``ports`` (chosen free by the helper) was
    taken by another process between the choice and the bind: worth a start on fresh ports. A
    port a test passed in on purpose is not among them."""
    return any(f":{port}' already in use" in output for port in ports)


class TritiumServer:
    """``tritium serve`` in a child process; ``url`` is host:port for tritonclient."""

    def __init__(self, repository: Path, *extra_args: str, env: dict | None = None,
                 http_workers: int = 1, ready_timeout_s: float = 60.0) -> None:
        self.repository = Path(repository)
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start(repository, extra_args, env, http_workers, ready_timeout_s)
                return
            except RuntimeError as exc:
                # a free port can be taken by another process between its choice and the bind
                chosen = [self.port, self.grpc_port, self.metrics_port]
                if not lost_a_port(str(exc), chosen) or attempt == PORT_ATTEMPTS - 1:
                    raise
                self._log.close()

    def _start(self, repository: Path, extra_args: tuple, env: dict | None, http_workers: int,
               ready_timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.grpc_port = free_port()
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.log_path = Path(tempfile.mkstemp(prefix="tritium-serve-", suffix=".log")[1])
        self.ready_line = None
        command = [sys.executable, "-m", "tritium.cli", "serve", "--model-repository", str(repository),
                   "--http-address", "127.0.0.1", "--http-port", str(self.port),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
                   "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                   "--http-workers", str(http_workers), "--exit-timeout-secs", "10", *extra_args]
        child_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        # TRITIUM_ROOT: serve another checkout's code (a benchmark's earlier build). It must be the
        # working folder too: ``python -m`` puts that first on the path, before PYTHONPATH.
        root = child_env.pop("TRITIUM_ROOT", None) or str(PROJECT_ROOT)
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, child_env.get("PYTHONPATH")]))
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(exiting_with_test_run(command), stdout=subprocess.PIPE, stderr=self._log,
                                        env=child_env, start_new_session=True, cwd=root)
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(self.process.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(b"tritium ready" in line for line in lines):
                self.ready_line = next(line for line in lines if b"tritium ready" in line).decode()
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"tritium serve exited with {self.process.returncode}:\n{self.logs()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tritium serve was not ready within {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def __enter__(self) -> "TritiumServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_serve(repository: Path, *extra_args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``tritium serve`` expecting it to exit by itself (for startup failures). A run that
    failed because another process took one of the ports chosen here (not one a test passed in
    ``extra_args``) between the choice and the bind runs again on fresh ports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    for _ in range(PORT_ATTEMPTS):
        ports = [free_port() for _ in range(3)]
        command = [sys.executable, "-m", "tritium.cli", "serve", "--model-repository", str(repository),
                   "--http-address", "127.0.0.1", "--http-port", str(ports[0]), "--http-workers", "1",
                   "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), *extra_args]
        result = subprocess.run(command, capture_output=True, timeout=timeout_s, env=env)
        if not lost_a_port((result.stdout + result.stderr).decode(errors="replace"), ports):
            return result
    return result


def instance_processes(server: TritiumServer | None = None, marker: bytes = b"tritium.workers.instance") -> list[dict]:
    """Every running tritium instance process (those of ``server`` only, when given): pid, argv
    and environment (read from /proc). Other tests' servers may run on the same machine.
    ``marker``: an argument that names another kind of process (``b"gateway"``)."""
    found = []
    ours = descendants(server.process.pid) if server is not None else set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if marker not in argv:
                continue
            raw_env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in raw_env if b"=" in item)
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(fields[1])
        if server is not None and int(entry.name) not in ours:
            continue
        found.append({"pid": int(entry.name), "ppid": ppid, "argv": [a.decode() for a in argv if a], "env": env})
    return found
