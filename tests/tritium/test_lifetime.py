"""A child that leads a process group of its own, and the process tree below a process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tritium import lifetime


@pytest.mark.parametrize("arguments", [lifetime.own_process_group(), {"preexec_fn": lifetime._lead_a_group}],
                         ids=["this-python", "python-3.10-way"])
def test_a_child_leads_a_process_group_in_its_parent_s_session(arguments):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], **arguments)
    try:
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
        assert os.getsid(child.pid) == os.getsid(0)
        assert child.pid in lifetime.descendants(os.getpid())
        assert lifetime.process_state(child.pid) in ("R", "S")
    finally:
        child.kill()
        child.wait()
    assert lifetime.process_state(child.pid) is None
