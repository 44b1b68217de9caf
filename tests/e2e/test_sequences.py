"""Stateful models through tritonclient: sequence_id / sequence_start / sequence_end, both strategies,
control inputs, idle timeouts, implicit state (Python and ONNX), iterative sequences (requests a
model releases to run again), and Triton's errors.

The models (tests/e2e/sequence_repo) are written as one writes them for Triton: the
accumulator keeps a running sum per CORRID and echoes what it was given; variants of it
differ only in their config (written by the fixture). Error texts and what a model
receives were compared with Triton 2.51.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.rawhttp import error_of, request
from tests.servers import TritiumServer, instance_processes

MODELS = Path(__file__).parent / "sequence_repo"
START_REQUIRED = ("inference request for sequence {} to model '{}' must specify the START flag on the first "
                  "request of the sequence")


def variant(repo: Path, name: str, *replacements: tuple[str, str], source: str = "py_accumulator") -> None:
    """A copy of ``source`` whose config differs by ``replacements``."""
    shutil.copytree(repo / source, repo / name)
    config = (repo / name / "config.pbtxt").read_text()
    for old, new in replacements:
        assert old in config
        config = config.replace(old, new)
    (repo / name / "config.pbtxt").write_text(config)


def onnx_accumulator(model_dir: Path) -> None:
    """OUTPUT = INPUT + INPUT_STATE * (1 - START); OUTPUT_STATE = OUTPUT (Triton's implicit-state example)."""
    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 1])

    graph = helper.make_graph(
        [helper.make_node("Sub", ["ONE", "START"], ["keep"]),
         helper.make_node("Mul", ["INPUT_STATE", "keep"], ["carried"]),
         helper.make_node("Add", ["INPUT", "carried"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"])],
        "accumulator", [tensor("INPUT"), tensor("INPUT_STATE"), tensor("START")],
        [tensor("OUTPUT"), tensor("OUTPUT_STATE")],
        [helper.make_tensor("ONE", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text("""
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  direct { }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(MODELS, repo, dirs_exist_ok=True)
    variant(repo, "py_oldest", ("direct { }", "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                                              "max_queue_delay_microseconds: 50000 }"),
            ("count: 1", "count: 2"))
    variant(repo, "py_idle", ("max_batch_size: 8", "max_batch_size: 1"),
            ("max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 500000"))
    variant(repo, "py_strid", ("max_batch_size: 8", "max_batch_size: 0"), ("TYPE_UINT64", "TYPE_STRING"))
    variant(repo, "py_crash")
    variant(repo, "py_iterative_plain", ("model_transaction_policy { decoupled: true }\n", ""), source="py_iterative")
    variant(repo, "py_not_iterative", ("sequence_batching { iterative_sequence: true }\n", ""), source="py_iterative")
    onnx_accumulator(repo / "onnx_state")
    with TritiumServer(repo) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpclient.InferenceServerClient(server.url, network_timeout=60, concurrency=8) as client:
        yield client


@pytest.fixture(scope="module")
def grpc_client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        yield client


def client_for(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def step(client, model: str, value: float, sequence_id, start=False, end=False, batched=True):
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    array = np.array([[value]] if batched else [value], dtype=np.float32)
    tensor = module.InferInput("INPUT", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)


def total(result) -> float:
    return float(result.as_numpy("OUTPUT").reshape(-1)[0])


def echo(result) -> dict:
    text = result.as_numpy("CONTROLS").reshape(-1)[0]
    return json.loads(text.decode() if isinstance(text, bytes) else text)


def refused(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def run_sequences(model: str, count: int, length: int, make_client, first_id=1, batched=True) -> list:
    """``count`` sequences of ``length`` steps from as many threads, interleaved; per sequence:
    (its values, the totals the model answered, what each request's CONTROLS echoed or None)."""
    def one(index):
        client = make_client()
        sequence_id = first_id + index if isinstance(first_id, int) else f"{first_id}{index}"
        values = [float(index * 100 + k) for k in range(length)]
        totals, echoes = [], []
        try:
            for k, value in enumerate(values):
                result = step(client, model, value, sequence_id, start=k == 0, end=k == length - 1, batched=batched)
                totals.append(total(result))
                echoes.append(echo(result) if result.get_output("CONTROLS") is not None else None)
        finally:
            client.close()   # in the thread that made it (the HTTP client's gevent pool is per thread)
        return values, totals, echoes

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def running_sums(values: list[float]) -> list[float]:
    return [float(v) for v in np.cumsum(values)]


# -- sequences, control inputs, strategies ------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_from_several_clients_keep_their_own_sums(server, protocol):
    first_id = 1000 if protocol == "http" else 2000
    outcomes = run_sequences("py_accumulator", 6, 8, lambda: client_for(server, protocol), first_id)
    for index, (values, totals, echoes) in enumerate(outcomes):
        assert totals == running_sums(values)
        assert {e["controls"]["CORRID"][2][0] for e in echoes} == {first_id + index}


def test_control_inputs_arrive_as_the_config_declares_them(http):
    first = echo(step(http, "py_accumulator", 1.0, 77, start=True))
    middle = echo(step(http, "py_accumulator", 2.0, 77))
    last_result = step(http, "py_accumulator", 3.0, 77, end=True)
    last = echo(last_result)
    assert first["controls"] == {"START": ["int32", [1, 1], [1]], "END": ["float32", [1, 1], [0.0]],
                                 "READY": ["bool", [1, 1], [True]], "CORRID": ["uint64", [1, 1], [77]]}
    assert middle["controls"]["START"][2] == [0] and middle["controls"]["END"][2] == [0.0]
    assert last["controls"]["START"][2] == [0] and last["controls"]["END"][2] == [1.0]
    assert (first["flags"], middle["flags"], last["flags"]) == (1, 0, 2)
    # The sequence parameters are the request's correlation id and flags, not parameters a model sees.
    assert first["correlation_id"] == 77 and first["parameters"] == {}
    assert total(last_result) == 6.0


def test_string_sequence_ids_reach_a_string_corrid_of_a_model_without_batching(server, grpc_client):
    outcomes = run_sequences("py_strid", 3, 4, lambda: client_for(server, "grpc"), "user-", batched=False)
    for index, (values, totals, echoes) in enumerate(outcomes):
        assert totals == running_sums(values)
        assert echoes[0]["controls"]["CORRID"] == ["object", [1], [f"user-{index}"]]
        assert echoes[0]["controls"]["READY"] == ["bool", [1], [True]]
        assert echoes[0]["correlation_id"] == f"user-{index}"
    assert "must specify the START flag" in refused(lambda: step(grpc_client, "py_strid", 1.0, "user-0",
                                                                 batched=False)).message()
    # Requests count in the statistics as usual; what the sequence batcher refused does not (as in Triton).
    stats = grpc_client.get_inference_statistics("py_strid", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == 12
    assert int(stats["inference_stats"]["fail"].get("count", 0)) == 0


def test_a_sequence_runs_over_a_grpc_stream(server):
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        for k, value in enumerate((1.0, 2.0, 3.0)):
            array = np.array([[value]], dtype=np.float32)
            tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(array)
            client.async_stream_infer("py_accumulator", [tensor], request_id=str(k), sequence_id=701,
                                      sequence_start=k == 0, sequence_end=k == 2)
        answers = [results.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    assert sorted((a.get_response().id, total(a)) for a in answers) == [("0", 1.0), ("1", 3.0), ("2", 6.0)]


def test_a_model_runs_its_requests_sequence_on_a_stateful_model_through_bls(http):
    totals = [total(step(http, "py_bls_caller", value, 801, start=k == 0, end=k == 2))
              for k, value in enumerate((1.0, 2.0, 3.0))]
    assert totals == [1.0, 3.0, 6.0]
    error = refused(lambda: step(http, "py_bls_caller", 1.0, 801))
    assert START_REQUIRED.format(801, "py_accumulator") in error.message()


def test_a_direct_batch_pads_empty_lower_slots_with_not_ready_requests(http):
    step(http, "py_accumulator", 1.0, 501, start=True)     # slot 0
    step(http, "py_accumulator", 10.0, 502, start=True)    # slot 1
    result = step(http, "py_accumulator", 5.0, 502)
    # The model ran a batch of two: a not-ready request in slot 0, then sequence 502 in slot 1.
    assert echo(result)["batch"] == [None, 502]
    assert total(result) == 15.0
    assert total(step(http, "py_accumulator", 2.0, 501, end=True)) == 3.0
    assert total(step(http, "py_accumulator", 1.0, 502, end=True)) == 16.0


def test_oldest_batches_the_oldest_requests_but_never_two_of_one_sequence(server):
    outcomes = run_sequences("py_oldest", 4, 6, lambda: client_for(server, "grpc"), 3000)
    batches = []
    for values, totals, echoes in outcomes:
        assert totals == running_sums(values)
        batches += [e["batch"] for e in echoes]
    assert all(len(set(b)) == len(b) for b in batches)
    assert any(len(b) > 1 for b in batches), "the preferred batch size of 2 was never formed"
    assert all(None not in b for b in batches)   # oldest never pads


def test_a_start_for_a_running_sequence_starts_it_again(http):
    step(http, "py_accumulator", 5.0, 601, start=True)
    assert total(step(http, "py_accumulator", 1.0, 601, start=True)) == 1.0
    assert total(step(http, "py_accumulator", 2.0, 601, end=True)) == 3.0


# -- idle timeout and Triton's errors ----------------------------------------------------------

def test_an_idle_sequence_frees_its_slot_and_its_next_request_gets_tritons_error(http):
    step(http, "py_idle", 1.0, 11, start=True)   # the only slot
    started = time.monotonic()
    assert total(step(http, "py_idle", 2.0, 12, start=True)) == 2.0   # waits in the backlog
    assert time.monotonic() - started >= 0.4      # until sequence 11 was idle for 0.5 s
    error = refused(lambda: step(http, "py_idle", 3.0, 11))
    assert (error.status(), error.message()) == ("400", START_REQUIRED.format(11, "py_idle"))
    assert total(step(http, "py_idle", 4.0, 12, end=True)) == 6.0


def test_requests_the_sequence_batcher_refuses_get_tritons_errors(http, grpc_client):
    error = refused(lambda: step(http, "py_accumulator", 1.0, 9999))
    assert (error.status(), error.message()) == ("400", START_REQUIRED.format(9999, "py_accumulator"))
    error = refused(lambda: step(grpc_client, "py_accumulator", 1.0, "never-started", end=True))
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT",
                                                 START_REQUIRED.format("never-started", "py_accumulator"))
    error = refused(lambda: step(http, "py_accumulator", 1.0, 0, start=True))
    assert error.message() == ("inference request to model 'py_accumulator' must specify a non-zero or "
                               "non-empty correlation ID")
    pair = httpclient.InferInput("INPUT", [2, 1], "FP32")
    pair.set_data_from_numpy(np.ones((2, 1), dtype=np.float32))
    # with a request id too: Triton adds none to the sequence batcher's errors
    error = refused(lambda: http.infer("py_accumulator", [pair], sequence_id=5, sequence_start=True, request_id="r-7"))
    assert (error.status(), error.message()) == (
        "400", "inference request to model 'py_accumulator' must specify batch-size 1 due to requirements of "
        "sequence batcher")


def test_sequence_parameters_of_the_wrong_type_get_tritons_errors(server):
    def http_error(parameters):
        body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
                "parameters": parameters}
        status, _, data = request(server.url, "POST", "/v2/models/py_accumulator/infer", body)
        return status, error_of(data)

    assert http_error({"sequence_id": 7, "sequence_start": 1}) == (
        500, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean")
    assert http_error({"sequence_id": -5, "sequence_start": True}) == (
        500, "Unable to parse 'sequence_id': attempt to access JSON non-string as string")

    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))

    def grpc_error(**parameters):
        message = service_pb2.ModelInferRequest(model_name="py_accumulator")
        message.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
        message.raw_input_contents.append(np.ones(1, dtype=np.float32).tobytes())
        for key, (kind, value) in parameters.items():
            setattr(message.parameters[key], kind, value)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(message)
        return caught.value.code(), caught.value.details()

    assert grpc_error(sequence_id=("uint64_param", 21), sequence_start=("bool_param", True)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
    assert grpc_error(sequence_id=("int64_param", 22), sequence_start=("int64_param", 1)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "invalid value type for 'sequence_start' parameter, expected bool_param.")


# -- implicit state ------------------------------------------------------------------------------

def test_implicit_state_of_a_python_model_is_kept_by_the_server(server):
    outcomes = run_sequences("py_state", 3, 5, lambda: client_for(server, "http"), 4000)
    for values, totals, _ in outcomes:
        assert totals == running_sums(values)
    with client_for(server, "http") as client:
        result = step(client, "py_state", 1.0, 4100, start=True, end=True)
    assert result.get_output("OUTPUT_STATE") is None   # not a declared output: the client never sees it


def test_implicit_state_of_an_onnx_model_is_kept_by_the_server(server, grpc_client):
    outcomes = run_sequences("onnx_state", 4, 5, lambda: client_for(server, "grpc"), 5000)
    for values, totals, _ in outcomes:
        assert totals == running_sums(values)
    step(grpc_client, "onnx_state", 9.0, 5100, start=True)
    assert total(step(grpc_client, "onnx_state", 2.0, 5100, start=True)) == 2.0   # START resets the state
    assert total(step(grpc_client, "onnx_state", 3.0, 5100, end=True)) == 5.0


# -- a lost instance -----------------------------------------------------------------------------

def test_a_lost_instance_fails_its_sequences_with_503_and_forgets_them(server, http):
    step(http, "py_crash", 1.0, 31, start=True)
    outcome = {}

    def slow_step():   # the model sleeps 30 s in this request
        try:
            with client_for(server, "http") as client:   # closed in the thread that made it
                step(client, "py_crash", -30.0, 31)
        except InferenceServerException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=slow_step)
    runner.start()
    time.sleep(1.0)
    pids = [p["pid"] for p in instance_processes(server) if p["env"].get("TRITIUM_MODEL") == "py_crash/1"]
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    runner.join(timeout=30)
    error = outcome["error"]
    assert error.status() == "503"
    assert "model 'py_crash'" in error.message() and "the state of sequence 31 was lost with it" in error.message()
    error = refused(lambda: step(http, "py_crash", 1.0, 31))
    assert (error.status(), error.message()) == ("400", START_REQUIRED.format(31, "py_crash"))


# -- iterative sequences: a model releases a request to run again ------------------------------

RESCHEDULED_WITH_A_RESPONSE = "Expected a None object in the execute function return list for reschduled request"
NOT_ITERATIVE = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                 "configured to handle such a flag.")


def iterations(server, model: str, runs: list[int], sequence_id=0, start=False) -> list:
    """One request per entry of ``runs`` on one gRPC stream; every answer until the stream is quiet:
    (OUT, final) or an error's message."""
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for count in runs:
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([count], np.int32))
            client.async_stream_infer(model, [tensor], sequence_id=sequence_id, sequence_start=start,
                                      enable_empty_final_response=True)
        got = []
        while len([a for a in got if isinstance(a, str) or a[1]]) < len(runs):
            answer = answers.get(timeout=30)
            if isinstance(answer, InferenceServerException):
                got.append(answer.message())
                continue
            final = answer.get_response().parameters["triton_final_response"].bool_param
            out = answer.as_numpy("OUT")
            got.append((None if out is None else out.tolist(), final))
        with pytest.raises(queue.Empty):   # nothing more: every request had one final answer
            answers.get(timeout=0.1)
        client.stop_stream()
    return got


def test_an_iterative_model_runs_a_request_again_until_it_sends_its_final_response(server, grpc_client):
    (first, _), *rest = iterations(server, "py_iterative", [3])
    correlation_id = first[0]   # numbered by the server from 1: a request without one starts its own sequence
    assert correlation_id >= 1 and first == [correlation_id, 1, 1]   # its first run has START ...
    assert rest == [([correlation_id, 0, 2], False), ([correlation_id, 0, 3], True)]   # ... later ones none
    # Three requests on one stream: three sequences, one after another (the model has one slot).
    answers = [a for a in iterations(server, "py_iterative", [2, 2, 2]) if a[0] is not None]
    ids = sorted({out[0] for out, _ in answers})
    assert len(ids) == 3 and correlation_id not in ids
    assert sorted(out[1:] for out, _ in answers) == [[0, 2]] * 3 + [[1, 1]] * 3
    stats = grpc_client.get_inference_statistics("py_iterative", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 9   # each run counts, as in Triton


def test_a_model_that_is_not_decoupled_answers_on_the_last_run_and_the_sequence_ends(http):
    def run(count, **sequence):
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], np.int32))
        return http.infer("py_iterative_plain", [tensor], **sequence)

    assert run(2, sequence_id=4242, sequence_start=True).as_numpy("OUT").tolist() == [4242, 0, 2]
    # Released for good, the request ended its sequence: Triton's refusal for a request without START.
    assert refused(lambda: run(1, sequence_id=4242)).message() == START_REQUIRED.format(4242, "py_iterative_plain")
    error = refused(lambda: run(-1))
    assert error.status() == "500" and RESCHEDULED_WITH_A_RESPONSE in error.message()
    assert run(1).as_numpy("OUT").tolist()[1:] == [1, 1]   # and it keeps serving


def test_a_model_without_iterative_sequences_that_releases_a_request_to_run_again_gets_tritons_error(server):
    # Triton logs this and leaves the request unanswered; tritium answers it with Triton's words.
    assert iterations(server, "py_not_iterative", [2]) == [([0, 0, 1], False), NOT_ITERATIVE]
