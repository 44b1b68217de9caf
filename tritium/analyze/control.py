"""The server tritium analyze works with: the user's (explicit model control) or one it starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tritium.perf.client import server_message
from tritium.perf.errors import PerfError, ServerUnreachable, UnknownModel

LOAD_TIMEOUT_S = 600.0


class ModelControl:
    """Loads config variants through the repository API (HTTP) and reads configs back."""

    def __init__(self, url: str) -> None:
        import tritonclient.http as http

        self.url = url
        self.client = http.InferenceServerClient(url, connection_timeout=LOAD_TIMEOUT_S,
                                                 network_timeout=LOAD_TIMEOUT_S)

    def check(self, model: str) -> dict:
        """The model's config; a stopped server, an unknown model or a non-explicit mode fail here."""
        try:
            self.client.is_server_live()
        except Exception as exc:
            raise ServerUnreachable(f"http://{self.url}", server_message(exc)) from None
        try:
            if not self.client.is_model_ready(model):
                self.client.load_model(model)
            return self.client.get_model_config(model)
        except Exception as exc:
            message = server_message(exc)
            if "polling is enabled" in message:
                raise PerfError(f"the server at {self.url} does not take loads: start it with "
                                f"--model-control-mode=explicit ({message})") from None
            raise UnknownModel(model, message) from None

    def config(self, model: str) -> dict:
        return self.client.get_model_config(model)

    def load(self, model: str, config: dict | None = None) -> str | None:
        """Load ``model`` with ``config`` (None: as in the repository); the server's error, if any."""
        try:
            self.client.load_model(model, config=json.dumps(config) if config is not None else None)
        except Exception as exc:
            return server_message(exc)
        return None

    def close(self) -> None:
        self.client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OwnServer:
    """``tritium serve`` in explicit mode on free local ports, for as long as the analysis runs."""

    def __init__(self, repository: str, models: list[str], ready_timeout_s: float = 120.0) -> None:
        self.http_port, self.grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="tritium-analyze-serve-", suffix=".log", delete=False)
        command = [sys.executable, "-m", "tritium.cli", "serve", "--model-repository", repository,
                   "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
                   "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port),
                   "--http-workers", "1", "--model-control-mode", "explicit",
                   *[arg for model in models for arg in ("--load-model", model)]]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        self._wait(ready_timeout_s)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        output = self.process.stdout
        assert output is not None   # the server was started with stdout=PIPE, so the pipe exists
        os.set_blocking(output.fileno(), False)
        seen = b""
        while time.monotonic() < deadline:
            seen += output.read() or b""
            if b"tritium ready" in seen:
                return
            if self.process.poll() is not None:
                tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-1:]
                raise PerfError(f"the tritium server analyze started exited: {' '.join(tail)} "
                                f"(log: {self.log.name})")
            time.sleep(0.1)
        self.stop()
        raise PerfError(f"the tritium server analyze started was not ready in {timeout_s:.0f} s "
                        f"(log: {self.log.name})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
