"""Every benchmark script still imports: they are run by hand, not by the suite, so a change to
what they use would otherwise surface only when someone next measures."""

from __future__ import annotations

import importlib
import os

import pytest

from tests.servers import PROJECT_ROOT

LIBRARIES = {"__init__", "harness", "simulated_peers"}   # shared code of the benchmarks, not one of them
BENCHMARKS = sorted(path.stem for path in (PROJECT_ROOT / "bench").glob("*.py") if path.stem not in LIBRARIES)


def test_there_are_benchmarks():
    assert "versus_triton" in BENCHMARKS and "instance_cpu" in BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name):
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"


def test_the_broker_cpu_benchmark_serves_both_scenarios(tmp_path):
    """bench/broker_cpu.py's scripted peers really drive a broker: every request of either
    scenario (a plain model, a two-step ensemble) is answered, none fails."""
    from bench.broker_cpu import SCENARIOS, Bench, prepared_repository

    bench = Bench(prepared_repository(tmp_path / "repo"), tmp_path)
    try:
        bench.ready()
        for model in SCENARIOS:
            answered = bench.peers.answered
            assert bench.measure(model, 0.3) > 0
            assert bench.peers.answered - answered > 16, model
        assert bench.peers.errors == 0
    finally:
        bench.close()


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-stream"])
def test_the_gateway_cpu_benchmark_gets_every_request_to_the_broker_and_answers_it(protocol):
    """bench/gateway_cpu.py drives the gateway's front ends in-process: each turn's sixteen
    requests reach the (scripted) broker, which its ``measure`` asserts, and are answered."""
    import asyncio

    from bench.gateway_cpu import measure

    assert asyncio.run(measure(protocol, 20)) > 0


def test_the_bytecode_count_is_the_same_on_every_run():
    """bench/bytecodes.py counts what a request runs, not how long it takes: two counts of the
    instance's executor agree, and a request runs hundreds of bytecodes there."""
    from bench.bytecodes import count_instance

    first, second = count_instance(1), count_instance(1)
    total = sum(first["bytecodes"].values())
    assert total > 500
    assert sum(second["bytecodes"].values()) == total
    assert sum(calls for where, calls in first["calls"].items() if where.endswith("run (executor.py)")) == 1


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the woken process starts on a second CPU")
def test_the_wake_placement_benchmark_times_every_wake_up():
    """bench/wake_placement.py: each of the waker's sends wakes the other process once, which
    notes where it ran and how long after the send."""
    from bench.wake_placement import ON_WAKER, measure

    for apart in (False, True):
        result = measure(wakeups=30, busy_us=50, apart=apart)
        assert 0 <= result[ON_WAKER] <= 100
        assert 0 < result["delay p50 us"] <= result["delay p90 us"] < 1e6
