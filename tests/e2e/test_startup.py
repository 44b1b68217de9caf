"""Startup: Triton's exit-on-error, readiness with failed models, flag handling, ports in
use; and a clean shutdown's log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model, write_config
from tests.servers import PROJECT_ROOT, TritiumServer, descendants, free_port, instance_processes, run_serve
from tritium.affinity import parse_cpu_list

BAD_ONNX_CONFIG = """
max_batch_size: 4
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


def unknown_operator_model(path) -> None:
    tensors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("X", "Y")]
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["X"], ["Y"])], "bad", tensors[:1], tensors[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "good")
    write_config(repo / "bad_config", "max_batch_size: -3 nonsense: 1")
    # A config that fits its ONNX file, whose operator onnxruntime lacks: fails in its instance.
    write_config(repo / "bad_file", BAD_ONNX_CONFIG)
    unknown_operator_model(repo / "bad_file" / "1" / "model.onnx")
    add_sub_model(repo, "no_version", extra='backend: "onnxruntime"')
    (repo / "no_version" / "1" / "model.onnx").unlink()
    (repo / "no_version" / "1").rmdir()
    return repo


def test_a_failed_model_stops_startup_by_default(repo):
    result = run_serve(repo)
    assert result.returncode == 4
    log = result.stderr.decode()
    assert "failed to load all models" in log
    assert "bad_config" in log and "no field named \"nonsense\"" in log
    assert "bad_file version 1" in log
    assert b"tritium ready" not in result.stdout


def test_a_model_named_at_startup_that_the_repository_lacks_stops_startup_or_is_left_out(repo):
    """As Triton 2.51 (side by side): "failed to poll model 'nosuch': model not found in any model
    repository.", then "failed to load all models", or with --exit-on-error=false a server that
    serves the others, ready, the name in no index (the broker crashed on it)."""
    named = ("--model-control-mode=explicit", "--load-model=good", "--load-model=nosuch")
    result = run_serve(repo, *named)
    assert result.returncode == 4
    log = result.stderr.decode()
    assert "failed to poll model 'nosuch': model not found in any model repository." in log
    assert "failed to load all models" in log
    with TritiumServer(repo, *named, "--exit-on-error=false") as running:
        assert request(running.url, "GET", "/v2/health/ready")[0] == 200
        _, _, body = request(running.url, "POST", "/v2/repository/index", {})
        assert {entry["name"]: entry.get("state") for entry in json.loads(body)} == {
            "good": "READY", "bad_config": None, "bad_file": None, "no_version": None}


def test_a_repository_that_cannot_be_read_leaves_a_server_neither_live_nor_ready(tmp_path):
    """As Triton 2.51 with --exit-on-error=false: its endpoints answer, its model calls do not."""
    with TritiumServer(tmp_path / "missing", "--exit-on-error=false", "--model-control-mode=explicit") as running:
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert request(running.url, "GET", path)[0] == 400
        assert request(running.url, "GET", "/v2")[0] == 200
        assert request(running.url, "GET", "/v2/logging")[0] == 200
        for method, path in (("GET", "/v2/models/m"), ("GET", "/v2/models/m/ready"), ("GET", "/v2/models/m/config"),
                             ("GET", "/v2/models/stats"), ("POST", "/v2/models/m/infer"),
                             ("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/m/load"),
                             ("POST", "/v2/repository/models/m/unload")):
            status, _, data = request(running.url, method, path, {} if method == "POST" else None)
            assert (status, error_of(data)) == (503, "Server not ready"), path
        client = grpcclient.InferenceServerClient(running.grpc_url)
        assert (client.is_server_live(), client.is_server_ready()) == (False, False)
        for call in (lambda: client.is_model_ready("m"), client.get_model_repository_index,
                     lambda: client.get_model_metadata("m")):
            with pytest.raises(InferenceServerException) as failure:
                call()
            assert (failure.value.status(), failure.value.message()) == ("StatusCode.UNAVAILABLE",
                                                                        "Server not ready")


@pytest.fixture(scope="module")
def tolerant_server(repo):
    with TritiumServer(repo, "--exit-on-error=false") as running:
        yield running


def test_with_exit_on_error_false_good_models_serve_and_readiness_is_false(tolerant_server):
    status, _, body = request(tolerant_server.url, "GET", "/v2/health/ready")
    assert (status, body) == (400, b"")
    assert request(tolerant_server.url, "GET", "/v2/health/live")[0] == 200
    assert request(tolerant_server.url, "GET", "/v2/models/good/ready")[0] == 200
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    status, _, reply = request(tolerant_server.url, "POST", "/v2/models/good/infer", body=body)
    assert status == 200


