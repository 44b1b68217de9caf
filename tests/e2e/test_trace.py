"""Triton's trace extension: settings over HTTP and gRPC, the --trace-config flags, and the
trace file, on a real server. Expected texts and values are what Triton 2.51 answers
(checked side by side on the same repository)."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritium.gateway.tracing import RequestTrace, _on_timeline, parse_traceparent
from tritium.protocol import Response
from tests.e2e.rawhttp import error_of, request
from tests.servers import PROJECT_ROOT, TritiumServer

MODELS = Path(__file__).parent / "ensemble_repo"
USED = ("pre", "double", "triple", "combine", "pipeline")
KEYS = ["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"]
FRONT_END_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
                   "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE",
                   "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
STEP_ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
              "COMPUTE_END", "REQUEST_END"]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("traces")


BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Z = triple(X), called with the request's trace: a child of it.\"\"\"

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            call = pb_utils.InferenceRequest(model_name="triple", model_version=1, requested_output_names=["Z"],
                                             inputs=[pb_utils.Tensor("X", x)], trace=request.trace())
            z = pb_utils.get_output_tensor_by_name(call.exec(), "Z").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Z", z)]))
        return responses
"""
BLS_CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "Z", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, trace_dir):
    repo = tmp_path_factory.mktemp("trace_repo")
    for name in USED:
        shutil.copytree(MODELS / name, repo / name)
    shutil.copytree(Path(__file__).parent / "python_repo" / "py_decoupled", repo / "py_decoupled")
    (repo / "bls_triple" / "1").mkdir(parents=True)
    (repo / "bls_triple" / "1" / "model.py").write_text(BLS_MODEL)
    (repo / "bls_triple" / "config.pbtxt").write_text(BLS_CONFIG)
    # Tracing is off until a test turns it on; each trace goes to a file of its own (log_frequency 1).
    with TritiumServer(repo, "--trace-config", f"triton,file={trace_dir}/trace.json",
                       "--trace-config", "triton,log-frequency=1", "--trace-config", "rate=1", http_workers=1) as running:
        yield running


@pytest.fixture
def settings(server):
    """The global settings, put back as they started after the test."""
    yield server
    reset = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
    for model in ("", "/models/triple", "/models/pipeline", "/models/bls_triple", "/models/py_decoupled"):
        assert request(server.url, "POST", f"/v2{model}/trace/setting", reset)[0] == 200


def post(server, body, model: str | None = None) -> tuple[int, dict]:
    path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
    status, _, data = request(server.url, "POST", path, body)
    return status, json.loads(data)


def get(server, model: str | None = None) -> dict:
    path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
    status, _, data = request(server.url, "GET", path)
    assert status == 200, data
    return json.loads(data)


