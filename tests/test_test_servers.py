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
from tests.servers import PROJECT_ROOT


def session_processes(session: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry.name))
    return found


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
        assert len(session_processes(serve)) >= 3      # serve, a gateway, the broker, the instance
        run.send_signal(signal.SIGKILL)                  # as `timeout` does: no teardown runs
        run.wait()
        deadline = time.monotonic() + 30
        while session_processes(serve) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_processes(serve) == []
    finally:
        run.kill()
        for pid in session_processes(serve) if "serve" in locals() else []:
            os.kill(pid, signal.SIGKILL)
