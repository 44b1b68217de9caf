"""An instance stopped while its model's finalize never returns still exits: at a second SIGTERM
(the kernel sends one when its agent dies), or when its time to stop runs out."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tritium.exit_codes import ExitCode

# The instance's SIGTERM handler around a finalize that loops for ever.
STOPPING = """
import functools, os, signal, sys, time
from tritium.workers.instance import _on_sigterm
stopping = []
signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, stopping, os.getppid(), float(sys.argv[1])))
print("ready", flush=True)
while not stopping:
    time.sleep(0.01)
print("finalizing", flush=True)
while True:
    time.sleep(0.01)
"""


def stopping_instance(within_s: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", STOPPING, str(within_s)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    assert process.stdout.readline() == "finalizing\n"
    return process


def test_a_second_sigterm_ends_a_stopping_instance_at_once():
    process = stopping_instance(within_s=60)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == ExitCode.FORCED
    assert time.monotonic() - started < 5


def test_a_stopping_instance_ends_when_its_time_runs_out():
    process = stopping_instance(within_s=0.5)
    assert process.wait(timeout=10) == ExitCode.ERROR
    assert "Thread" in process.stderr.read()   # every thread's stack, to show where finalize hung