def infer(server, model: str, name: str = "X", request_id: str = ""):
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput(name, [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    return client.infer(model, [tensor], request_id=request_id)


def trace_files(trace_dir) -> list[Path]:
    return sorted(trace_dir.glob("trace.json.*"), key=lambda path: int(path.suffix[1:]))


def new_trace(trace_dir, known: int) -> list[dict]:
    """The records of the next trace file written after ``known`` files."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        files = trace_files(trace_dir)
        if len(files) > known:
            return json.loads(files[known].read_bytes())   # written whole: never seen half-written
        time.sleep(0.05)
    raise AssertionError(f"no trace file after {known} in {trace_dir}")


# -- settings --------------------------------------------------------------------------------

def test_defaults_as_triton_writes_them(server, trace_dir):
    assert get(server) == {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "1",
                           "trace_file": f"{trace_dir}/trace.json", "trace_mode": "triton"}
    assert list(get(server, "triple")) == KEYS
    status, _, data = request(server.url, "GET", "/v2")
    assert json.loads(data)["extensions"][-2:] == ["trace", "logging"]


@pytest.mark.parametrize("body, status, message", [
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "99999999999"}, 400,
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
    ({"trace_rate": "4294967295"}, 400,   # std::stoi: 32-bit signed, whatever the setting's range
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 4294967295"),
    ({"trace_count": "2147483648"}, 400,
     "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 2147483648"),
    ({"log_frequency": "-2147483649"}, 400,
     "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: -2147483649"),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"trace_count": "x"}, 400, "Unable to parse 'trace_count', got: x"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_file": "/tmp/elsewhere.json"}, 501, "trace file location can not be updated through network protocol"),
    ({"trace_rate": 5}, 400, "attempt to access JSON non-string as string"),
    ({"trace_level": "TIMESTAMPS"}, 400, "attempt to access JSON non-array as array"),
    ({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, 400,
     "Attempting to set invalid trace setting :sample rate must be non-zero"),
    # several wrong: the first in Triton's order (file, level, rate, count, log frequency), not the body's
    ({"log_frequency": "x", "trace_file": "y"}, 501, "trace file location can not be updated through network protocol"),
    ({"log_frequency": "x", "trace_count": "y", "trace_rate": "z"}, 400, "Unable to parse 'trace_rate', got: z"),
    ({"trace_rate": "z", "trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
])
def test_http_update_refused_with_tritons_words(settings, body, status, message):
    before = get(settings)
    assert post(settings, body) == (status, {"error": message})
    assert get(settings) == before


def test_http_update_reads_values_as_triton(settings):
    status, answer = post(settings, {"trace_rate": "-1", "trace_level": ["TENSORS", "TIMESTAMPS"],
                                     "trace_mode": "opentelemetry", "unknown": "1"})
    assert status == 200
    assert answer["trace_rate"] == "4294967295"   # Triton's C cast
    assert answer["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert answer["trace_mode"] == "triton"      # not settable; ignored
    assert post(settings, {"trace_level": ["BOGUS"]})[1]["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert post(settings, {"trace_rate": None})[1]["trace_rate"] == "1"   # null: the startup value


def test_model_settings_override_and_fall_back_to_global(settings):
    assert post(settings, {"trace_rate": "7", "trace_count": "3"}, "triple")[1]["trace_rate"] == "7"
    assert post(settings, {"trace_rate": "9", "log_frequency": "5"})[0] == 200
    model = get(settings, "triple")
    assert (model["trace_rate"], model["trace_count"], model["log_frequency"]) == ("7", "3", "5")
    assert get(settings, "double")["trace_rate"] == "9"
    assert post(settings, {"trace_rate": None}, "triple")[1]["trace_rate"] == "9"
    assert get(settings, "triple")["trace_count"] == "3"


def test_unknown_model_and_versioned_path(settings):
    assert post(settings, {}, "nosuch") == (400, {"error": "Request for unknown model : nosuch"})
    # the model before the body, as Triton checks them
    assert post(settings, {"trace_file": "x.log"}, "nosuch") == (400, {"error": "Request for unknown model : nosuch"})
    status, _, data = request(settings.url, "POST", "/v2/models/nosuch/trace/setting", b"not json")
    assert (status, error_of(data)) == (400, "Request for unknown model : nosuch")
    status, _, data = request(settings.url, "GET", "/v2/models/nosuch/trace/setting")
    assert (status, error_of(data)) == (400, "Request for unknown model : nosuch")
    assert request(settings.url, "GET", "/v2/models/triple/versions/1/trace/setting")[0] == 404
    assert request(settings.url, "PUT", "/v2/trace/setting", {})[0] == 405


def test_grpc_round_trip_and_errors(settings):
    client = grpcclient.InferenceServerClient(settings.grpc_url)
    answer = client.update_trace_settings("triple", {"trace_rate": "3"}, as_json=True)["settings"]
    assert answer["trace_rate"] == {"value": ["3"]}
    assert answer["trace_level"] == {"value": ["OFF"]}
    assert client.get_trace_settings("triple", as_json=True)["settings"]["trace_rate"] == {"value": ["3"]}
    cleared = client.update_trace_settings("triple", {"trace_rate": None}, as_json=True)["settings"]
    assert cleared["trace_rate"] == {"value": ["1"]}
    refusals = [({"trace_count": "-2"}, "INVALID_ARGUMENT", "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
                ({"trace_rate": ["1", "2"]}, "INVALID_ARGUMENT", "expect only 1 value for 'trace_rate'"),
                ({"trace_file": "/tmp/x"}, "UNIMPLEMENTED", "trace file location can not be updated through network protocol"),
                ({"trace_file": None}, "UNIMPLEMENTED", "trace file location can not be updated through network protocol"),
                ({"log_frequency": "x", "trace_file": "/tmp/x"}, "UNIMPLEMENTED",
                 "trace file location can not be updated through network protocol"),
                ({"log_frequency": "x", "trace_count": "y"}, "INVALID_ARGUMENT", "Unable to parse 'trace_count', got: y")]
    for update, code, message in refusals:
        with pytest.raises(InferenceServerException) as caught:
            client.update_trace_settings(None, update)
        assert (caught.value.status(), caught.value.message()) == (f"StatusCode.{code}", message)
    with pytest.raises(InferenceServerException, match="Request for unknown model : nosuch"):
        client.get_trace_settings("nosuch")
    with pytest.raises(InferenceServerException, match="Request for unknown model : nosuch"):
        client.update_trace_settings("nosuch", {"trace_file": "x.log"})


# -- the trace file --------------------------------------------------------------------------

def test_a_traced_request_writes_every_timestamp_in_order(settings, trace_dir):
    known = len(trace_files(trace_dir))
    infer(settings, "triple")            # tracing off: nothing written
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "triple")[0] == 200
    assert infer(settings, "triple").as_numpy("Z").tolist() == [[3, 6]]
    records = new_trace(trace_dir, known)
    ids = {record["id"] for record in records}
    assert len(ids) == 1
    assert {"id": ids.pop(), "model_name": "triple", "model_version": 1} in records
    stamps = [(r["timestamps"][0]["name"], r["timestamps"][0]["ns"]) for r in records if "timestamps" in r]
    assert sorted(name for name, _ in stamps) == sorted(FRONT_END_ORDER)
    assert [ns for _, ns in stamps] == sorted(ns for _, ns in stamps)
    by_name = dict(stamps)
    assert [by_name[name] for name in FRONT_END_ORDER] == sorted(by_name.values())
    assert list(records[2]) == ["id", "model_name", "model_version"]   # after HTTP_RECV_*, as Triton writes it

    infer(settings, "triple", request_id="client-7")   # the client's id is in the model's record, as Triton's
    (model,) = [record for record in new_trace(trace_dir, known + 1) if "model_name" in record]
    assert list(model.items())[1:] == [("model_name", "triple"), ("model_version", 1), ("request_id", "client-7")]


def test_trace_level_tensors_writes_the_inputs_and_outputs_where_triton_does(settings, trace_dir):
    """With TIMESTAMPS: each input after QUEUE_START, each output before INFER_RESPONSE_COMPLETE;
    with TENSORS alone, only those records (Triton 2.51 writes the same)."""
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS", "TENSORS"]}, "triple")[0] == 200
    assert infer(settings, "triple").as_numpy("Z").tolist() == [[3, 6]]
    records = new_trace(trace_dir, known)
    tensors = [(record["activity"], record["tensor"]) for record in records if "activity" in record]
    assert tensors == [("TENSOR_QUEUE_INPUT", {"name": "X", "data": "1,2", "shape": "1,2", "dtype": "FP32"}),
                       ("TENSOR_BACKEND_OUTPUT", {"name": "Z", "data": "3,6", "shape": "1,2", "dtype": "FP32"})]
    kinds = [record.get("activity") or record.get("timestamps", [{}])[0].get("name") or "model" for record in records]
    assert kinds[kinds.index("QUEUE_START") + 1] == "TENSOR_QUEUE_INPUT"
    assert kinds[kinds.index("INFER_RESPONSE_COMPLETE") - 1] == "TENSOR_BACKEND_OUTPUT"

    assert post(settings, {"trace_level": ["TENSORS"]}, "triple")[0] == 200
    infer(settings, "triple")
    records = new_trace(trace_dir, known + 1)
    assert [record["activity"] for record in records] == ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"]
    assert len({record["id"] for record in records}) == 1


@pytest.mark.parametrize("count", [2, 3])   # the responses sent from execute, or from the model's thread
def test_a_streamed_request_of_a_decoupled_model_is_traced_as_triton_traces_it(settings, trace_dir, count):
    """Its stamps as Triton 2.51 writes them for a request on a gRPC stream: the model's, one
    INFER_RESPONSE_COMPLETE (the first response), and a GRPC_SEND_START/END pair per response sent;
    with TENSORS, the outputs of every response."""
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS", "TENSORS"]}, "py_decoupled")[0] == 200
    client = grpcclient.InferenceServerClient(settings.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], np.int32))
    try:
        client.async_stream_infer("py_decoupled", [tensor], request_id=f"stream-{count}")
        indexes = [answers.get(timeout=10)[0].as_numpy("INDEX")[0] for _ in range(count)]
    finally:
        client.stop_stream()
    assert indexes == list(range(count))
    records = new_trace(trace_dir, known)
    (model,) = [record for record in records if "model_name" in record]
    assert (model["model_name"], model.get("request_id")) == ("py_decoupled", f"stream-{count}")
    names = [record["timestamps"][0]["name"] for record in records if "timestamps" in record]
    assert sorted(names) == sorted(STEP_ORDER + ["INFER_RESPONSE_COMPLETE"] + ["GRPC_SEND_START", "GRPC_SEND_END"] * count)
    stamps = [record["timestamps"][0]["ns"] for record in records if "timestamps" in record]
    assert stamps == sorted(stamps)
    assert names.index("COMPUTE_INPUT_END") < names.index("INFER_RESPONSE_COMPLETE") < names.index("GRPC_SEND_START")
    outputs = [record["tensor"]["data"] for record in records if record.get("activity") == "TENSOR_BACKEND_OUTPUT"]
    assert outputs == [str(index) for index in range(count)]   # every response's, in order


def test_a_streamed_request_of_a_model_that_is_not_decoupled_is_traced(settings, trace_dir):
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "triple")[0] == 200
    client = grpcclient.InferenceServerClient(settings.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("X", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    try:
        client.async_stream_infer("triple", [tensor])
        assert answers.get(timeout=10)[0].as_numpy("Z").tolist() == [[3, 6]]
    finally:
        client.stop_stream()
    names = [record["timestamps"][0]["name"] for record in new_trace(trace_dir, known) if "timestamps" in record]
    assert sorted(names) == sorted(STEP_ORDER + ["INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"])


def test_generate_requests_are_traced_as_triton_traces_them(settings, trace_dir):
    """``/generate`` writes the stamps of ``/infer``; ``/generate_stream`` of a decoupled model an
    INFER_RESPONSE_COMPLETE and an HTTP_SEND pair per response, and one more INFER_RESPONSE_COMPLETE
    for its flags-only final response (Triton 2.51 writes the same)."""
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "triple")[0] == 200
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "py_decoupled")[0] == 200
    status, _, body = request(settings.url, "POST", "/v2/models/triple/generate", {"X": [1, 2], "id": "gen-1"})
    assert status == 200 and json.loads(body)["Z"] == [3, 6]
    records = new_trace(trace_dir, known)
    assert {"id": records[2]["id"], "model_name": "triple", "model_version": 1, "request_id": "gen-1"} == records[2]
    stamps = [(r["timestamps"][0]["name"], r["timestamps"][0]["ns"]) for r in records if "timestamps" in r]
    assert sorted(name for name, _ in stamps) == sorted(FRONT_END_ORDER)
    by_name = dict(stamps)
    assert [by_name[name] for name in FRONT_END_ORDER] == sorted(by_name.values())

    status, _, body = request(settings.url, "POST", "/v2/models/py_decoupled/generate_stream", {"COUNT": 3})
    assert status == 200 and body.count(b"data: ") == 3
    records = new_trace(trace_dir, known + 1)
    names = [record["timestamps"][0]["name"] for record in records if "timestamps" in record]
    assert sorted(names) == sorted(["HTTP_RECV_START", "HTTP_RECV_END"] + STEP_ORDER + ["INFER_RESPONSE_COMPLETE"] * 4
                                   + ["HTTP_SEND_START", "HTTP_SEND_END"] * 3)
    # Each response is written after it came (responses may come faster than they are written).
    assert [name for name in names if name.startswith("HTTP_SEND")] == ["HTTP_SEND_START", "HTTP_SEND_END"] * 3
    for sent in range(1, 4):
        start = [i for i, name in enumerate(names) if name == "HTTP_SEND_START"][sent - 1]
        assert names[:start].count("INFER_RESPONSE_COMPLETE") >= sent
    stamps = [record["timestamps"][0]["ns"] for record in records if "timestamps" in record]
    assert stamps == sorted(stamps)


def test_a_stream_whose_model_fails_at_once_is_traced_to_its_end(settings, trace_dir):
    """The model raises before any response: ``/generate_stream`` answers 400 with the error as its
    one event, and its trace has what Triton 2.51 writes for it: the model's stamps, one
    INFER_RESPONSE_COMPLETE and one HTTP_SEND pair (Triton's pair at 0 ns; tritium's when written)."""
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "py_decoupled")[0] == 200
    status, _, body = request(settings.url, "POST", "/v2/models/py_decoupled/generate_stream", {"COUNT": -3})
    assert status == 400 and b"COUNT -3 asks for an error" in body and body.count(b"data: ") == 1
    records = new_trace(trace_dir, known)
    names = [record["timestamps"][0]["name"] for record in records if "timestamps" in record]
    assert sorted(names) == sorted(FRONT_END_ORDER)
    assert names[-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]
    stamps = [record["timestamps"][0]["ns"] for record in records if "timestamps" in record]
    assert stamps == sorted(stamps)


def test_ensemble_steps_are_child_traces(settings, trace_dir):
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "pipeline")[0] == 200
    tensor = httpclient.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    httpclient.InferenceServerClient(settings.url).infer("pipeline", [tensor])
    records = new_trace(trace_dir, known)
    models = [r for r in records if "model_name" in r]
    parent = next(r for r in models if r["model_name"] == "pipeline")
    steps = [r for r in models if r is not parent]
    assert sorted(r["model_name"] for r in steps) == ["combine", "double", "pre", "triple"]
    assert all(r["parent_id"] == parent["id"] and r["model_version"] == 1 for r in steps)
    for step in steps:
        names = [r["timestamps"][0]["name"] for r in records if r["id"] == step["id"] and "timestamps" in r]
        assert names == STEP_ORDER
    parent_names = {r["timestamps"][0]["name"] for r in records if r["id"] == parent["id"] and "timestamps" in r}
    assert {"HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "REQUEST_END", "HTTP_SEND_END"} <= parent_names
    assert records[-1]["id"] == parent["id"]   # the steps end first


def tensors_by_model(records: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """Per model of the trace: its tensor records, (activity, name, data), in file order."""
    names = {r["id"]: r["model_name"] for r in records if "model_name" in r}
    found: dict[str, list] = {}
    for record in records:
        if "activity" in record:
            tensor = record["tensor"]
            found.setdefault(names.get(record["id"], record["id"]), []).append(
                (record["activity"][7:], tensor["name"], tensor["data"]))
    return found


PIPELINE_TENSORS = {   # what Triton 2.51 writes for IN = [1, 2]
    "pre": [("QUEUE_INPUT", "IN", "1,2"), ("BACKEND_OUTPUT", "X", "2,3")],
    "double": [("QUEUE_INPUT", "X", "2,3"), ("BACKEND_OUTPUT", "Y", "4,6")],
    "triple": [("QUEUE_INPUT", "X", "2,3"), ("BACKEND_OUTPUT", "Z", "6,9")],
    "combine": [("QUEUE_INPUT", "Y", "4,6"), ("QUEUE_INPUT", "Z", "6,9"),
                ("BACKEND_OUTPUT", "SUM", "10,15"), ("BACKEND_OUTPUT", "DIFF", "2,3")],
}


def test_trace_level_tensors_writes_each_ensemble_steps_tensors_in_its_child_trace(settings, trace_dir):
    """As Triton: a step's inputs after its QUEUE_START, its outputs right after them; with
    TENSORS alone, every step's tensors and the ensemble's, the steps first."""
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS", "TENSORS"]}, "pipeline")[0] == 200
    tensor = httpclient.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    client = httpclient.InferenceServerClient(settings.url)
    client.infer("pipeline", [tensor])
    records = new_trace(trace_dir, known)
    found = tensors_by_model(records)
    assert {model: found[model] for model in PIPELINE_TENSORS} == PIPELINE_TENSORS
    assert sorted(found["pipeline"]) == [("BACKEND_OUTPUT", "DIFF", "2,3"), ("BACKEND_OUTPUT", "SUM", "10,15"),
                                         ("QUEUE_INPUT", "IN", "1,2")]
    combine = next(r["id"] for r in records if r.get("model_name") == "combine")
    kinds = [r.get("activity") or r["timestamps"][0]["name"] for r in records if r["id"] == combine and "model_name"
             not in r]
    assert kinds == ["REQUEST_START", "QUEUE_START"] + ["TENSOR_QUEUE_INPUT"] * 2 + ["TENSOR_BACKEND_OUTPUT"] * 2 \
        + STEP_ORDER[2:]

    assert post(settings, {"trace_level": ["TENSORS"]}, "pipeline")[0] == 200
    client.infer("pipeline", [tensor])
    records = new_trace(trace_dir, known + 1)
    assert all("activity" in r for r in records)
    own = [(r["activity"], r["tensor"]["name"], r["tensor"]["data"]) for r in records[-3:]]   # the ensemble's, last
    assert own[0] == ("TENSOR_QUEUE_INPUT", "IN", "1,2")
    assert sorted(own[1:]) == [("TENSOR_BACKEND_OUTPUT", "DIFF", "2,3"), ("TENSOR_BACKEND_OUTPUT", "SUM", "10,15")]
    assert len({r["id"] for r in records}) == 5


def test_bls_calls_made_with_the_requests_trace_are_child_traces(settings, trace_dir):
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS"]}, "bls_triple")[0] == 200
    assert infer(settings, "bls_triple").as_numpy("Z").tolist() == [[3, 6]]
    records = new_trace(trace_dir, known)
    caller = next(r for r in records if r.get("model_name") == "bls_triple")
    called = next(r for r in records if r.get("model_name") == "triple")
    assert called == {"id": called["id"], "model_name": "triple", "model_version": 1, "parent_id": caller["id"]}
    names = [r["timestamps"][0]["name"] for r in records if r["id"] == called["id"] and "timestamps" in r]
    assert names == STEP_ORDER
    stamps = {r["timestamps"][0]["name"]: r["timestamps"][0]["ns"] for r in records if r["id"] == caller["id"]
              and "timestamps" in r}
    call_start = next(r["timestamps"][0]["ns"] for r in records if r["id"] == called["id"] and "timestamps" in r)
    assert stamps["COMPUTE_INPUT_END"] <= call_start <= stamps["COMPUTE_OUTPUT_START"]


def test_trace_level_tensors_writes_a_bls_calls_tensors_in_its_child_trace(settings, trace_dir):
    known = len(trace_files(trace_dir))
    assert post(settings, {"trace_level": ["TIMESTAMPS", "TENSORS"]}, "bls_triple")[0] == 200
    assert infer(settings, "bls_triple").as_numpy("Z").tolist() == [[3, 6]]
    found = tensors_by_model(new_trace(trace_dir, known))
    assert found == {"bls_triple": [("QUEUE_INPUT", "X", "1,2"), ("BACKEND_OUTPUT", "Z", "3,6")],
                     "triple": [("QUEUE_INPUT", "X", "1,2"), ("BACKEND_OUTPUT", "Z", "3,6")]}


def test_rate_traces_every_nth_request(settings, trace_dir):
    assert post(settings, {"trace_level": ["TIMESTAMPS"], "trace_rate": "3"}, "triple")[0] == 200
    known = len(trace_files(trace_dir))
    for sent in range(1, 7):
        infer(settings, "triple")
        if sent in (3, 6):   # the 3rd and the 6th, as Triton picks them
            new_trace(trace_dir, known + sent // 3 - 1)
    time.sleep(0.3)
    assert len(trace_files(trace_dir)) == known + 2


def test_count_runs_out(settings, trace_dir):
    assert post(settings, {"trace_level": ["TIMESTAMPS"], "trace_count": "2"}, "triple")[0] == 200
    known = len(trace_files(trace_dir))
    for _ in range(3):
        infer(settings, "triple")
    new_trace(trace_dir, known + 1)
    time.sleep(0.3)
    assert len(trace_files(trace_dir)) == known + 2
    assert get(settings, "triple")["trace_count"] == "0"


# -- flags ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--trace-config", "rate=abc"], 'Bad option: "--trace-config rate".\nInvalid option value. Got abc'),
    (["--trace-config", "rate"], "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
    (["--trace-config", "mode=zipkin"],
     'invalid value for trace mode option: zipkin. Available options are "triton" and "opentelemetry"'),
    (["--trace-level", "BOGUS"], "invalid value for trace level option: bogus"),
])
def test_bad_flags_stop_startup_with_tritons_words(tmp_path, flags, message):
    done = subprocess.run([sys.executable, "-m", "tritium.cli", "serve", "--model-repository", str(tmp_path),
                           *flags], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


# -- the timeline and the client's context ---------------------------------------------------

def test_stamps_from_another_host_move_onto_the_gateways_clock():
    here = ["gw-host", 10, 1_000, "gateway"]   # host, pid, wall clock minus monotonic clock
    record = {"at": {"broker": ["gw-host", 11, 1_700, "broker"], "instance": ["gpu-host", 12, 5_000, "m"]},
              "ts": [["QUEUE_START", 100, "broker"], ["COMPUTE_END", 200, "instance"]],
              "steps": [{"at": {"instance": ["gpu-host", 13, 9_000, "s"]}, "ts": [["COMPUTE_END", 50, "instance"]]}]}
    moved = _on_timeline(record, here)
    assert moved["ts"] == [["QUEUE_START", 100, "broker"], ["COMPUTE_END", 4_200, "instance"]]
    assert moved["steps"][0]["ts"] == [["COMPUTE_END", 8_050, "instance"]]


def test_a_finished_trace_keeps_what_it_was_sent_with():
    """A stream given up by its client finishes its trace; responses already on their way
    must not add to it, nor send it twice."""
    class Sent:
        here = ["gw-host", 10, 0, "gateway"]

        def __init__(self) -> None:
            self.traces: list[dict] = []

        def finished(self, trace: RequestTrace) -> None:
            self.traces.append(trace.tree())

    sent = Sent()
    trace = RequestTrace(sent, "m", 1, "triton", None, ("TIMESTAMPS", "TENSORS"))  # type: ignore[arg-type]
    trace.every_response = True
    trace.answered(Response(1, [], final=False))
    trace.finish()
    stamps = list(trace.stamps)
    trace.answered(Response(1, [], final=True))
    trace.record_tensors(False, [])
    trace.finish()
    assert [len(t["ts"]) for t in sent.traces] == [1] and trace.stamps == stamps
    assert [stamp[0] for stamp in stamps] == ["INFER_RESPONSE_COMPLETE"]


@pytest.mark.parametrize("header, parsed", [
    (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
     (bytes.fromhex("0af7651916cd43dd8448eb211c80319c"), bytes.fromhex("b7ad6b7169203331"), 1)),
    (b"00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
    (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", None),
    (b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
    (b"not a context", None),
    (None, None),
])
def test_traceparent(header, parsed):
    assert parse_traceparent(header) == parsed
