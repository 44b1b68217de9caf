"""The test helpers' servers do not outlive the test run that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.models import add_sub_model
from tests.servers import PROJECT_ROOT, descendants


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


def test_a_server_stops_with_its_children_when_the_test_run_is_killed(tmp_path):
    add_sub_model(tmp_path / "repo")
    run = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(PROJECT_ROOT)!r})
        from tests.servers import TritiumServer
        server = TritiumServer({str(tmp_path / "repo")!r})
        print(server.process.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        serve = int(run.stdout.readline())
        server = {serve} | descendants(serve)
        assert len(server) >= 4      # serve, a gateway, the broker, the agent, the instance
        run.send_signal(signal.SIGKILL)                  # as `timeout` does: no teardown runs
        run.wait()
        deadline = time.monotonic() + 30
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(server) == set()
    finally:
        run.kill()
        for pid in alive(server) if "server" in locals() else set():
            os.kill(pid, signal.SIGKILL)


def test_starting_a_server_survives_a_test_run_that_has_used_grpc():
    """A child started with a ``preexec_fn`` after grpcio's poller runs aborted about once in 75
    starts (grpcio restarts its poller in the forked child; subprocess then closes its
    descriptor). Servers are started through the launcher instead: every start runs."""
    import grpc

    from tests.servers import exiting_with_test_run

    channel = grpc.insecure_channel("127.0.0.1:1")   # nothing listens: grpcio keeps trying, its poller busy
    try:
        channel.subscribe(lambda state: None, try_to_connect=True)
        failed = []
        for _ in range(200):
            child = subprocess.run(exiting_with_test_run(["true"]), stderr=subprocess.PIPE)
            if child.returncode != 0:
                failed.append((child.returncode, child.stderr[-200:]))
        assert failed == []
    finally:
        channel.close()


def test_a_startup_run_whose_chosen_port_was_taken_runs_again_on_fresh_ports(tmp_path, monkeypatch):
    """Another process can take a port between run_serve's choice and the server's bind; the
    failure then is the helper's, not the test's: the run is repeated on fresh ports."""
    import socket

    from tests import servers
    from tests.models import write_config

    write_config(tmp_path / "bad_config", "max_batch_size: -3 nonsense: 1")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        chosen = [holder.getsockname()[1]]
        real_free_port = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: chosen.pop() if chosen else real_free_port())
        result = servers.run_serve(tmp_path)
    assert result.returncode == 4, result.stderr.decode()[-2000:]     # the model's failure, not the port's
    assert b"already in use" not in result.stderr


def test_an_azurite_that_does_not_start_is_reported_with_what_it_said(tmp_path, monkeypatch):
    import pytest

    from tests import azure_server
    broken = tmp_path / "azurite-blob"
    broken.write_text("#!/bin/sh\necho 'SyntaxError: Unexpected token ?'\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(azure_server, "azurite", lambda: str(broken))
    with pytest.raises(RuntimeError) as failed:
        with azure_server.azure_server("models"):
            pass
    assert str(failed.value) == (f"Azurite (installed: {broken}) exited with status 1; "
                                 "it said: SyntaxError: Unexpected token ?")
