"""Every benchmark script still imports: they are run by hand, not by the suite, so a change to
what they use would otherwise surface only when someone next measures."""

from __future__ import annotations

import importlib

import pytest

from tests.servers import PROJECT_ROOT

LIBRARIES = {"__init__", "harness"}   # shared code of the benchmarks, not one of them
BENCHMARKS = sorted(path.stem for path in (PROJECT_ROOT / "bench").glob("*.py") if path.stem not in LIBRARIES)


def test_there_are_benchmarks():
    assert "versus_triton" in BENCHMARKS and "instance_cpu" in BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name):
    module = importlib.import_module(f"bench.{name}")
    assert callable(getattr(module, "main", None)), f"bench/{name}.py has no main()"