@pytest.mark.parametrize("model, unknown", [("bad_config", "is not found"), ("bad_file", "has no available versions"),
                                            ("no_version", "has no available versions")])
def test_failed_models_are_not_ready_and_not_served(tolerant_server, model, unknown):
    """As Triton 2.51 answers (checked side by side): readiness 400, inference 404; a config that does
    not parse never entered Triton's lifecycle, so it is "not found"."""
    status, _, body = request(tolerant_server.url, "GET", f"/v2/models/{model}/ready")
    assert (status, error_of(body)) == (400, "Model version not ready")
    status, _, body = request(tolerant_server.url, "POST", f"/v2/models/{model}/infer", body={"inputs": []})
    assert (status, error_of(body)) == (404, f"Request for unknown model: '{model}' {unknown}")


def test_the_index_shows_how_far_each_failed_load_got(tolerant_server):
    """As Triton 2.51's index (side by side): a config refused while polling, by name only; a model
    without a version folder, not at all (its lifecycle holds it without versions); a version that
    failed, with its state and reason."""
    _, _, body = request(tolerant_server.url, "POST", "/v2/repository/index", {})
    entries = {entry["name"]: entry for entry in json.loads(body)}
    assert entries["bad_config"] == {"name": "bad_config"}
    assert "no_version" not in entries
    assert entries["bad_file"]["state"] == "UNAVAILABLE" and "InvalidGraph" in entries["bad_file"]["reason"]
    assert entries["good"] == {"name": "good", "version": "1", "state": "READY"}


REFUSED_WHILE_POLLING = {   # configs Triton 2.51 refuses as it polls the repository (its log: "Poll failed for ...")
    "unparsable": "max_batch_size: [",
    "misnamed": 'name: "another" backend: "python"',
    "negative_batch": 'backend: "python" max_batch_size: -1',
    "preferred_too_large": 'backend: "python" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }',
}


def test_configs_refused_while_polling_leave_the_server_ready(tmp_path):
    """Checked side by side with Triton 2.51 (--exit-on-error=false): such a model never enters its
    lifecycle, so strict readiness does not count it; the index names it, requests do not know it."""
    add_sub_model(tmp_path, "good")
    for name, config in REFUSED_WHILE_POLLING.items():
        write_config(tmp_path / name, config)
    with TritiumServer(tmp_path, "--exit-on-error=false") as running:
        assert request(running.url, "GET", "/v2/health/ready")[0] == 200
        _, _, body = request(running.url, "POST", "/v2/repository/index", {})
        assert sorted(json.loads(body), key=lambda entry: entry["name"]) == sorted(
            [{"name": name} for name in REFUSED_WHILE_POLLING] + [{"name": "good", "version": "1", "state": "READY"}],
            key=lambda entry: entry["name"])
        for name in REFUSED_WHILE_POLLING:
            status, _, body = request(running.url, "GET", f"/v2/models/{name}")
            assert (status, error_of(body)) == (404, f"Request for unknown model: '{name}' is not found")
        with grpcclient.InferenceServerClient(running.grpc_url) as client, \
                pytest.raises(InferenceServerException) as failure:
            client.get_model_metadata("unparsable")
        assert (failure.value.status(), failure.value.message()) == (
            "StatusCode.NOT_FOUND", "Request for unknown model: 'unparsable' is not found")
        assert "model misnamed failed to load" in running.logs()


def test_an_instance_that_cannot_initialize_is_not_restarted(tolerant_server):
    assert "instance bad_file_0_0 of model bad_file version 1 failed: InvalidGraph" in tolerant_server.logs()
    # Longer than the first restart backoff (1 s): no process for the model comes back.
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert not [p for p in instance_processes(tolerant_server) if p["env"].get("TRITIUM_MODEL") == "bad_file/1"
                    and time.monotonic() > deadline - 2.0]
        time.sleep(0.1)
    assert tolerant_server.logs().count("started instance bad_file_0_0") == 1


def test_each_process_leads_a_group_in_serve_s_session_and_may_write_to_its_terminal(tolerant_server):
    """A signal to serve's group (Ctrl-C) reaches serve alone, a stopped server killed outright is
    continued by the kernel (its groups orphaned in the session), and a child's log line to a
    terminal with `stty tostop` does not stop it: SIGTTOU is ignored in every child."""
    serve = tolerant_server.process.pid
    processes = descendants(serve)
    assert len(processes) >= 4   # broker, agent, gateway, the instances
    for pid in processes:
        assert os.getpgid(pid) == pid and os.getsid(pid) == os.getsid(serve)
        ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("SigIgn:"))
        assert int(ignored.split()[1], 16) & (1 << (signal.SIGTTOU - 1)), pid


