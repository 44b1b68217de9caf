"""Triton Python models (model.py) served unchanged: execute, errors, BLS, decoupled, execute_batch."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.grpc_requests import stream_count
from tests.e2e.rawhttp import error_of, request
from tests.models import add_sub_model
from tests.servers import TritiumServer, instance_processes

MODELS = Path(__file__).parent / "python_repo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODELS, repo, dirs_exist_ok=True)
    add_sub_model(repo, "onnx_add_sub", max_batch_size=8)
    with TritiumServer(repo, "--exit-on-error=false") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


def tensor(name, array, datatype=None):
    t = httpclient.InferInput(name, list(array.shape), datatype or httpclient.np_to_triton_dtype(array.dtype))
    t.set_data_from_numpy(array)
    return t


def test_add_sub_written_for_triton_runs_unchanged(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    result = client.infer("py_add_sub", [tensor("INPUT0", a), tensor("INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.get_model_metadata("py_add_sub")["platform"] == "python"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_and_other_datatypes_in_and_out(client, binary):
    text = np.array([b"triton", b"", "\u00e9t\u00e9".encode()], dtype=np.object_)
    numbers = np.array([1, -5, 2**31 - 2], dtype=np.int32)
    flags = np.array([True, False], dtype=np.bool_)
    halves = np.array([0.5, 1.25], dtype=np.float16)
    big = np.array([2**64 - 1, 1], dtype=np.uint64)
    inputs = []
    for name, array in (("IN_BYTES", text), ("IN_INT32", numbers), ("IN_BOOL", flags),
                        ("IN_FP16", halves), ("IN_UINT64", big)):
        t = httpclient.InferInput(name, list(array.shape), httpclient.np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array, binary_data=binary or name == "IN_FP16")
        inputs.append(t)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary or n == "OUT_FP16")
               for n in ("OUT_BYTES", "OUT_INT32", "OUT_BOOL", "OUT_FP16", "OUT_UINT64")]
    result = client.infer("py_types", inputs, outputs=outputs)
    upper = [t.upper() for t in text]
    returned = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("OUT_BYTES")]
    assert returned == upper
    np.testing.assert_array_equal(result.as_numpy("OUT_INT32"), numbers + 1)
    np.testing.assert_array_equal(result.as_numpy("OUT_BOOL"), ~flags)
    np.testing.assert_array_equal(result.as_numpy("OUT_FP16"), halves * 2)
    np.testing.assert_array_equal(result.as_numpy("OUT_UINT64"), big - 1)


def _code(client, code):
    return client.infer("py_errors", [tensor("CODE", np.array([code], dtype=np.int32))])


@pytest.mark.parametrize("code, status, message", [
    (1, "400", "failed with code 1"),
    (2, "500", "failed with the default code"),
    (3, "404", "failed with code 3"),
    (5, "501", "failed with code 5"),
    (6, "503", "failed with code 6"),
    (4, "500", "Failed to process the request(s) for model 'py_errors_0', message: "
               "TritonModelException: the model raised on purpose\n\nAt:\n  "),
    (7, "500", "Failed to process the request(s) for model 'py_errors_0', message: SystemExit: 3\n\nAt:\n  "),
])
def test_errors_from_the_model_get_their_status_and_the_model_keeps_serving(client, code, status, message):
    with pytest.raises(InferenceServerException) as error:
        _code(client, code)
    assert error.value.status() == status
    assert message in error.value.message()
    assert _code(client, 0).as_numpy("ECHO").tolist() == [0]


def own_client(server):
    """A client per thread: tritonclient's HTTP client is not shared across threads. Close it in
    the thread that made it (``with``): collected elsewhere, its gevent pool fails in ``__del__``."""
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


def test_an_execution_that_fails_counts_as_an_execution_as_triton_s_python_backend_counts_it(client):
    def counts():
        stats = client.get_inference_statistics("py_errors")["model_stats"][0]
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        return (stats["execution_count"], stats["inference_stats"]["fail"]["count"],
                stats["inference_stats"]["success"]["count"], sizes.get(1, 0))
    before = counts()
    with pytest.raises(InferenceServerException):
        _code(client, 4)   # execute raises
    after = counts()
    assert [a - b for a, b in zip(after, before)] == [1, 1, 0, 1]


def test_an_error_response_fails_only_its_own_request(server):
    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda c: _outcome(server, c), [0, 1, 0, 2, 0, 0]))
    assert outcomes == ["ok", "400", "ok", "500", "ok", "ok"]


def _outcome(server, code):
    try:
        with own_client(server) as client:
            _code(client, code)
        return "ok"
    except InferenceServerException as exc:
        return exc.status()


def test_initialize_failure_fails_the_load_with_its_message(server, client):
    status, _, body = request(server.url, "GET", "/v2/models/py_init_fails/ready")
    assert status == 400
    assert "instance py_init_fails" in server.logs()
    assert "Internal: RuntimeError: cannot find the weights file\n\nAt:\n  " in server.logs()
    assert "py_init_fails/1/model.py(3): initialize" in server.logs()
    assert client.is_model_ready("py_add_sub")


def test_auto_complete_config_shapes_the_served_model(client):
    config = client.get_model_config("py_autocomplete")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [2])]
    x = np.array([[1.5, -2.0]], dtype=np.float32)
    np.testing.assert_array_equal(client.infer("py_autocomplete", [tensor("X", x)]).as_numpy("Y"), x * x)


def test_initialize_gets_triton_args_and_requests_their_id_and_parameters(client, server):
    result = client.infer("py_args", [tensor("X", np.array([1], dtype=np.int32))], request_id="r-9",
                          parameters={"temperature": 0.5, "mode": "fast"})
    args = json.loads(result.as_numpy("ARGS")[0])
    assert sorted(args) == ["model_config", "model_instance_device_id", "model_instance_kind",
                            "model_instance_name", "model_name", "model_repository", "model_version"]
    assert (args["model_name"], args["model_version"], args["model_instance_kind"]) == ("py_args", "1", "CPU")
    assert args["model_instance_name"] == "py_args_0" and args["model_instance_device_id"] == "0"  # as Triton
    assert args["model_repository"].endswith("/py_args")
    config = json.loads(args["model_config"])
    assert config["parameters"] == {"greeting": {"string_value": "hello"}}
    seen = json.loads(result.as_numpy("ENV")[0])
    assert seen["request_id"] == "r-9"
    assert seen["parameters"] == {"temperature": 0.5, "mode": "fast"}
    assert sorted(seen["requested"]) == ["ARGS", "ENV"]
    assert seen["timeout"] == 0
    assert seen["argv"] == [""]   # as in Triton's stub: a model may run unittest.main() or argparse
    assert seen["own_module"] == "py_args"   # its metrics.py, not one of tritium's
    assert seen["model_dir"] == args["model_repository"] + "/1"   # pb_utils.get_model_dir(): the version folder


def test_priority_and_timeout_are_request_fields_not_parameters_the_model_sees(client):
    result = client.infer("py_args", [tensor("X", np.array([1], dtype=np.int32))], priority=1, timeout=1000,
                          parameters={"mode": "fast"})
    seen = json.loads(result.as_numpy("ENV")[0])
    assert (seen["parameters"], seen["timeout"]) == ({"mode": "fast"}, 1000)   # request.timeout(), as Triton's


def test_a_headers_parameter_reaches_the_model_as_in_triton(server):
    # tritonclient refuses to send it (its name is reserved for forwarded headers); Triton's server takes it
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {"headers": "h", "mode": "slow"}}
    status, _, reply = request(server.url, "POST", "/v2/models/py_args/infer", body)
    assert status == 200, reply
    (env,) = [output["data"][0] for output in json.loads(reply)["outputs"] if output["name"] == "ENV"]
    assert json.loads(env)["parameters"] == {"headers": "h", "mode": "slow"}


@pytest.mark.parametrize("target", ["onnx_add_sub", "py_add_sub"])
def test_bls_calls_an_onnx_and_a_python_model(client, target):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = client.infer("bls", [tensor("A", a), tensor("MODEL", np.array([target.encode()], dtype=np.object_), "BYTES")])
    np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * a)


def test_large_bls_inputs_cross_in_shared_memory_each_call_its_own(server, client):
    """Three 400 KB calls in flight at once, eight requests in a row: each answer is its call's
    (the caller's slots are reused only once answered), and the called model's instance read
    them from the caller's shared memory, which it maps."""
    rng = np.random.default_rng(5)
    for _ in range(8):
        a = rng.standard_normal(100_000).astype(np.float32)
        result = client.infer("bls_large", [tensor("IN", a)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (a * np.float32(1) + a * np.float32(2)) + a * np.float32(3))
    (echo,) = [p for p in instance_processes(server) if p["env"].get("TRITIUM_MODEL") == "py_echo/1"]
    maps = Path(f"/proc/{echo['pid']}/maps").read_text()
    assert "memfd:tritium-tensors" in maps
    # The caller's pool for its calls' inputs is in /metrics (kind bls), labelled by its instance:
    # 64 MiB, nothing held once the calls are answered, nothing sent as bytes, never renewed.
    deadline = time.monotonic() + 10
    while (pools := _bls_pools(server)) != {"bls_large": [64.0 * (1 << 20), 0.0, 0.0, 0.0]}:
        assert time.monotonic() < deadline, pools
        time.sleep(0.2)


def _bls_pools(server) -> dict[str, list[float]]:
    """The model of each instance with a pool for BLS inputs -> its size, bytes in use, tensors sent as
    bytes and renewals, from /metrics."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found: dict[str, list[float]] = {}
    for name in ("bytes", "used_bytes", "overflows_total", "renewals_total"):
        for process, value in re.findall(rf'^tritium_tensor_pool_{name}{{kind="bls",process="([^"]*)"}} (\S+)$',
                                         text, re.M):
            found.setdefault(process.split("/")[1], []).append(float(value))
    return found


@pytest.mark.parametrize("timeout_us, third", [(100_000, "Request timeout expired"), (0, "ok")])
def test_a_bls_call_s_timeout_limits_its_wait_in_the_called_model_s_queue(client, timeout_us, third):
    """InferenceRequest(timeout=) is the request's timeout, as a client's: the called model's
    queue policy lets it lower the default (allow_timeout_override) and rejects it once spent."""
    result = client.infer("bls_timeout", [tensor("TIMEOUT_US", np.array([timeout_us], dtype=np.int64), "INT64")])
    outcomes = [outcome.decode() for outcome in result.as_numpy("OUTCOMES")]
    assert outcomes[:2] == ["ok", "ok"] and third in outcomes[2], outcomes


def test_bls_error_from_the_called_model_reaches_the_caller(client):
    a = np.ones((1, 16), dtype=np.float32)
    with pytest.raises(InferenceServerException) as error:
        client.infer("bls", [tensor("A", a), tensor("MODEL", np.array([b"no_such_model"], dtype=np.object_), "BYTES")])
    assert ("calling no_such_model failed: Model no_such_model - Error when running inference: Request for "
            "unknown model: 'no_such_model' is not found") in error.value.message()   # Triton's words
    np.testing.assert_array_equal(
        client.infer("bls", [tensor("A", a), tensor("MODEL", np.array([b"onnx_add_sub"], dtype=np.object_), "BYTES")]).as_numpy("SUM"),
        2 * a)


def test_async_execute_with_async_exec_calls_two_models_at_once(client):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = client.infer("bls_async", [tensor("A", a)])
    np.testing.assert_array_equal(result.as_numpy("FROM_ONNX"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("FROM_PYTHON"), 2 * a)


def test_async_exec_calls_to_one_model_answered_in_one_batch_each_get_their_answer(server):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    quick = httpclient.InferenceServerClient(server.url, network_timeout=20)   # a lost answer: no reply at all

    def counts():
        stats = quick.get_inference_statistics("py_add_sub")["model_stats"][0]
        return int(stats["inference_count"]), int(stats["execution_count"])

    before = counts()
    for _ in range(3):
        sums = quick.infer("bls_gather", [tensor("A", a)]).as_numpy("SUMS")
        np.testing.assert_array_equal(sums, np.concatenate([a * k + a for k in range(6)]))
    inferences, executions = (after - first for after, first in zip(counts(), before))
    assert inferences == 18 and executions < 18, "the calls never shared a batch"


@pytest.mark.parametrize("case, error", [
    ("single answer of a decoupled model",
     "Model py_decoupled - Error when running inference: Model py_decoupled is using the decoupled. The current BLS "
     "request call doesn't support models using the decoupled transaction policy. Please use 'decoupled=True' "
     "argument to the 'exec' or 'async_exec' calls for decoupled models.'"),
    ("an output the model does not have",
     "Model py_add_sub - Error when running inference: unexpected inference output 'NOPE' for model 'py_add_sub'")])
def test_a_bls_call_the_called_model_does_not_take_is_answered_with_tritons_error(client, case, error):
    """Triton 2.51 side by side: refused before the called model runs (tritium ran it and answered
    the first response, or the outputs it had). The caller's own undeclared output is left out."""
    result = client.infer("bls_misuse", [tensor("CASE", np.array([case.encode()], dtype=np.object_), "BYTES")])
    assert result.as_numpy("ERROR")[0].decode() == error
    assert result.as_numpy("OUTPUTS")[0] == 0
    assert [output["name"] for output in result.get_response()["outputs"]] == ["ERROR", "OUTPUTS"]


@pytest.mark.parametrize("count", [0, 1, 4, 7])
def test_a_decoupled_model_sends_several_responses_seen_through_bls(client, count):
    result = client.infer("bls_decoupled", [tensor("COUNT", np.array([count], dtype=np.int32))])
    assert result.as_numpy("SEEN").tolist() == list(range(count))
    # The model's final flag, sent alone, reaches the caller as a last response without outputs
    # (as from Triton 2.51: [0] for 0 responses, [1, 0] for 1, [1, 1, 1, 0] for 3).
    assert result.as_numpy("OUTPUTS").tolist() == [1] * count + [0]
    assert result.as_numpy("REPLAYED").tolist() == [count + 1]   # a second loop replays them all


def test_an_async_decoupled_bls_call_frees_the_loop_until_its_first_response_and_not_in_initialize(client):
    result = client.infer("bls_async_stream", [tensor("COUNT", np.array([3], dtype=np.int32))])
    assert result.as_numpy("SEEN").tolist() == [0, 1, 2]
    assert result.as_numpy("YIELDED").tolist() == [True]
    assert result.as_numpy("IN_INITIALIZE").tolist() == [b"BLS is only supported during the 'execute' function."]


def test_http_infer_on_a_decoupled_model_is_501(server):
    body = {"inputs": [{"name": "COUNT", "datatype": "INT32", "shape": [1], "data": [2]}]}
    status, _, reply = request(server.url, "POST", "/v2/models/py_decoupled/infer", body=body)
    assert status == 501
    assert error_of(reply) == "HTTP end point doesn't support models with decoupled transaction policy"


# -- async def execute: the model's event loop runs on between executes ----------------------

def test_a_task_an_async_execute_leaves_behind_answers_after_execute_returned(server):
    """As in Triton's stub, the event loop runs in its own thread: the task runs with no other
    request coming (it waited for the next execute's loop turn before)."""
    client = httpclient.InferenceServerClient(server.url, network_timeout=10)
    for value in (41, 7):
        result = client.infer("py_async_sender", [tensor("VALUE", np.array([value], np.int32))])
        assert result.as_numpy("OUT").tolist() == [value + 1]


def test_a_decoupled_async_execute_is_not_waited_for_so_the_next_request_runs_beside_it(server):
    """Triton runs a decoupled model's coroutine in the background: a request the first execute
    waits for reaches the model while the first is still waiting (answer 1, not 0 after 5 s)."""
    import queue

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for mode in (0, 1):
            mode_input = grpcclient.InferInput("MODE", [1], "INT32")
            mode_input.set_data_from_numpy(np.array([mode], np.int32))
            client.async_stream_infer("py_async_decoupled", [mode_input], request_id=str(mode))
        got = {}
        for _ in range(2):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("OUT").tolist()
    finally:
        client.stop_stream()
    assert got == {"0": [1], "1": [2]}


def test_a_response_sent_from_a_thread_while_execute_runs_leaves_at_once(server, tmp_path):
    """As from Triton's stub: the model's execute waits for a file the client makes only once the
    response its thread sent has come (held until execute returned, it would come after 20 s)."""
    import queue

    answers: queue.Queue = queue.Queue()
    release = tmp_path / "release"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([-4], np.int32))
        client.async_stream_infer("py_decoupled", [count], parameters={"release": str(release)})
        first, error = answers.get(timeout=15)
        assert error is None and first.as_numpy("INDEX").tolist() == [0]
        release.touch()
        second, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and second.as_numpy("INDEX").tolist() == [1]


def test_a_decoupled_async_execute_that_raises_in_the_background_answers_its_request_with_the_error(server):
    import queue

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        mode_input = grpcclient.InferInput("MODE", [1], "INT32")
        mode_input.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("py_async_decoupled", [mode_input])
        first, no_error = answers.get(timeout=30)
        _, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert no_error is None and first.as_numpy("OUT").tolist() == [3]
    assert "Failed to process the request(s) for model 'py_async_decoupled_0_0', message: ValueError: boom after " \
           "one response" in str(error)


def test_bf16_goes_through_dlpack_to_torch_and_back(client):
    import ml_dtypes

    values = np.array([1.5, -2.0, 0.25], ml_dtypes.bfloat16)
    bf16 = httpclient.InferInput("INPUT0", [3], "BF16")
    bf16.set_data_from_numpy(values)
    result = client.infer("py_bf16", [bf16])
    assert np.frombuffer(result.as_numpy("OUTPUT0").tobytes(), ml_dtypes.bfloat16).tolist() == [3.0, -4.0, 0.5]


# -- a model that is not decoupled answering through its response sender (Triton 24.06+) ---------

def _sender_mode(server, mode: int) -> tuple[int, str]:
    body = {"inputs": [{"name": "MODE", "datatype": "INT32", "shape": [1], "data": [mode]}]}
    status, _, reply = request(server.url, "POST", "/v2/models/py_sender/infer", body=body)
    return status, reply


@pytest.mark.parametrize("mode, value", [(0, 10), (1, 11), (4, 14), (6, 16), (7, 17), (5, 15), (2, 12)],
                         ids=["send-final", "send-from-a-thread-later", "send-then-return-none-entry",
                              "send-then-final-alone", "return-only", "send-and-return-keeps-the-sent",
                              "a-second-send-raises-and-the-first-stands"])
def test_a_model_that_is_not_decoupled_may_answer_through_its_response_sender(server, mode, value):
    status, reply = _sender_mode(server, mode)
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == [value]


@pytest.mark.parametrize("mode, problem", [
    (3, "TritonModelException: Unable to send response. Non-decoupled model cannot send complete final before "
        "sending a response.\n\nAt:\n  "),
    (8, "Expected a list in the execute return, found type '<class 'int'>'."),
    (9, "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:2\n"),
    (15, "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'int'>'."),
    (16, "Expected an 'InferenceResponse' object in the execute function return list, found type "
         "'<class 'c_python_backend_utils.Tensor'>'."),
    (17, "TritonModelException: Unable to send response. Unsupported flag provided.\n\nAt:\n  "),
])
def test_a_sender_or_return_misused_by_a_model_that_is_not_decoupled_fails_with_triton_s_text(server, mode, problem):
    mark = len(server.logs())
    status, reply = _sender_mode(server, mode)
    assert status == 500
    message = f"Failed to process the request(s) for model 'py_sender_0_0', message: {problem}"
    assert error_of(reply).startswith(message)
    assert message.splitlines()[0] in server.logs()[mark:]   # logged, as Triton's stub logs it
    assert "pb_utils" not in error_of(reply)   # only the model's own frames, as Triton's
    status, reply = _sender_mode(server, 0)   # and it keeps serving
    assert (status, json.loads(reply)["outputs"][0]["data"]) == (200, [10])


@pytest.mark.parametrize("mode, problem", [
    (10, "model 'py_sender' released a request without answering it: execute returned None in its place and "
         "its response sender sent no response"),
    (11, "model 'py_sender' released a request without answering it: execute returned None in its place and "
         "its response sender sent no response"),
], ids=["sender-never-asked-for", "sender-dropped-unused"])
def test_a_request_its_model_lets_go_of_unanswered_gets_an_error(server, mode, problem):
    """Triton 2.51 leaves such a request without an answer for good; tritium answers it."""
    status, reply = _sender_mode(server, mode)
    assert (status, error_of(reply)) == (500, problem)
    status, reply = _sender_mode(server, 0)   # and it keeps serving
    assert (status, json.loads(reply)["outputs"][0]["data"]) == (200, [10])


def test_a_request_left_in_a_reference_cycle_is_answered_when_the_garbage_collector_frees_it(server, client):
    def executions() -> int:
        return int(client.get_inference_statistics("py_sender")["model_stats"][0]["execution_count"])

    before = executions()
    with ThreadPoolExecutor(1) as pool:
        cycled = pool.submit(_sender_mode, server, 13)
        deadline = time.monotonic() + 30
        while executions() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        status, reply = _sender_mode(server, 14)   # its model collects garbage (if none ran yet), then answers
        assert (status, json.loads(reply)["outputs"][0]["data"]) == (200, [24])
        status, reply = cycled.result(timeout=30)
    assert status == 500 and "released a request without answering it" in error_of(reply)


@pytest.mark.parametrize("mode, value", [(12, 22), (5, 15)], ids=["then-raised", "and-returned-one-too"])
def test_a_response_sent_by_an_execution_that_failed_reaches_its_client_and_counts_as_a_failure(
        server, client, mode, value):
    """As Triton 2.51: the client has the sent response; the statistics count a failure."""
    def counts():
        stats = client.get_inference_statistics("py_sender")["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"]), int(stats["fail"]["count"])

    before = counts()
    status, reply = _sender_mode(server, mode)
    assert (status, json.loads(reply)["outputs"][0]["data"]) == (200, [value])
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (0, 1)


