"""tritium serve with several gateways, tritium perf against it, and what each role imports."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests.e2e.rawhttp import request
from tests.models import add_sub_model
from tests.servers import PROJECT_ROOT, TritiumServer, descendants
from tritium.lifetime import process_state


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8, extra="dynamic_batching { }")
    running = TritiumServer(repo, http_workers=2)
    yield running
    assert running.stop() == 0, running.logs()  # SIGTERM stops everything cleanly


def gateway_pids() -> set[int]:
    from pathlib import Path

    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"tritium.cli\0gateway" in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
            except OSError:
                pass
    return pids


def test_ready_line_names_the_port_and_gateways(server):
    assert server.ready_line.startswith(
        f"tritium ready: http=127.0.0.1:{server.port} grpc=127.0.0.1:{server.grpc_port} "
        f"metrics=127.0.0.1:{server.metrics_port} (gateways=2")


def test_two_gateway_processes_share_the_port_and_both_answer(server):
    assert len(gateway_pids()) >= 2
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    statuses = {request(server.url, "POST", "/v2/models/add_sub/infer", body=body)[0] for _ in range(20)}
    assert statuses == {200}
    log = server.logs()
    assert log.count("gateway serving HTTP on 127.0.0.1") == 2


def test_perf_reports_levels_and_writes_perf_analyzer_csv(server, tmp_path):
    out = tmp_path / "perf.csv"
    result = subprocess.run(
        [sys.executable, "-m", "tritium.cli", "perf", "-m", "add_sub", "-u", server.url,
         "--concurrency", "1,4", "--requests", "40", "--warmup", "0", "-f", str(out)],
        capture_output=True, timeout=120, cwd=PROJECT_ROOT)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["concurrency", "infer/s", "p50"]
    assert [line.split()[0] for line in lines[1:3]] == ["1", "4"]
    assert all(line.split()[-1] == "0" for line in lines[1:3])  # no errors
    rows = list(csv.reader(out.open()))
    assert rows[0][:4] == ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv"]
    assert sorted(r[0] for r in rows[1:]) == ["1", "4"]
    assert all(float(r[1]) > 0 for r in rows[1:])


@pytest.mark.parametrize("module", ["tritium.broker.server", "tritium.gateway.server"])
def test_gateway_and_broker_never_import_onnxruntime(module):
    code = f"import sys, {module}; print('onnxruntime' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=PROJECT_ROOT, timeout=60)
    assert result.stdout.decode().split() == ["False", "False"], result.stderr.decode()


def _running(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


@pytest.mark.parametrize("stopped_first", [False, True], ids=["running", "after-ctrl-z"])
def test_a_serve_killed_outright_takes_its_processes_with_it(tmp_path, stopped_first):
    """Also when Ctrl-Z stopped them all first: a stopped process keeps its parent-death SIGTERM
    pending; the kernel continues it once its process group is orphaned."""
    import os
    import signal
    import socket
    import time

    add_sub_model(tmp_path, "add_sub", max_batch_size=8)
    running = TritiumServer(tmp_path)
    children: set[int] = set()
    try:
        children = descendants(running.process.pid)
        assert len(children) >= 4   # broker, agent, gateway, instance
        if stopped_first:
            os.killpg(running.process.pid, signal.SIGTSTP)
            deadline = time.monotonic() + 10
            while {process_state(pid) for pid in children} != {"T"} and time.monotonic() < deadline:
                time.sleep(0.05)
            assert {process_state(pid) for pid in children} == {"T"}
        os.kill(running.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if _running(pid)], running.logs()
        with socket.socket() as probe:   # the HTTP port is free for the next start
            probe.bind(("127.0.0.1", running.port))
    finally:
        running.stop()
        for pid in children:   # should this fail, no orphan outlives the test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
