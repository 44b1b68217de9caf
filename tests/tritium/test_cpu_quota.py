"""Reading a container's CPU limit from its cgroup (both versions), on cgroup trees built here."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tritium.cli import polling_s
from tritium.cpu_quota import cpu_quota


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_unlimited_is_none(tmp_path):
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "fs" / "cpu.max", "max 100000\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") is None


def test_cgroup_v2_a_quota_in_the_process_own_cgroup(tmp_path):
    write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    write(tmp_path / "fs" / "kubepods" / "pod1" / "c1" / "cpu.max", "150000 100000\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") == 1.5


def test_cgroup_v2_the_tightest_limit_above_the_process_counts(tmp_path):
    write(tmp_path / "proc", "0::/kubepods/pod1/c1\n")
    write(tmp_path / "fs" / "kubepods" / "pod1" / "c1" / "cpu.max", "max 100000\n")
    write(tmp_path / "fs" / "kubepods" / "pod1" / "cpu.max", "50000 100000\n")
    write(tmp_path / "fs" / "kubepods" / "cpu.max", "400000 100000\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") == 0.5


def test_cgroup_v1_quota_and_period(tmp_path):
    write(tmp_path / "proc", "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    write(tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "200000\n")
    write(tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") == 2.0


def test_cgroup_v1_unlimited_is_none(tmp_path):
    write(tmp_path / "proc", "1:cpu:/\n")
    write(tmp_path / "fs" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "fs" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") is None


def test_nothing_readable_is_none(tmp_path):
    assert cpu_quota(tmp_path / "no-proc", tmp_path / "fs") is None
    write(tmp_path / "proc", "0::/a\n")
    write(tmp_path / "fs" / "a" / "cpu.max", "garbage\n")
    assert cpu_quota(tmp_path / "proc", tmp_path / "fs") is None


def test_polling_is_off_by_default_under_a_quota_and_as_given_when_given(monkeypatch, caplog):
    import tritium.cli

    monkeypatch.setattr(tritium.cli, "cpu_quota", lambda: 1.5)
    with caplog.at_level(logging.INFO, logger="tritium.cli"):
        assert polling_s(None, 300, "--broker-spin-us") == 0.0
    assert "a CPU quota of 1.5 CPUs: no polling before sleeping (--broker-spin-us sets it anyway)" in caplog.text
    assert polling_s(250, 300, "--broker-spin-us") == pytest.approx(250e-6)
    monkeypatch.setattr(tritium.cli, "cpu_quota", lambda: None)
    assert polling_s(None, 1000, "--gateway-spin-us") == pytest.approx(1e-3)
    assert polling_s(0, 1000, "--gateway-spin-us") == 0.0


def onnx_context(tmp_path, parameters: str = ""):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from tritium.workers.backends.base import ModelContext

    config = text_format.Parse(f'name: "m" platform: "onnxruntime_onnx" {parameters}', model_config_pb2.ModelConfig())
    return ModelContext("m", 1, tmp_path, config, {})


def test_onnxruntime_starts_the_quotas_threads_unless_the_model_says(monkeypatch, tmp_path):
    import tritium.cpu_quota
    from tritium.workers.backends.onnxruntime import session_options

    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: 0.5)
    assert session_options(onnx_context(tmp_path)).intra_op_num_threads == 1
    given = 'parameters { key: "intra_op_thread_count" value: { string_value: "3" } }'
    assert session_options(onnx_context(tmp_path, given)).intra_op_num_threads == 3
    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: None)
    assert session_options(onnx_context(tmp_path)).intra_op_num_threads == 0   # onnxruntime's own default


def test_threads_within_a_quota_never_outnumber_the_cpus_this_process_may_use(monkeypatch):
    import os

    import tritium.cpu_quota
    from tritium.cpu_quota import threads_within_quota

    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: 1000.0)
    assert threads_within_quota() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: 1.2)
    assert threads_within_quota() == min(2, len(os.sched_getaffinity(0)))


def test_usable_cpus_are_the_affinity_fewer_under_a_quota(monkeypatch):
    import os

    import tritium.cpu_quota
    from tritium.cpu_quota import usable_cpus

    allowed = len(os.sched_getaffinity(0))
    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: None)
    assert usable_cpus() == allowed
    monkeypatch.setattr(tritium.cpu_quota, "cpu_quota", lambda: 0.25)
    assert usable_cpus() == 1
