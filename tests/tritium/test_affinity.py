"""CPU lists for --gateway-cpus, --broker-cpus and --worker-cpus."""

from __future__ import annotations

import os

import click
import pytest

from tritium.affinity import CPU_LIST, parse_cpu_list


@pytest.mark.parametrize("text, cpus", [
    ("0", {0}), ("0-3", {0, 1, 2, 3}), ("1,3-4,6", {1, 3, 4, 6}), (" 2 , 0 ", {0, 2}), ("0,0-1", {0, 1}),
])
def test_cpu_lists_read_as_taskset_writes_them(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text, problem", [
    ("", "no CPU given"), ("a", "'a' is not a CPU number or range"), ("3-1", "'3-1' is an empty range"),
    ("1-", "'1-' is not a CPU number or range"), ("-1", "'-1' is not a CPU number or range"),
])
def test_malformed_cpu_lists_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_cpu_list(text)


def test_the_option_gives_children_a_canonical_list_of_cpus_this_process_may_use():
    available = sorted(os.sched_getaffinity(0))
    given = ",".join(str(cpu) for cpu in reversed(available))
    assert CPU_LIST.convert(given, None, None) == ",".join(str(cpu) for cpu in available)
    with pytest.raises(click.BadParameter, match=f"CPU {available[-1] + 1} is not available here"):
        CPU_LIST.convert(str(available[-1] + 1), None, None)


def test_a_process_that_may_not_choose_its_cpus_says_so_in_one_line(monkeypatch, capsys):
    from tritium import affinity

    def refuse(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(affinity.os, "sched_setaffinity", refuse)
    with pytest.raises(SystemExit) as stopped:
        affinity.pin("0")
    assert stopped.value.code == 1
    assert capsys.readouterr().err == ("error: cannot run on CPUs 0: Operation not permitted; under systemd, "
                                       "set CPUAffinity= in the unit instead\n")
