"""One folder for every temporary file of a test run.

The servers the tests start, and the processes those start (brokers, agents, instances), make
temporary folders and logs; a server killed on purpose cannot remove its own. They all go in one
folder, removed when the run passes and kept (its path printed) when a test failed, so that a
run leaves nothing in /tmp. pytest's own ``tmp_path`` folders stay where pytest puts them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def run_folder(request, tmp_path_factory):
    tmp_path_factory.getbasetemp()   # fixed before the switch below: socket paths under it stay short
    folder = Path(tempfile.mkdtemp(prefix="tritium-tests-"))
    previous = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)   # this process, and every process it starts
    yield folder
    if previous[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous[0]
    tempfile.tempdir = previous[1]
    session = request.session
    if session.testsfailed or session.exitstatus == pytest.ExitCode.INTERRUPTED:   # (Ctrl-C: exitstatus is set)
        print(f"\nthe servers' logs and temporary files of this run: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