@pytest.mark.parametrize("count, problem", [
    (-1, "Failed to process the request(s) for model 'py_decoupled_0', message: Python model 'py_decoupled_0' is "
         "using the decoupled mode and the execute function must return None."),   # Triton's text
    (-2, "model 'py_decoupled' released a request without its final response: its response sender was never "
         "given the TRITONSERVER_RESPONSE_COMPLETE_FINAL flag"),   # Triton never answers
], ids=["returning-a-list", "released-without-the-final-flag"])
def test_a_decoupled_request_left_open_by_its_model_ends_with_an_error_after_its_response(server, count, problem):
    (first, no_error), (_, error) = stream_count(server.grpc_url, "py_decoupled", count, 2)
    assert no_error is None and first.as_numpy("INDEX").tolist() == [0]
    assert error.message() == problem


def test_answers_sent_from_threads_after_execute_each_reach_their_request_and_are_counted(server, client):
    before = client.get_inference_statistics("py_sender")["model_stats"][0]["inference_stats"]["success"]["count"]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda mode: _sender_mode(server, mode), [1, 0, 1, 1, 0, 1]))
    assert [json.loads(reply)["outputs"][0]["data"] for _, reply in replies] == [[11], [10], [11], [11], [10], [11]]
    after = client.get_inference_statistics("py_sender")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after - before == 6
    x = grpcclient.InferInput("MODE", [1], "INT32")
    x.set_data_from_numpy(np.array([1], np.int32))
    assert grpcclient.InferenceServerClient(server.grpc_url).infer("py_sender", [x]).as_numpy("OUT").tolist() == [11]


