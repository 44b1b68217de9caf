"""Where a process's log lines go: standard error, or the file ``--log-file`` names."""

from __future__ import annotations

import logging
import os

import pytest

from tritium import logs


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level
    logs._handler = None


def test_lines_are_appended_to_the_log_file_and_not_written_to_stderr(tmp_path, capfd):
    target = tmp_path / "tritium.log"
    target.write_text("an earlier line\n")
    assert logs.configure("broker", 0, str(target)) == str(target)
    logging.getLogger("tritium.test").info("model %s loaded", "m")
    logging.getLogger("tritium.test").debug("not at verbose level 0")
    lines = target.read_text().splitlines()
    assert lines[0] == "an earlier line"
    assert len(lines) == 2 and lines[1].endswith("I broker[%d] tritium.test: model m loaded" % os.getpid())
    assert capfd.readouterr().err == ""


def test_a_log_file_that_cannot_be_opened_leaves_the_lines_on_stderr_with_a_warning(tmp_path, capfd):
    missing = tmp_path / "no such folder" / "tritium.log"
    assert logs.configure("gateway", 0, str(missing)) == ""
    logging.getLogger("tritium.test").error("still logged")
    err = capfd.readouterr().err.splitlines()
    assert f"cannot write the log file {missing} (No such file or directory): logging to standard error" in err[0]
    assert err[1].endswith("gateway[%d] tritium.test: still logged" % os.getpid())
    assert not missing.parent.exists()


def test_no_log_file_means_stderr(capfd):
    assert logs.configure("worker", 1, None) == ""
    logging.getLogger("tritium.test").debug("verbose line")
    assert capfd.readouterr().err.rstrip().endswith("D worker[%d] tritium.test: verbose line" % os.getpid())



def test_verbose_lines_are_the_servers_not_hpacks(tmp_path):
    target = tmp_path / "tritium.log"
    logs.configure("gateway", 2, str(target))
    logging.getLogger("tritium.test").debug("a verbose line")
    logging.getLogger("hpack.hpack").debug("Decoding b'...'")   # one per HTTP/2 header
    lines = target.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith("tritium.test: a verbose line")
