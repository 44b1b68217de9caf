"""Runs a command that the kernel stops (SIGTERM) when the test run that started it dies.

``python -S tests/exit_with_test_run.py PARENT_PID COMMAND...``: sets the parent-death signal,
then becomes COMMAND (the signal stays set across exec). See ``tests.servers.exiting_with_test_run``.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1

ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):   # the test run died before the call: the kernel will not tell
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
