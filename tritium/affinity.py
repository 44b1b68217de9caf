"""Pinning a process to a set of CPUs (``--gateway-cpus``, ``--broker-cpus``, ``--worker-cpus``,
``--cpu-layout``).

A process pins itself first thing, before ZeroMQ starts its I/O thread, so that every thread
it starts and every process it spawns (a host agent's instances) inherits the set. Why one
would: where the kernel runs a woken process on the CPU of the one that woke it (seen on small
virtual machines, even with another CPU idle), the gateway, the broker and an instance take
turns on one CPU; the gateway and the broker pinned apart work at once, while the instances
stay free to use every CPU. docs/performance.md has the measurements.
"""

from __future__ import annotations

import os
import sys

import click

from tritium.exit_codes import ExitCode


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0-3,6`` (taskset's list form) as a set of CPU numbers; ValueError when malformed."""
    cpus: set[int] = set()
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        first, dash, last = item.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"'{item}' is not a CPU number or range")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"'{item}' is an empty range")
        cpus.update(range(low, high + 1))
    if not cpus:
        raise ValueError("no CPU given")
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def split_layout(available: frozenset[int], gateways: int) -> tuple[str, str]:
    """``--cpu-layout split``: the gateways' CPUs (the first ``gateways`` of ``available``) and the
    broker's (the rest), as CPU lists; ValueError when that leaves it none."""
    cpus = sorted(available)
    if len(cpus) <= gateways:
        raise ValueError(f"needs more CPUs than gateway processes ({gateways}): this process may use "
                         f"{len(cpus)} ({format_cpu_list(available)})")
    return format_cpu_list(frozenset(cpus[:gateways])), format_cpu_list(frozenset(cpus[gateways:]))


def apart(first: str | None, second: str | None) -> bool:
    """Whether two parts run on CPUs apart: both pinned, to lists with no CPU in common."""
    if not first or not second:
        return False
    return not parse_cpu_list(first) & parse_cpu_list(second)


def pin(cpu_list: str | None) -> None:
    """Run this process, and whatever it starts from now on, on ``cpu_list`` (None: leave it).

    Where the process may not choose its CPUs (a systemd unit's system call filter, a
    container's CPU set), it says so in one line and exits."""
    if not cpu_list:
        return
    try:
        os.sched_setaffinity(0, parse_cpu_list(cpu_list))
    except OSError as exc:
        click.echo(f"error: cannot run on CPUs {cpu_list}: {exc.strerror or exc}; under systemd, "
                   "set CPUAffinity= in the unit instead", err=True)
        sys.exit(ExitCode.ERROR)


class CpuList(click.ParamType):
    """A CPU list this process may run on; given to children in a canonical form."""

    name = "CPUS"

    def convert(self, value, param, ctx) -> str:
        try:
            cpus = parse_cpu_list(str(value))
        except ValueError as exc:
            self.fail(f"{exc} (expected a CPU list such as 0-3,6)", param, ctx)
        available = os.sched_getaffinity(0)
        missing = cpus - available
        if missing:
            self.fail(f"CPU {format_cpu_list(frozenset(missing))} is not available here "
                      f"(this process may use {format_cpu_list(frozenset(available))})", param, ctx)
        return format_cpu_list(cpus)


CPU_LIST = CpuList()
