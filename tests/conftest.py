"""One folder for every temporary file of a test run.

The servers the tests start, and the processes those start (brokers, agents, instances), make
temporary folders and logs; a server killed on purpose cannot remove its own. They all go in one
folder, removed when the run passes and kept (its path printed) when a test failed, so that a
run leaves nothing in /tmp. pytest's own ``tmp_path`` folders stay where pytest puts them.

The suite runs on pytest-xdist's workers (``-n`` in pyproject's addopts): the process that
drives the run makes the folder before it starts them and owns its removal; each worker (or the
one process of a run without workers) points its own TMPDIR at it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

RUN_FOLDER_VARIABLE = "TRITIUM_TEST_RUN_FOLDER"
_run_folder = pytest.StashKey[Path]()
_kept_run_folder = pytest.StashKey[Path]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_worker(config):
        return
    folder = Path(tempfile.mkdtemp(prefix="tritium-tests-"))
    config.stash[_run_folder] = folder
    os.environ[RUN_FOLDER_VARIABLE] = str(folder)   # inherited by the workers started after this


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Runs after the workers have ended; testsfailed counts their failures too, and Ctrl-C sets
    # exitstatus.
    folder = session.config.stash.get(_run_folder, None)
    if folder is None:
        return
    if session.testsfailed or exitstatus == pytest.ExitCode.INTERRUPTED:
        session.config.stash[_kept_run_folder] = folder
    else:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    folder = config.stash.get(_kept_run_folder, None)
    if folder is not None:
        terminalreporter.write_line(f"the servers' logs and temporary files of this run: {folder}")


@pytest.fixture(scope="session", autouse=True)
def run_folder(tmp_path_factory):
    tmp_path_factory.getbasetemp()   # fixed before the switch below: socket paths under it stay short
    folder = Path(os.environ[RUN_FOLDER_VARIABLE])
    previous = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)   # this process, and every process it starts
    yield folder
    if previous[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous[0]
    tempfile.tempdir = previous[1]
