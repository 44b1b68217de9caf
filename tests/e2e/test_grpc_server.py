"""tritium's own gRPC server (HTTP/2 on the gateway's event loop): what real clients ask of it
(compression, deadlines, many calls on one connection, the drain) and the edge cases only a
raw HTTP/2 client produces (tests/e2e/rawh2.py). grpc.aio stays selectable with --grpc-server=grpcio.
"""

from __future__ import annotations

import asyncio
import queue
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.grpc_requests import (SERVING, add_sub_request, check_add_sub, health_check, health_watch,
                                     whoami_request)
from tests.e2e.rawh2 import (CANCEL_CODE, DATA, END_STREAM, GOAWAY, INITIAL_WINDOW_SIZE, PING, RST_STREAM, SETTINGS,
                             WINDOW_UPDATE, RawH2, grpc_message)
from tests.models import add_sub_model
from tests.servers import TritiumServer, descendants
from tritium.exit_codes import ExitCode

WHOAMI = Path(__file__).parent / "cluster_repo" / "whoami"   # answers after DELAY_MS
LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=4096)
    shutil.copytree(WHOAMI, repo / "whoami")
    with TritiumServer(repo, f"--grpc-max-message-size={LIMIT}") as running:
        yield running


@pytest.fixture
def raw(server):
    connection = RawH2(server.grpc_url)
    yield connection
    connection.close()


# -- what real clients ask ---------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_read(server, algorithm):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    inputs = [grpcclient.InferInput(name, [4, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer("add_sub", inputs, compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))


def test_messages_spanning_many_frames_and_windows_arrive_whole(server):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request, a, b = add_sub_request(rows=4096)   # 512 KiB each way: past the initial 64 KiB windows
    for _ in range(3):
        check_add_sub(stub.ModelInfer(request, timeout=20), a, b)