def test_execute_batch_receives_stacked_inputs_under_concurrency(server, client):
    rows = [np.full((1, 3), i, dtype=np.float32) for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda x: _infer_alone(server, "py_batched", [tensor("X", x)]), rows))
    for x, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("DOUBLE"), x * 2)
    batch_sizes = [int(r.as_numpy("BATCH")[0, 0]) for r in results]
    assert max(batch_sizes) > 1, batch_sizes
    stats = client.get_inference_statistics("py_batched")["model_stats"][0]
    assert stats["inference_count"] == 12 and stats["execution_count"] < 12


def _infer_alone(server, model, inputs):
    with own_client(server) as client:
        return client.infer(model, inputs)


def _wait_for(check, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_is_ready_is_honoured_by_model_readiness_and_inference_still_runs(server, client):
    assert client.is_model_ready("py_flaky")
    client.infer("py_flaky", [tensor("READY", np.array([False]))])
    assert _wait_for(lambda: not client.is_model_ready("py_flaky"))
    status, _, body = request(server.url, "GET", "/v2/models/py_flaky/ready")
    assert (status, error_of(body)) == (400, "Model version not ready")
    assert "reports not ready (its model's is_ready() did not answer True in time)" in server.logs()
    # Triton only asks is_ready() for readiness: requests still reach the model.
    result = client.infer("py_flaky", [tensor("READY", np.array([True]))])
    assert result.as_numpy("WAS").tolist() == [False]
    assert _wait_for(lambda: client.is_model_ready("py_flaky"))


def test_is_ready_answering_no_boolean_or_too_late_counts_as_not_ready_and_the_instance_serves_on(server, client):
    """As in Triton: a non-boolean answer is an error (not ready); an answer awaited past 5 s
    counts as not ready meanwhile, while batches go on being served by the same process."""
    def mode(value: int) -> int:
        return client.infer("py_ready_modes", [tensor("MODE", np.array([value], np.int32))]).as_numpy("WAS")[0]

    pid = mode(1)
    assert _wait_for(lambda: not client.is_model_ready("py_ready_modes"))
    assert "is_ready() must return a boolean value" in server.logs()
    assert mode(2) == pid
    assert _wait_for(lambda: "Timed out waiting for user-defined is_ready() response" in server.logs(), 15)
    assert not client.is_model_ready("py_ready_modes")
    assert mode(0) == pid   # served while is_ready() sleeps


@pytest.mark.parametrize("count, message", [
    (0, "expected 1 string elements for inference input 'text_input' for model 'py_text', got 0"),
    (3, "unexpected number of string elements 2 for inference input 'text_input' for model 'py_text', expecting 1"),
])
def test_json_strings_of_the_wrong_count_are_counted_as_triton_counts_them(server, count, message):
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a"] * count}]}
    status, _, answer = request(server.url, "POST", "/v2/models/py_text/infer", body)
    assert status == 400 and error_of(answer) == "[request id: <id_unknown>] " + message


# -- classification (expected values are what Triton 2.51 answers to the same requests) ----

CLASS_INPUT = {"name": "X", "datatype": "FP32", "shape": [2, 4],
               "data": [0.1, 0.7, 0.15, 0.05, 0.5, 0.1, 0.2, 0.2]}


def classify_http(server, output: str, parameters: dict):
    body = {"inputs": [CLASS_INPUT], "outputs": [{"name": output, "parameters": parameters}]}
    return request(server.url, "POST", "/v2/models/py_classes/infer", body)


@pytest.mark.parametrize("output, count, shape, data", [
    ("PROBS", 2, [2, 2], ["0.700000:1:dog", "0.150000:2:bird", "0.500000:0:cat", "0.200000:2:bird"]),
    ("RAW", 3, [2, 3], ["7:1", "1:0", "1:2", "5:0", "2:2", "2:3"]),
    ("PROBS", 9, [2, 4], ["0.700000:1:dog", "0.150000:2:bird", "0.100000:0:cat", "0.050000:3",
                          "0.500000:0:cat", "0.200000:2:bird", "0.200000:3", "0.100000:1:dog"]),
])
def test_classification_as_triton_answers_it(server, output, count, shape, data):
    status, _, body = classify_http(server, output, {"classification": count})
    assert status == 200, body
    assert json.loads(body)["outputs"] == [{"name": output, "datatype": "BYTES", "shape": shape, "data": data}]


def test_classification_zero_is_the_plain_output_and_bad_counts_are_refused(server):
    status, _, body = classify_http(server, "PROBS", {"classification": 0})
    assert status == 200 and json.loads(body)["outputs"][0]["datatype"] == "FP32"
    status, _, body = classify_http(server, "PROBS", {"classification": "2"})
    assert status == 400
    assert error_of(body) == "Unable to set 'classification' of output 'PROBS': expected an unsigned integer"


@pytest.mark.parametrize("output, datatype", [("HALF", "FP16"), ("FLAG", "BOOL")])
def test_classification_of_a_type_triton_does_not_rank_is_refused_with_its_words(server, output, datatype):
    status, _, body = classify_http(server, output, {"classification": 2})
    assert status == 400
    assert error_of(body) == (f"class result not available for output due to unsupported type '{datatype}' "
                              f"(output '{output}')")


def test_classification_through_tritonclient_http_and_grpc(server):
    import tritonclient.grpc as grpcclient

    x = np.array([[0.1, 0.7, 0.15, 0.05]], dtype=np.float32)
    http_input = tensor("X", x)
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("py_classes", [http_input], outputs=[httpclient.InferRequestedOutput("PROBS", class_count=2)])
    assert result.as_numpy("PROBS").tolist() == [[b"0.700000:1:dog", b"0.150000:2:bird"]]
    grpc_input = grpcclient.InferInput("X", [1, 4], "FP32")
    grpc_input.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("py_classes", [grpc_input], outputs=[grpcclient.InferRequestedOutput("RAW", class_count=1)])
    assert result.as_numpy("RAW").tolist() == [[b"7:1"]]


# -- generate and generate_stream (expected bodies are what Triton 2.51 answers) -----------

def test_generate_maps_flat_json_to_inputs_and_parameters(server):
    status, headers, body = request(server.url, "POST", "/v2/models/py_text/generate",
                                    {"text_input": "hello", "suffix": "!", "parameters": {"max_tokens": 5}})
    assert status == 200 and headers["content-type"] == "application/json"
    assert body == b'{"length":5,"model_name":"py_text","model_version":"1","text_output":"HELLO!"}'
    a = list(range(16))
    status, _, body = request(server.url, "POST", "/v2/models/py_add_sub/generate",
                              {"id": "r1", "INPUT0": a, "INPUT1": a})  # a batching model: a batch of one
    assert status == 200
    assert json.loads(body) == {"OUTPUT0": [2.0 * v for v in a], "OUTPUT1": [0.0] * 16, "id": "r1",
                                "model_name": "py_add_sub", "model_version": "1"}


def test_generate_stream_sends_each_response_as_an_event(server):
    status, headers, body = request(server.url, "POST", "/v2/models/py_decoupled/generate_stream", {"COUNT": 3})
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert body == b"".join(b'data: {"INDEX":%d,"model_name":"py_decoupled","model_version":"1"}\n\n' % i
                            for i in range(3))
    status, _, body = request(server.url, "POST", "/v2/models/py_text/generate_stream",
                              {"id": "7", "text_input": "hi"})
    assert body == b'data: {"id":"7","length":2,"model_name":"py_text","model_version":"1","text_output":"HI"}\n\n'


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/py_decoupled/generate", {"COUNT": 3}, 400,
     "generate expects model to produce exactly 1 response, use generate stream for model that generates "
     "various number of responses"),
    ("/v2/models/py_decoupled/generate_stream", {"COUNT": [1, 2]}, 400,
     "The schema can not convert input 'COUNT' to tensor with proper shape"),
    ("/v2/models/py_text/generate", {"text_input": "x", "extra": [1, 2]}, 400,
     "parameter 'extra' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ("/v2/models/py_text/generate", {"suffix": "!"}, 400, "expected 1 inputs but got 0 inputs for model 'py_text'"),
    ("/v2/models/nowhere/generate_stream", {"x": 1}, 404, "Request for unknown model: 'nowhere' is not found"),
    # Triton's words (Triton answers these with a 500; a client's mistake is a 400 here)
    ("/v2/models/py_text/generate", {"text_input": {"USER": "x"}}, 400,
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("/v2/models/py_text/generate", {"text_input": 5}, 400,
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("/v2/models/py_text/generate", {"text_input": "x", "parameters": 1}, 400,
     "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object"),
    ("/v2/models/py_text/generate", {"text_input": "x", "parameters": {"nested": {"a": 1}}}, 400,
     "Converting keyword: 'parameters': parameter 'nested' has invalid type. It should be either 'int', 'bool', "
     "or 'string'."),
    ("/v2/models/py_text/generate", {"text_input": "x", "parameters": {"text_input": "y"}}, 400,
     "Converting keyword: 'parameters': input 'text_input' already exists in request"),
    ("/v2/models/py_text/generate", {"text_input": [["a", "b"]]}, 400,
     "unexpected number of string elements 2 for inference input 'text_input' for model 'py_text', expecting 1"),
    ("/v2/models/py_text/generate", '{"text_input": "a", "suffix": "!", "text_input": "b"}', 400,
     "[request id: <id_unknown>] input 'text_input' already exists in request"),
])
def test_generate_errors(server, path, body, status, message):
    got, _, data = request(server.url, "POST", path, body)
    assert got == status
    assert message in error_of(data)


def test_generate_is_post_only(server):
    assert request(server.url, "GET", "/v2/models/py_text/generate")[0] == 405


PARTIAL_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT2", x * 2), pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""
PARTIAL_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] },
         { name: "OUTPUT2", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


def test_outputs_come_in_the_model_s_order_and_one_it_did_not_produce_is_left_out_as_triton_does(tmp_path):
    (tmp_path / "partial" / "1").mkdir(parents=True)
    (tmp_path / "partial" / "1" / "model.py").write_text(PARTIAL_MODEL)
    (tmp_path / "partial" / "config.pbtxt").write_text(PARTIAL_CONFIG)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    with TritiumServer(tmp_path) as server:
        for outputs, produced in ((["OUTPUT1"], []), (["OUTPUT0", "OUTPUT1", "OUTPUT2"], ["OUTPUT2", "OUTPUT0"]),
                                  (None, ["OUTPUT2", "OUTPUT0"])):
            asked = body if outputs is None else {**body, "outputs": [{"name": n} for n in outputs]}
            status, _, reply = request(server.url, "POST", "/v2/models/partial/infer", asked)
            assert status == 200, reply
            assert [o["name"] for o in json.loads(reply)["outputs"]] == produced
        x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        result = grpcclient.InferenceServerClient(server.grpc_url).infer(
            "partial", [x], outputs=[grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT2")])
        assert [o.name for o in result.get_response().outputs] == ["OUTPUT2", "OUTPUT0"]


def test_a_model_holding_the_gil_past_the_heartbeat_limit_keeps_its_instance(client, server):
    """Its heartbeats stop for 4 s (the limit is 3); its host agent says its process runs, so the
    broker keeps it, as Triton keeps a stub that computes: the request is answered once, by it."""
    pid = json.loads(client.infer("py_args", [tensor("X", np.array([1], dtype=np.int32))]).as_numpy("ENV")[0])["pid"]
    result = client.infer("py_gil", [tensor("SECONDS", np.array([4], dtype=np.int32))])
    assert result.as_numpy("OUT").tolist() == [4]
    logs = server.logs()
    assert re.search(r"instance py_gil_0 of model py_gil version 1 has not answered heartbeats for 3 s while "
                     r"running a batch, but its process runs \(its host agent says so\): kept", logs), logs[-2000:]
    assert "py_gil version 1 stopped answering heartbeats" not in logs
    assert json.loads(client.infer("py_args", [tensor("X", np.array([1], dtype=np.int32))])
                      .as_numpy("ENV")[0])["pid"] == pid   # nothing else restarted either


def test_bls_calls_from_processes_the_model_forks_are_each_answered(client):
    """A multiprocessing pool's processes share nothing with the instance's socket: each gets its own."""
    result = client.infer("bls_forked", [tensor("N", np.array([3], dtype=np.int32))])
    assert result.as_numpy("SUMS").tolist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 200.0]
