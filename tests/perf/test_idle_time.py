"""bench/idle_time.py's replay of scheduler events, on a trace written by hand."""

from __future__ import annotations

import pytest

from bench.idle_time import replay

TRACE = """\
   10 [000]     0.000000: sched:sched_stat_runtime: comm=gateway pid=10 runtime=0 [ns]
   20 [001]     0.000000:       sched:sched_switch: prev_comm=client prev_pid=20 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
   10 [000]     1.000000:       sched:sched_waking: comm=broker pid=30 prio=120 target_cpu=001
   30 [001]     1.300000: sched:sched_stat_runtime: comm=broker pid=30 runtime=100000000 [ns]
   30 [001]     2.000000:       sched:sched_switch: prev_comm=broker prev_pid=30 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
   10 [000]     2.000000:       sched:sched_waking: comm=client pid=40 prio=120 target_cpu=000
   10 [000]     2.500000:       sched:sched_switch: prev_comm=gateway prev_pid=10 prev_prio=120 prev_state=S ==> next_comm=client next_pid=40 next_prio=120
   40 [000]     3.000000: sched:sched_stat_runtime: comm=client pid=40 runtime=500000000 [ns]
"""


def test_idle_time_is_told_apart_by_what_it_waited_for():
    found = replay(TRACE.splitlines(), cpus=2)
    assert found.span_s == pytest.approx(3.0)
    assert found.cpu_s == pytest.approx(6.0)
    # CPU 1: idle 0-1.2 (0-1 nothing queued, 1-1.2 the broker woken onto it and not yet running,
    # its switch-in missing from the trace and dated by its runtime), then idle again 2-3: the
    # client queued on busy CPU 0 until 2.5, then nothing.
    assert found.idle_s == pytest.approx({"waking": 0.2, "work on another CPU": 0.5, "nothing to run": 1.5})
    assert found.wakeups == pytest.approx([0.2])