def test_a_client_timeout_is_deadline_exceeded_and_the_server_keeps_serving(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    delay = grpcclient.InferInput("DELAY_MS", [1, 1], "FP32")
    delay.set_data_from_numpy(np.array([[1500]], np.float32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as failure:
        client.infer("whoami", [delay], client_timeout=0.3)
    assert failure.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 1.2
    delay.set_data_from_numpy(np.array([[0]], np.float32))
    assert client.infer("whoami", [delay]).as_numpy("PID").shape == (1, 1)


def test_the_server_ends_a_call_at_its_grpc_timeout(raw):
    started = time.monotonic()
    answer = raw.call("ModelInfer", whoami_request(1500), extra_headers=(("grpc-timeout", "200m"),))
    assert (answer.status, answer.message) == (grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "Deadline Exceeded")
    assert time.monotonic() - started < 1.2
    assert raw.call("ServerLive", b"").status == 0   # the connection goes on


def test_many_concurrent_calls_on_one_connection(server):
    async def run() -> list:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            requests = [add_sub_request(rows=1 + i % 3, seed=i) for i in range(300)]
            responses = await asyncio.gather(*(stub.ModelInfer(request) for request, _, _ in requests))
            return list(zip(responses, requests))

    pairs = asyncio.run(run())
    for response, (_, a, b) in pairs:
        check_add_sub(response, a, b)


def test_aio_stream_answers_every_request(server):
    async def run() -> int:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def requests():
                for i in range(20):
                    tensor = grpcaio.InferInput("DELAY_MS", [1, 1], "FP32")
                    tensor.set_data_from_numpy(np.array([[0]], np.float32))
                    yield {"model_name": "whoami", "inputs": [tensor], "request_id": str(i)}
            ids = set()
            async for result, error in client.stream_infer(requests()):
                assert error is None
                ids.add(result.get_response().id)
                if len(ids) == 20:
                    break
            return len(ids)
        finally:
            await client.close()

    assert asyncio.run(run()) == 20


# -- what only a raw HTTP/2 client does --------------------------------------------------------

def test_a_message_over_the_limit_is_refused_from_its_prefix(raw):
    stream_id = raw.start_call("ModelInfer")
    too_big = LIMIT + 1000
    raw.send(DATA, 0, stream_id, too_big.to_bytes(5, "big"))   # the prefix alone: no body is sent
    answer = raw.wait(stream_id)
    assert answer.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert answer.message == f"Received message larger than max ({too_big} vs. {LIMIT})"
    request, a, b = add_sub_request()
    good = raw.call("ModelInfer", request.SerializeToString())
    assert good.status == 0
    check_add_sub(service_pb2.ModelInferResponse.FromString(good.messages[0]), a, b)


def test_grpc_python_sees_resource_exhausted_with_grpc_s_text(server):
    request, _, _ = add_sub_request(rows=LIMIT // 64)   # 2 x LIMIT/4 bytes of inputs: over the limit
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(request, timeout=10)
    assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failure.value.details().startswith("Received message larger than max (")


def test_metadata_past_grpcs_hard_limit_fails_its_call_alone(server):
    """As Triton's gRPC library refuses it: RESOURCE_EXHAUSTED for that call, with the sizes;
    the connection and a stream open on it go on, and metadata within the limit is served."""
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    requests: queue.Queue = queue.Queue()
    stream = stub.ModelStreamInfer(iter(requests.get, None), timeout=30)
    request, a, b = add_sub_request()
    requests.put(request)
    check_add_sub(next(stream).infer_response, a, b)
    assert stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=[("x-big", "a" * 15000)], timeout=10).live
    with pytest.raises(grpc.RpcError) as failure:
        stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=[("x-big", "a" * 70000)], timeout=10)
    assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    size = int(failure.value.details().split("(")[1].split()[0])
    assert failure.value.details() == f"received metadata size exceeds hard limit ({size} vs. 16384)"
    assert 70000 + len("x-big") + 32 < size < 71000
    requests.put(request)   # the stream opened before still answers, on the same connection
    check_add_sub(next(stream).infer_response, a, b)
    requests.put(None)
    channel.close()


@pytest.mark.parametrize("payload, message", [
    (b"\x07\x00\x00\x00\x02ab", "invalid message flag 7: expected 0 or 1"),
    (b"\x00\x00\x00\x00\x64" + b"x" * 10, "the request stream ended inside a message"),
    (b"\x01\x00\x00\x00\x02ab", "a compressed message with grpc-encoding 'identity', which this server cannot read"),
])
def test_a_malformed_message_is_internal_and_the_connection_goes_on(raw, payload, message):
    stream_id = raw.start_call("ModelInfer")
    raw.send(DATA, END_STREAM, stream_id, payload)
    answer = raw.wait(stream_id)
    assert (answer.status, answer.message) == (grpc.StatusCode.INTERNAL.value[0], message)
    assert raw.call("ServerReady", b"").status == 0


def test_a_call_reset_in_mid_request_leaves_the_connection_serving(raw, server):
    request, a, b = add_sub_request(rows=64)
    body = grpc_message(request.SerializeToString())
    stream_id = raw.start_call("ModelInfer")
    raw.send(DATA, 0, stream_id, body[:100])
    raw.send(RST_STREAM, 0, stream_id, CANCEL_CODE.to_bytes(4, "big"))
    slow = raw.start_call("ModelInfer")          # reset while the broker holds it
    raw.send(DATA, END_STREAM, slow, grpc_message(whoami_request(300)))
    raw.send(RST_STREAM, 0, slow, CANCEL_CODE.to_bytes(4, "big"))
    good = raw.call("ModelInfer", request.SerializeToString())
    check_add_sub(service_pb2.ModelInferResponse.FromString(good.messages[0]), a, b)
    time.sleep(0.5)   # the reset call's answer arrives and is dropped
    assert raw.call("ServerLive", b"").status == 0
    assert "Traceback" not in server.logs()


def test_a_deadline_passing_while_a_response_is_half_sent_cancels_the_stream(server):
    """Trailers after part of a message would end it midway: the stream is reset, the connection goes on."""
    raw = RawH2(server.grpc_url, settings={INITIAL_WINDOW_SIZE: 1000})
    try:
        request, _, _ = add_sub_request(rows=2048)   # 256 KiB of outputs, 1,000 bytes of window
        stream_id = raw.start_call("ModelInfer", (("grpc-timeout", "300m"),))
        raw.send(DATA, END_STREAM, stream_id, grpc_message(request.SerializeToString()))
        answer = raw.wait(stream_id)
        assert answer.reset == CANCEL_CODE
        assert sum(len(f[3]) for f in raw.frames if f[0] == DATA and f[2] == stream_id) == 1000
        assert [block for block in answer.headers if any(name == b"grpc-status" for name, _ in block)] == []
        assert raw.call("ServerLive", b"").status == 0
    finally:
        raw.close()


def _data_sent_within(raw: RawH2, window: int) -> int:
    """The DATA bytes the server sends once ``window`` have arrived and it had time for more."""
    while sum(len(f[3]) for f in raw.frames if f[0] == DATA) < window:
        raw.read_some()
    time.sleep(0.3)
    raw.sock.setblocking(False)
    try:
        raw.read_some()
    except BlockingIOError:
        pass
    raw.sock.settimeout(10)
    return sum(len(f[3]) for f in raw.frames if f[0] == DATA)


def test_a_response_waits_for_the_client_s_window(server):
    raw = RawH2(server.grpc_url, settings={INITIAL_WINDOW_SIZE: 1000})
    try:
        request, a, b = add_sub_request(rows=2048)   # 256 KiB of outputs
        stream_id = raw.start_call("ModelInfer")
        raw.send(DATA, END_STREAM, stream_id, grpc_message(request.SerializeToString()))
        assert _data_sent_within(raw, 1000) == 1000   # no more than the window
        for target in (0, stream_id):
            raw.send(WINDOW_UPDATE, 0, target, (1 << 24).to_bytes(4, "big"))
        answer = raw.wait(stream_id)
        assert answer.status == 0
        check_add_sub(service_pb2.ModelInferResponse.FromString(answer.messages[0]), a, b)
    finally:
        raw.close()


def test_calls_waiting_on_the_connection_window_all_resume_when_it_grows(server):
    """Two answers larger than the connection's window (65,535 bytes, the streams' own windows
    wide): the first fills it, and one connection WINDOW_UPDATE lets both finish."""
    raw = RawH2(server.grpc_url, settings={INITIAL_WINDOW_SIZE: 1 << 24})
    try:
        calls = []
        for _ in range(2):
            request, a, b = add_sub_request(rows=2048)   # 256 KiB of outputs each
            stream_id = raw.start_call("ModelInfer")
            raw.send(DATA, END_STREAM, stream_id, grpc_message(request.SerializeToString()))
            calls.append((stream_id, a, b))
        assert _data_sent_within(raw, 65535) == 65535   # no more than the window
        raw.send(WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big"))
        for stream_id, a, b in calls:
            answer = raw.wait(stream_id)
            assert answer.status == 0
            check_add_sub(service_pb2.ModelInferResponse.FromString(answer.messages[0]), a, b)
    finally:
        raw.close()


def test_ping_is_acknowledged_with_its_payload(raw):
    raw.send(PING, 0, 0, b"tritium!")
    while not any(f[0] == PING for f in raw.frames):
        raw.read_some()
    assert [f for f in raw.frames if f[0] == PING] == [(PING, 1, 0, b"tritium!")]


def test_a_client_that_speaks_no_http2_gets_a_goaway_and_the_server_goes_on(server):
    with socket.create_connection(server.grpc_url.rsplit(":", 1), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    kinds = []
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        kinds.append(received[3])
        received = received[9 + length:]
    assert kinds == [SETTINGS, WINDOW_UPDATE, GOAWAY]
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()


def test_binary_metadata_that_is_not_base64_is_a_client_error_on_a_stream(raw):
    request, a, b = add_sub_request()
    answer = raw.call("ModelStreamInfer", request.SerializeToString(), extra_headers=(("x-key-bin", "a"),))
    assert (answer.status, answer.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                               "metadata 'x-key-bin' is not valid base64")
    good = raw.call("ModelStreamInfer", request.SerializeToString(), extra_headers=(("x-key-bin", "YWI"),))
    assert good.status == 0
    (message,) = good.messages
    check_add_sub(service_pb2.ModelStreamInferResponse.FromString(message).infer_response, a, b)


def test_an_unknown_method_is_unimplemented(raw):
    answer = raw.call("NoSuchMethod", b"")
    assert answer.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert "NoSuchMethod" in answer.message


# -- the drain, and grpc.aio kept selectable ----------------------------------------------------

def call_in_flight(running: TritiumServer, delay_ms: int) -> tuple[threading.Thread, list]:
    """A call to whoami taking ``delay_ms``, running 0.3 s by the return; its outcome ("answered",
    or the error's status) lands in the list."""
    client = grpcclient.InferenceServerClient(running.grpc_url)
    delay = grpcclient.InferInput("DELAY_MS", [1, 1], "FP32")
    delay.set_data_from_numpy(np.array([[delay_ms]], np.float32))
    outcome: list = []

    def call() -> None:
        try:
            client.infer("whoami", [delay])
            outcome.append("answered")
        except InferenceServerException as exc:
            outcome.append(exc.status())

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(0.3)
    return caller, outcome


@pytest.mark.parametrize("to_group, stop_signal", [(False, signal.SIGTERM), (True, signal.SIGINT),
                                                   (True, signal.SIGTERM)])
def test_sigterm_finishes_calls_in_flight_then_refuses(tmp_path, to_group, stop_signal):
    """Also when the signal goes to the whole process group (Ctrl-C in a terminal sends SIGINT so,
    `kill -- -PGID` SIGTERM): serve alone must get it and stop its children in order, or the
    instance dies with its request."""
    shutil.copytree(WHOAMI, tmp_path / "whoami")
    with TritiumServer(tmp_path) as running:
        caller, outcome = call_in_flight(running, delay_ms=1000)
        if to_group:
            os.killpg(running.process.pid, stop_signal)
        else:
            running.process.send_signal(stop_signal)
        caller.join(timeout=10)
        assert outcome == ["answered"]
        assert running.process.wait(timeout=20) == 0
        assert "KeyboardInterrupt" not in running.logs() and "second stop signal" not in running.logs()
        with pytest.raises(InferenceServerException) as failure:
            grpcclient.InferenceServerClient(running.grpc_url).is_server_live()
        assert failure.value.status() == "StatusCode.UNAVAILABLE"


def test_a_second_ctrl_c_ends_every_process_at_once(tmp_path):
    shutil.copytree(WHOAMI, tmp_path / "whoami")
    with TritiumServer(tmp_path) as running:
        caller, outcome = call_in_flight(running, delay_ms=5000)
        children = descendants(running.process.pid)
        os.killpg(running.process.pid, signal.SIGINT)
        time.sleep(0.3)
        started = time.monotonic()
        os.killpg(running.process.pid, signal.SIGINT)
        assert running.process.wait(timeout=20) == ExitCode.FORCED
        assert time.monotonic() - started < 3   # not the 5 s the request would have taken
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
        caller.join(timeout=10)
        assert outcome == ["StatusCode.UNAVAILABLE"]   # cut short, not answered


def test_ctrl_z_stops_every_process_and_fg_resumes_them_all(tmp_path):
    """The terminal's SIGTSTP reaches serve alone (its children lead process groups of their own):
    serve stops them with itself. Stopped for longer than the heartbeats' limit, none takes
    another's silence for a loss once continued."""
    shutil.copytree(WHOAMI, tmp_path / "whoami")
    with TritiumServer(tmp_path) as running:
        server = [running.process.pid, *descendants(running.process.pid)]
        assert len(server) >= 5   # serve, broker, agent, gateway, the instance

        def states() -> set[str]:
            return {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in server}

        os.killpg(running.process.pid, signal.SIGTSTP)
        deadline = time.monotonic() + 10
        while states() != {"T"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states() == {"T"}
        time.sleep(4)   # past the 3 s a silent peer is given
        os.killpg(running.process.pid, signal.SIGCONT)   # the shell's fg
        caller, outcome = call_in_flight(running, delay_ms=0)
        caller.join(timeout=10)
        assert outcome == ["answered"]
        assert "T" not in states()
        logs = running.logs()
        assert "stopped answering heartbeats" not in logs and "lost contact" not in logs
        assert "has not answered" not in logs


def test_sigterm_answers_a_stream_s_request_in_flight_then_ends_the_stream(tmp_path):
    shutil.copytree(WHOAMI, tmp_path / "whoami")
    with TritiumServer(tmp_path) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        delay = grpcclient.InferInput("DELAY_MS", [1, 1], "FP32")
        delay.set_data_from_numpy(np.array([[1000]], np.float32))
        client.async_stream_infer("whoami", [delay], request_id="in-flight")
        time.sleep(0.3)
        running.process.send_signal(signal.SIGTERM)
        result, error = answers.get(timeout=10)
        assert error is None and result.get_response().id == "in-flight"
        assert result.as_numpy("PID").shape == (1, 1)
        client.stop_stream()   # the client ends its side; the server, drained, exits
        assert running.process.wait(timeout=30) == 0


def test_grpcio_stays_selectable(tmp_path):
    add_sub_model(tmp_path, "add_sub")
    with TritiumServer(tmp_path, "--grpc-server=grpcio") as running:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(running.grpc_url))
        request, a, b = add_sub_request(rows=2)
        check_add_sub(stub.ModelInfer(request, timeout=10), a, b)
        (streamed,) = list(stub.ModelStreamInfer(iter([request]), timeout=10))
        check_add_sub(streamed.infer_response, a, b)
        _check_stream_errors(stub, request, a, b)
        _check_health(running.grpc_url)


def test_the_grpc_health_checking_protocol_is_served_as_by_triton(server):
    _check_health(server.grpc_url)


def _check_health(url: str) -> None:
    """Check answers SERVING while the server is ready, whatever service it names; Watch is not
    served; a request that is no HealthCheckRequest gets Triton's parse error (the bytes and the
    codes that Triton 2.51 answers with)."""
    assert health_check(url) == SERVING
    assert health_check(url, "inference.GRPCInferenceService") == health_check(url, "foo") == SERVING
    assert health_watch(url).code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as failure:
        health_check(url, body=b"\xff\xff\xff")
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")


def test_a_stream_error_is_a_response_or_with_triton_grpc_error_the_call_s_status(server):
    request, a, b = add_sub_request(rows=2)
    _check_stream_errors(service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url)), request, a, b)


def _check_stream_errors(stub, request, a, b) -> None:
    unknown = service_pb2.ModelInferRequest(model_name="nope")
    answers = list(stub.ModelStreamInfer(iter([request, unknown, request]), timeout=10))
    assert len(answers) == 3
    (error,) = [answer.error_message for answer in answers if answer.error_message]
    assert "nope" in error
    for answer in [answer for answer in answers if not answer.error_message]:
        check_add_sub(answer.infer_response, a, b)
    with pytest.raises(grpc.RpcError) as failure:
        list(stub.ModelStreamInfer(iter([unknown, request]), timeout=10, metadata=[("triton_grpc_error", "true")]))
    assert failure.value.code() != grpc.StatusCode.OK and "nope" in failure.value.details()
