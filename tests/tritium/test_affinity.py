"""CPU lists for --gateway-cpus, --broker-cpus and --worker-cpus, and the layout of --cpu-layout split."""

from __future__ import annotations

import os

import click
import pytest

from tritium.affinity import CPU_LIST, apart, parse_cpu_list, split_layout


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


@pytest.mark.parametrize("available, gateways, layout", [
    ({0, 1}, 1, ("0", "1")),
    ({6, 2, 9}, 1, ("2", "6,9")),
    ({0, 1, 2, 3, 4, 5}, 2, ("0,1", "2,3,4,5")),
])
def test_a_split_layout_gives_the_gateways_the_first_cpus_and_the_rest_the_others(available, gateways, layout):
    assert split_layout(frozenset(available), gateways) == layout


def test_a_split_layout_needs_a_cpu_left_after_the_gateways():
    with pytest.raises(ValueError, match=r"needs more CPUs than gateway processes \(2\): this process may use 2 \(0,1\)"):
        split_layout(frozenset({0, 1}), 2)


@pytest.mark.parametrize("first, second, expected", [
    ("0", "1", True), ("0-1", "2-3", True), ("0", "0-1", False), ("1,3", "3", False), (None, "1", False),
    ("0", None, False), (None, None, False),
])
def test_parts_run_apart_only_when_both_are_pinned_to_cpus_they_do_not_share(first, second, expected):
    assert apart(first, second) is expected