def test_strict_readiness_false_reports_ready_despite_failed_models(repo):
    with TritiumServer(repo, "--exit-on-error=false", "--strict-readiness=false") as server:
        assert request(server.url, "GET", "/v2/health/ready")[0] == 200


def test_unknown_flags_are_an_error(repo):
    result = run_serve(repo, "--no-such-flag=1")
    assert result.returncode == 1  # tritonserver's status and first line
    assert result.stderr.splitlines()[0].endswith(b" serve: unrecognized option '--no-such-flag=1'")


# -- ports in use ------------------------------------------------------------------------------

def _held_port() -> socket.socket:
    """A port another program listens on."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def _error_lines(stderr: bytes) -> list[str]:
    return [line for line in stderr.decode().splitlines() if " E " in line or "Traceback" in line]


@pytest.mark.parametrize("service, flag", [("HTTP", "--http-port"), ("GRPC", "--grpc-port"),
                                           ("Metrics", "--metrics-port")])
def test_serve_refuses_a_port_in_use_with_one_line(repo, service, flag):
    with _held_port() as holder:
        port = holder.getsockname()[1]
        result = run_serve(repo, "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1", flag, str(port))
    assert result.returncode == 1   # Triton's status; systemd restarts after it
    [line] = _error_lines(result.stderr)
    assert line.endswith(f"failed to start {service} service: Unavailable - Socket '127.0.0.1:{port}' "
                         "already in use")


def test_a_second_serve_on_the_ports_of_a_running_one_stops_and_the_first_keeps_serving(repo):
    with TritiumServer(repo, "--exit-on-error=false", http_workers=2) as first:
        result = run_serve(repo, "--http-port", str(first.port), "--metrics-port", str(free_port()))
        assert result.returncode == 1
        [line] = _error_lines(result.stderr)
        assert line.endswith(f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{first.port}' "
                             "already in use")
        assert request(first.url, "GET", "/v2/health/live")[0] == 200


def test_two_serves_that_ask_for_it_share_the_http_port(repo):
    """Triton's --reuse-http-port: the kernel spreads the port's connections over both servers."""
    with TritiumServer(repo, "--exit-on-error=false", "--reuse-http-port=true", "--id", "first") as first:
        with TritiumServer(repo, "--exit-on-error=false", "--reuse-http-port=true", "--id", "second",
                           "--http-port", str(first.port)):
            names = {json.loads(request(first.url, "GET", "/v2")[2])["name"] for _ in range(24)}
            assert names == {"first", "second"}
        assert request(first.url, "GET", "/v2/health/live")[0] == 200


def test_a_serve_that_did_not_ask_to_share_its_port_keeps_it_from_one_that_asks(repo):
    """As in Triton, a server started with --reuse-http-port cannot join the port of one started
    without it (here with one gateway; serve's gateways share their ports with each other when
    --http-workers is above 1)."""
    with TritiumServer(repo, "--exit-on-error=false") as first:
        result = run_serve(repo, "--reuse-http-port=true", "--http-port", str(first.port))
        assert result.returncode == 1
        [line] = _error_lines(result.stderr)
        assert line.endswith(f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{first.port}' "
                             "already in use")
        assert request(first.url, "GET", "/v2/health/live")[0] == 200


def _run_part(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    return subprocess.run([sys.executable, "-m", "tritium.cli", *args], capture_output=True, timeout=60, env=env)


@pytest.mark.parametrize("service, flag", [("HTTP", "--http-port"), ("GRPC", "--grpc-port")])
def test_a_gateway_without_reuse_port_refuses_a_port_in_use(tmp_path, service, flag):
    ports = {"--http-port": str(free_port()), "--grpc-port": str(free_port())}
    with _held_port() as holder:
        ports[flag] = str(holder.getsockname()[1])
        result = _run_part("gateway", "--broker", f"ipc://{tmp_path}/nobody", "--http-address", "127.0.0.1",
                           "--grpc-address", "127.0.0.1", *[x for item in ports.items() for x in item])
    assert result.returncode == 1
    [line] = _error_lines(result.stderr)
    assert line.endswith(f"failed to start {service} service: Unavailable - Socket '127.0.0.1:{ports[flag]}' "
                         "already in use")


def test_a_broker_refuses_a_metrics_port_in_use_with_one_line(tmp_path):
    with _held_port() as holder:
        port = holder.getsockname()[1]
        (tmp_path / "models").mkdir()
        result = _run_part("broker", "--model-repository", str(tmp_path / "models"), "--frontend", f"ipc://{tmp_path}/f",
                           "--backend", f"ipc://{tmp_path}/b", "--metrics-address", "127.0.0.1",
                           "--metrics-port", str(port))
    assert result.returncode == 1
    [line] = _error_lines(result.stderr)
    assert line.endswith(f"failed to start Metrics service: Unavailable - Socket '127.0.0.1:{port}' already in use")


# -- shutdown ------------------------------------------------------------------------------------

def test_a_clean_shutdown_logs_no_warning_about_peers_that_left(repo):
    # Heartbeats every 0.1 s: the broker beats several times between its gateways' exit and its own.
    server = TritiumServer(repo, "--exit-on-error=false", "--heartbeat-interval-secs", "0.1", http_workers=2)
    assert server.stop() == 0
    logs = server.log_path.read_text()
    assert "gateway stopped" in logs and "broker stopping" in logs
    assert "cannot send to peer" not in logs and "Host unreachable" not in logs


def test_allow_http_false_serves_grpc_only(repo):
    import numpy as np
    import tritonclient.grpc as grpcclient

    with TritiumServer(repo, "--exit-on-error=false", "--allow-http=false") as server:
        assert "http=" not in server.ready_line and f"grpc=127.0.0.1:{server.grpc_port}" in server.ready_line
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
        for item in inputs:
            item.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
        result = client.infer("good", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0 * i for i in range(16)]]
        client.close()


def test_a_gateway_the_broker_refuses_exits_with_the_protocol_mismatch_code(tmp_path):
    from tests.scripted_peers import ScriptedBroker
    from tritium.exit_codes import ExitCode
    from tritium.protocol import Kind, Refused

    broker = ScriptedBroker(f"ipc://{tmp_path}/frontend")
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    gateway = subprocess.Popen([sys.executable, "-m", "tritium.cli", "gateway", "--broker", broker.address,
                                "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--allow-grpc", "false"],
                               env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not any(r.header["k"] == Kind.HELLO for r in broker.pump()):
            assert time.monotonic() < deadline, "the gateway never said HELLO"
            time.sleep(0.02)
        hello = next(r for r in broker.received if r.header["k"] == Kind.HELLO)
        broker.tell(hello.peer, Refused("protocol version 6 is not this broker's 7"))
        assert gateway.wait(timeout=30) == ExitCode.PROTOCOL_MISMATCH
        assert "the broker refused this gateway: protocol version 6 is not this broker's 7" in gateway.stderr.read().decode()
    finally:
        gateway.kill()
        broker.close()


def _serve_threads(serve: int) -> dict[str, set[int]]:
    """Each process role of a serve ("gateway", "broker", "worker", "instance") and the CPUs its
    threads may run on."""
    roles = {b"gateway": "gateway", b"broker": "broker", b"worker": "worker", b"tritium.workers.instance": "instance"}
    found: dict[str, set[int]] = {}
    for pid in descendants(serve):
        entry = Path("/proc") / str(pid)
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            role = next((name for word, name in roles.items() if word in argv), None)
            if role is None:
                continue
            for thread in (entry / "task").iterdir():
                allowed = (thread / "status").read_text().split("Cpus_allowed_list:")[1].split()[0]
                found.setdefault(role, set()).update(parse_cpu_list(allowed))
        except (OSError, IndexError):
            continue
    return found


def _adds(server) -> None:
    status, _, body = request(server.url, "POST", "/v2/models/good/infer", {"inputs": [
        {"name": name, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")]})
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2.0 * i for i in range(16)]


def test_each_part_runs_on_the_cpus_serve_was_given(repo):
    last = max(os.sched_getaffinity(0))
    with TritiumServer(repo, "--exit-on-error=false", "--gateway-cpus", "0", "--broker-cpus", str(last),
                       "--worker-cpus", str(last)) as server:
        _adds(server)
        assert _serve_threads(server.process.pid) == {
            "gateway": {0}, "broker": {last}, "worker": {last}, "instance": {last}}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a split layout needs two CPUs")
def test_a_split_layout_runs_the_gateway_on_a_cpu_of_its_own_the_broker_on_the_others_the_instances_anywhere(repo):
    every = os.sched_getaffinity(0)
    first, *others = sorted(every)
    with TritiumServer(repo, "--exit-on-error=false", "--cpu-layout", "split", "--http-workers", "1") as server:
        _adds(server)
        assert _serve_threads(server.process.pid) == {
            "gateway": {first}, "broker": set(others), "worker": every, "instance": every}


def test_a_cpu_this_host_lacks_is_a_usage_error(repo):
    missing = max(os.sched_getaffinity(0)) + 1
    result = run_serve(repo, "--worker-cpus", f"0,{missing}", timeout_s=60)
    assert result.returncode == 2
    assert f"Invalid value for '--worker-cpus': CPU {missing} is not available here" in result.stderr.decode()
