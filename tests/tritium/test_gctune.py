"""The serving processes' memory settings: a large buffer freed and allocated again is reused,
not mapped afresh and page-faulted in (measured in a child process, by its page faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_FAULTS = """
import resource, sys
from tritium.gctune import reuse_large_buffers
if sys.argv[1] == "tuned":
    assert reuse_large_buffers()
def requests_in_flight():   # sixteen 600 KB tensors held at once, then freed: a turn under load
    held = [bytearray(600_000) for _ in range(16)]   # zeroed: every page touched
    del held
requests_in_flight()   # warm up: the heap grows to its working size
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    requests_in_flight()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_large_buffers_are_reused_instead_of_page_faulted_in_each_time():
    # 20 x 16 buffers of 600 KB are 47,000 pages: mapped afresh, each one is a fault.
    assert _faults("default") > 20_000
    assert _faults("tuned") < 500


def test_a_user_who_sets_glibc_allocator_options_keeps_them(monkeypatch):
    from tritium.gctune import reuse_large_buffers

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert reuse_large_buffers() is False
