"""Polling before sleeping (--broker-spin-us, --gateway-spin-us): answers come back right with the
defaults and with long polling, and a server left idle does not poll (tests/broker/test_broker_polling.py
has the broker's rules: only while instances run a single request, never past a batching deadline)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.models import add_sub_inputs, add_sub_model
from tests.servers import TritiumServer, descendants

LONG_SPIN_US = 50_000


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub")
    return repo


@pytest.fixture(scope="module")
def default_server(repo):
    with TritiumServer(repo) as running:
        yield running


@pytest.fixture(scope="module")
def long_spin_server(repo):
    with TritiumServer(repo, f"--broker-spin-us={LONG_SPIN_US}", f"--gateway-spin-us={LONG_SPIN_US}") as running:
        yield running


def _inputs(module, seed: int):
    a, b = (np.random.default_rng(seed + i).standard_normal((1, 16)).astype(np.float32) for i in range(2))
    return add_sub_inputs(a, b, module), a, b


@pytest.mark.parametrize("which", ["default_server", "long_spin_server"])
def test_answers_over_http_and_grpc_are_right(which, request):
    server = request.getfixturevalue(which)
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for seed in range(10):
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            inputs, a, b = _inputs(module, seed)
            result = client.infer("add_sub", inputs)
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
            np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def _role_pids(server: TritiumServer, marker: bytes) -> list[int]:
    """The server's processes whose command line holds ``marker``."""
    found = []
    for pid in descendants(server.process.pid):
        try:
            if marker in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])   # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def test_an_idle_server_stops_polling(default_server):
    """After its last request, neither the broker nor the gateway keeps the CPU busy."""
    client = httpclient.InferenceServerClient(default_server.url)
    for seed in range(20):
        client.infer("add_sub", _inputs(httpclient, seed)[0])
    pids = _role_pids(default_server, b"cli\x00broker") + _role_pids(default_server, b"cli\x00gateway")
    assert len(pids) == 2
    time.sleep(0.5)
    before = _cpu_seconds(pids)
    time.sleep(2.0)
    assert _cpu_seconds(pids) - before < 0.2   # polling without end would be about 2 s of each
