"""Command-line flags: those refused before any process starts, and Triton's command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import numpy as np
import pytest
import tritonclient.http as httpclient
from click.testing import CliRunner

from tests.servers import PROJECT_ROOT, free_port
from tritium.cli import main, serve
from tritium.triton_flags import IGNORED_FLAGS, ignored_flags_given


@pytest.mark.parametrize("flags, message", [
    (["--load-model", "a"], "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "a"],
     "'--load-model=*' can not be used with other '--load-model' arguments."),
    (["--model-control-mode", "sometimes"], "'sometimes' is not one of 'none', 'poll', 'explicit'"),
    (["--model-control-mode", "poll", "--repository-poll-secs", "0"], "must be positive"),
])
def test_model_control_flags_are_checked(tmp_path, flags, message):
    for command in ("serve", "broker"):
        extra = ["--frontend", "ipc:///nowhere/f", "--backend", "ipc:///nowhere/b"] if command == "broker" else []
        result = CliRunner().invoke(main, [command, "--model-repository", str(tmp_path), *extra, *flags])
        assert result.exit_code == 2, result.output
        assert message in result.output


# -- Triton's command line -------------------------------------------------------------------

def _tritonserver() -> list[str]:
    """The installed ``tritonserver`` script, or the same entry point through this interpreter."""
    script = Path(sys.executable).parent / "tritonserver"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'tritonserver'; "
            "from tritium.cli import tritonserver; tritonserver()"]


def test_unknown_flag_is_answered_as_tritonserver_does():
    result = CliRunner().invoke(serve, ["--model-repository=/models", "--bogus-flag=1"], prog_name="tritonserver")
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == "tritonserver: unrecognized option '--bogus-flag=1'"


def test_a_flag_given_by_a_prefix_of_its_name_is_read_as_tritonserver_reads_it(tmp_path):
    result = CliRunner().invoke(serve, ["--model-repository", str(tmp_path), "--log-warn=maybe"], prog_name="tritonserver")
    assert result.exit_code == 2 and "expected true or false, got 'maybe'" in result.output, result.output
    result = CliRunner().invoke(serve, ["--model-repository", str(tmp_path), "--allow-g=1"], prog_name="tritonserver")
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == ("tritonserver: option '--allow-g=1' is ambiguous; possibilities: "
                                             "'--allow-gpu-metrics' '--allow-grpc'")
    # As getopt: a flag's value is the next argument even when it looks like a flag's prefix.
    result = CliRunner().invoke(serve, ["--model-repository", str(tmp_path), "--model-control-mode", "--log-w"],
                                prog_name="tritonserver")
    assert result.exit_code == 2 and "'--log-w' is not one of 'none', 'poll', 'explicit'" in result.output, result.output


@pytest.mark.parametrize("flag, message", [
    ("--allow-http=false --allow-grpc=0", "leave nothing to serve"),
    ("--grpc-use-ssl=true", "gRPC over TLS (--grpc-use-ssl) needs --grpc-server-cert and --grpc-server-key"),
    ("--grpc-use-ssl-mutual=false --grpc-server-cert=/nowhere.pem --grpc-server-key=/nowhere.key",
     "--grpc-server-cert '/nowhere.pem' cannot be read: No such file or directory"),
    ("--allow-sagemaker=1", "--allow-sagemaker=true is not supported"),
    ("--response-cache-byte-size=1024 --cache-config=local,size=2048",
     "Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one or the other."),
    ("--cache-config=local,size=2048 --cache-config=redis,host=h",
     "found multiple cache configurations, but only a single cache is currently supported"),
    ("--allow-grpc=maybe", "expected true or false, got 'maybe'"),
    ("--rate-limit=sometimes", "'sometimes' is not one of 'off', 'execution_count'"),
    ("--rate-limit-resource=R:2:0:1", "--rate-limit-resource option format is '<resource_name>:<count>:<device>' "
                                      "or '<resource_name>:<count>'. Got R:2:0:1"),
])
def test_flags_that_cannot_apply_are_refused(tmp_path, flag, message):
    result = CliRunner().invoke(serve, ["--model-repository", str(tmp_path), *flag.split()], prog_name="tritonserver")
    assert result.exit_code == 2, result.output
    assert message in result.output


def _commands(group: click.Group, path: tuple[str, ...] = ("tritium",)):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


@pytest.mark.parametrize("path, command", list(_commands(main)))
def test_every_option_has_help_and_booleans_read_as_booleans(path, command):
    ctx = click.Context(command, info_name=path)
    options = [p for p in command.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    assert [o.opts for o in options if not o.help] == []
    help_text = command.get_help(ctx)
    for flag in ("--allow-grpc", "--allow-metrics", "--strict-readiness", "--exit-on-error", "--log-info"):
        if f"{flag} " in help_text:
            assert f"{flag} BOOLEAN" in help_text


def test_every_ignored_flag_is_accepted_with_one_warning(tmp_path):
    """All ignored flags at once reach the point where serve starts processes, with one warning."""
    args = ["--model-repository", str(tmp_path)]
    for item in IGNORED_FLAGS:
        value = "true" if getattr(item.type, "name", "") == "boolean" else "1" if item.type in (int, float) else "x"
        args.append(f"{item.flag}={value}")
    ctx = serve.make_context("tritonserver", args)
    assert ignored_flags_given(dict(ctx.params)) == [item.flag for item in IGNORED_FLAGS]


TRITON_DOCS_COMMAND = ["--log-verbose=1", "--strict-model-config=false",
                       "--pinned-memory-pool-byte-size=268435456", "--cuda-memory-pool-byte-size=0:67108864",
                       "--allow-metrics=true"]


@pytest.fixture(scope="module")
def tritonserver_process():
    http_port = free_port()
    command = [*_tritonserver(), f"--model-repository={PROJECT_ROOT / 'examples' / 'model_repository'}",
               *TRITON_DOCS_COMMAND, "--http-address", "127.0.0.1", f"--http-port={http_port}",
               "--grpc-address=127.0.0.1", "--grpc-port", str(free_port()), f"--metrics-port={free_port()}",
               "--metrics-address=127.0.0.1", "--http-thread-count=4", "--log-info", "false",
               "--backend-config=tensorflow,version=2", "--backend-config=onnxruntime,enable-global-threadpool=0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITIUM_HTTP_WORKERS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               start_new_session=True)
    lines: list[bytes] = []
    errors: list[bytes] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True).start()
    deadline = time.monotonic() + 60
    while not any(b"tritium ready" in line for line in lines):
        assert process.poll() is None and time.monotonic() < deadline, b"".join(errors).decode()
        time.sleep(0.05)
    yield f"127.0.0.1:{http_port}", errors
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def test_triton_docs_command_line_serves_and_infers(tritonserver_process):
    url, errors = tritonserver_process
    client = httpclient.InferenceServerClient(url)
    a, b = np.arange(16, dtype=np.float32)[None], np.full((1, 16), 2, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # --log-verbose=1 and --log-info false reach every process through the logging settings.
    settings = client.get_log_settings()
    assert settings["log_verbose_level"] == 1 and settings["log_info"] is False
    warnings = [line for line in b"".join(errors).decode().splitlines() if "ignored:" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith("ignored: --http-thread-count, --pinned-memory-pool-byte-size, "
                                "--cuda-memory-pool-byte-size, --backend-config=tensorflow,...")


# Every flag in tritonserver 2.51's usage (tritonserver --help), --help aside.
TRITONSERVER_251_FLAGS = (
    "--allow-cpu-metrics", "--allow-gpu-metrics", "--allow-grpc", "--allow-http", "--allow-metrics",
    "--allow-sagemaker", "--allow-vertex-ai", "--backend-config", "--backend-directory",
    "--buffer-manager-thread-count", "--cache-config", "--cache-directory", "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size", "--disable-auto-complete-config", "--enable-peer-access",
    "--exit-on-error", "--exit-timeout-secs", "--grpc-address", "--grpc-header-forward-pattern",
    "--grpc-http2-max-ping-strikes", "--grpc-http2-max-pings-without-data",
    "--grpc-http2-min-recv-ping-interval-without-data", "--grpc-infer-allocation-pool-size",
    "--grpc-infer-response-compression-level", "--grpc-keepalive-permit-without-calls",
    "--grpc-keepalive-time", "--grpc-keepalive-timeout", "--grpc-max-connection-age",
    "--grpc-max-connection-age-grace", "--grpc-port", "--grpc-restricted-protocol", "--grpc-root-cert",
    "--grpc-server-cert", "--grpc-server-key", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--host-policy",
    "--http-address", "--http-header-forward-pattern", "--http-port", "--http-restricted-api",
    "--http-thread-count", "--id", "--load-model", "--log-error", "--log-file", "--log-format", "--log-info",
    "--log-verbose", "--log-warning", "--metrics-address", "--metrics-config", "--metrics-interval-ms",
    "--metrics-port", "--min-supported-compute-capability", "--model-config-name", "--model-control-mode",
    "--model-load-gpu-limit", "--model-load-retry-count", "--model-load-thread-count", "--model-namespacing",
    "--model-repository", "--model-store", "--pinned-memory-pool-byte-size", "--rate-limit",
    "--rate-limit-resource", "--repoagent-directory", "--repository-poll-secs", "--response-cache-byte-size",
    "--reuse-grpc-port", "--reuse-http-port", "--sagemaker-port", "--sagemaker-safe-port-range",
    "--sagemaker-thread-count", "--strict-model-config", "--strict-readiness", "--trace-config",
    "--trace-count", "--trace-file", "--trace-level", "--trace-log-frequency", "--trace-rate",
    "--vertex-ai-default-model", "--vertex-ai-port", "--vertex-ai-thread-count",
)


def test_every_tritonserver_flag_is_an_option_of_serve():
    ctx = click.Context(serve, info_name="tritonserver")
    known = {opt for param in serve.get_params(ctx) if isinstance(param, click.Option) for opt in param.opts}
    assert [flag for flag in TRITONSERVER_251_FLAGS if flag not in known] == []


def _gateway_settings(monkeypatch, *flags: str):
    """The settings ``tritium gateway FLAGS`` would run with."""
    import tritium.gateway.server as gateway_server
    seen = []
    monkeypatch.setattr(gateway_server, "run", seen.append)
    result = CliRunner().invoke(main, ["gateway", "--broker", "ipc:///nowhere/frontend", *flags])
    assert result.exit_code == 0, result.output
    (settings,) = seen
    return settings


@pytest.mark.parametrize("flags, batched", [([], True), (["--gateway-batched-sends", "false"], False)])
def test_the_gateway_batches_its_sends_unless_told_not_to(monkeypatch, flags, batched):
    assert _gateway_settings(monkeypatch, *flags).batched_sends is batched


@pytest.mark.parametrize("flags, send_every", [([], 0), (["--gateway-send-every", "5"], 5)])
def test_the_gateway_sends_a_turns_requests_at_its_end_unless_told_otherwise(monkeypatch, flags, send_every):
    assert _gateway_settings(monkeypatch, *flags).send_every == send_every


def _serve_children(monkeypatch, tmp_path, cpus: set[int], *flags: str, quota: float | None = None):
    """What serve would give its children on a host whose CPUs this process may use are ``cpus``
    (under a CPU ``quota``): (exit code, output, {role: {flag: value}}) without starting them."""
    import tritium.supervisor as supervisor
    started = []

    class Recording:
        def __init__(self, settings) -> None:
            started.append(settings)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(supervisor, "Supervisor", Recording)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    for module in ("tritium.cpu_quota", "tritium.cli"):   # none, or the one given, whatever this machine has
        monkeypatch.setattr(f"{module}.cpu_quota", lambda: quota)
    result = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path), *flags])
    children = {}
    for settings in started:
        for role, args in (("gateway", settings.gateway_args), ("broker", settings.broker_args),
                           ("worker", settings.worker_args)):
            children[role] = {flag: value for flag, value in zip(args, args[1:]) if flag.startswith("--")
                              and flag in ("--gateway-cpus", "--broker-cpus", "--worker-cpus", "--gateway-send-every")}
    return result.exit_code, result.output, children


@pytest.mark.parametrize("cpus, flags, expected", [
    ({4, 5}, ["--cpu-layout", "split"], {"gateway": {"--gateway-cpus": "4", "--gateway-send-every": "8"},
                                         "broker": {"--broker-cpus": "5"}, "worker": {}}),
    ({0, 1, 2, 3}, ["--cpu-layout", "split"], {"gateway": {"--gateway-cpus": "0,1", "--gateway-send-every": "8"},
                                               "broker": {"--broker-cpus": "2,3"}, "worker": {}}),
    ({0, 1, 2}, ["--cpu-layout", "split", "--http-workers", "1", "--gateway-send-every", "3"],
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "3"}, "broker": {"--broker-cpus": "1,2"},
      "worker": {}}),
    ({0, 1}, ["--cpu-layout", "split", "--worker-cpus", "1"],   # the instances with the broker, as asked
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "8"}, "broker": {"--broker-cpus": "1"},
      "worker": {"--worker-cpus": "1"}}),
    ({0, 1}, ["--cpu-layout", "split", "--worker-cpus", "0"],   # ... or with the gateway: it sends at the turn's end
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "0"}, "broker": {"--broker-cpus": "1"},
      "worker": {"--worker-cpus": "0"}}),
    ({0, 1}, [], {"gateway": {"--gateway-send-every": "0"}, "broker": {}, "worker": {}}),
    ({0, 1}, ["--gateway-cpus", "0", "--broker-cpus", "1", "--worker-cpus", "1"],
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "8"}, "broker": {"--broker-cpus": "1"},
      "worker": {"--worker-cpus": "1"}}),
    ({0, 1}, ["--gateway-cpus", "0", "--broker-cpus", "1"],   # the instances free: the broker is what counts
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "8"}, "broker": {"--broker-cpus": "1"}, "worker": {}}),
    ({0, 1}, ["--gateway-cpus", "0", "--broker-cpus", "1", "--worker-cpus", "0"],
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "0"}, "broker": {"--broker-cpus": "1"},
      "worker": {"--worker-cpus": "0"}}),
    ({0, 1}, ["--gateway-cpus", "0", "--broker-cpus", "0-1"],
     {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "0"}, "broker": {"--broker-cpus": "0,1"},
      "worker": {}}),
    ({0, 1}, ["--gateway-cpus", "0"], {"gateway": {"--gateway-cpus": "0", "--gateway-send-every": "0"},
                                       "broker": {}, "worker": {}}),
])
def test_serve_places_each_part_as_its_cpu_flags_say(monkeypatch, tmp_path, cpus, flags, expected):
    code, output, children = _serve_children(monkeypatch, tmp_path, cpus, *flags)
    assert code == 0, output
    assert children == expected


@pytest.mark.parametrize("cpus, flags, message", [
    ({0, 1}, ["--cpu-layout", "split", "--broker-cpus", "1"],
     "--cpu-layout split chooses the gateways' and the broker's CPUs: give it or --broker-cpus, not both"),
    ({3}, ["--cpu-layout", "split"],
     "--cpu-layout split needs more CPUs than gateway processes (1): this process may use 1 (3)"),
    ({0, 1}, ["--cpu-layout", "split", "--http-workers", "2"],
     "--cpu-layout split needs more CPUs than gateway processes (2): this process may use 2 (0,1)"),
    ({0, 1}, ["--cpu-layout", "split"], "--cpu-layout split needs CPUs of their own for the gateways: this process "
                                        "may use 2 CPUs but only 1.5 CPUs' worth of time (a CPU quota)"),
])
def test_a_split_layout_serve_cannot_make_is_a_usage_error(monkeypatch, tmp_path, cpus, flags, message):
    quota = 1.5 if "quota" in message else None
    code, output, children = _serve_children(monkeypatch, tmp_path, cpus, *flags, quota=quota)
    assert code == 2
    assert message in output
    assert children == {}


def test_gateways_pinned_apart_under_a_cpu_quota_smaller_than_the_cpus_send_at_the_turns_end(monkeypatch, tmp_path):
    flags = ("--gateway-cpus", "0", "--broker-cpus", "1", "--worker-cpus", "1")
    assert _serve_children(monkeypatch, tmp_path, {0, 1}, *flags, quota=1.5)[2]["gateway"]["--gateway-send-every"] == "0"
    assert _serve_children(monkeypatch, tmp_path, {0, 1}, *flags, quota=2.0)[2]["gateway"]["--gateway-send-every"] == "8"
