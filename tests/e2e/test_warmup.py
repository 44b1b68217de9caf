"""model_warmup as Triton runs it (Triton 2.51 side by side): each sample is ``count`` executions of
``batch_size`` requests of batch 1, each with the sample's data; samples whose inputs a client's
request could not have, or whose execution fails, fail the load with Triton's words."""

from __future__ import annotations

import json
import struct

import pytest

from tests.e2e.rawhttp import request
from tests.servers import TritiumServer

RECORDER = '''
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        with open(Path(__file__).parent.parent / "executions.jsonl", "a") as log:
            log.write(json.dumps([[list(v.shape), v.ravel()[0].decode() if v.dtype == object else float(v.ravel()[0])]
                                  for v in values]) + "\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", v)]) for v in values]
'''
FAILING = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred")) for _ in requests]
'''

# A decoupled model: two responses to each request, the second final; sent from a thread of its
# own after execute returns when the request's first value is 1, and an error first when it is 2.
DECOUPLED = '''
import json
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

LOG = Path(__file__).parent.parent / "executions.jsonl"


def note(entry):
    with open(LOG, "a") as log:
        log.write(json.dumps(entry) + "\\n")


class TritonPythonModel:
    def execute(self, requests):
        values = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        note(["execute", len(requests)])

        def answer():
            note(["answering", len(requests)])
            for request, value in zip(requests, values):
                sender = request.get_response_sender()
                first = pb_utils.InferenceResponse(error=pb_utils.TritonError("warm fail")) if value[0, 0] == 2 \\
                    else pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)])
                sender.send(first)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value * 2)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        if values[0][0, 0] == 1:
            threading.Thread(target=lambda: (time.sleep(0.3), answer())).start()
        else:
            answer()
        return None
'''

# A sequence model noting which inputs each request brings and its correlation ID.
SEQUENCE = '''
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils


def value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else float(tensor.as_numpy().ravel()[0])


class TritonPythonModel:
    def execute(self, requests):
        with open(Path(__file__).parent.parent / "executions.jsonl", "a") as log:
            log.write(json.dumps([[value(r, "INPUT0"), value(r, "START"), r.correlation_id()] for r in requests]) + "\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                                                            .as_numpy())]) for r in requests]
'''


def config(name: str, datatype: str, sample: str, inputs: int = 1) -> str:
    declared = ", ".join(f'{{ name: "INPUT{i}", data_type: {datatype}, dims: [ 4 ] }}' for i in range(inputs))
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\ninput [ {declared} ]\n'
            f'output [ {{ name: "OUTPUT0", data_type: {datatype}, dims: [ 4 ] }} ]\nmodel_warmup [ {sample} ]\n')


def sample(batch_size: int = 1, count: int = 1, inputs: str = "", name: str = "s1") -> str:
    return f'{{ name: "{name}" batch_size: {batch_size} count: {count} {inputs} }}'


def data(name: str, datatype: str = "TYPE_FP32", dims: int = 4, source: str = "zero_data: true") -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: {datatype} dims: [ {dims} ] {source} }} }}'


def decoupled(name: str, source: str) -> str:
    return (config(name, "TYPE_FP32", sample(2, 2, data("INPUT0", source=source), name="w1"))
            + "model_transaction_policy { decoupled: true }\n")


FP32 = "TYPE_FP32"
MODELS = {
    # name: (config, model.py, warmup files)
    "from_file": (config("from_file", "TYPE_STRING", sample(2, 2, data("INPUT0", "TYPE_STRING", 1, 'input_data_file: "raw"'))
                         ).replace("dims: [ 4 ]", "dims: [ 1 ]"), RECORDER, {"raw": struct.pack("<I", 3) + b"233"}),
    "zeros": (config("zeros", FP32, sample(3, 1, data("INPUT0"))), RECORDER, {}),
    "bad_shape": (config("bad_shape", FP32, sample(1, 1, data("INPUT0", dims=3))), RECORDER, {}),
    "missing_input": (config("missing_input", FP32, sample(1, 1, data("INPUT0")), inputs=2), RECORDER, {}),
    "wrong_type": (config("wrong_type", FP32, sample(1, 1, data("INPUT0", "TYPE_INT32"))), RECORDER, {}),
    "no_type": (config("no_type", FP32, sample(1, 1, data("INPUT0").replace("data_type: TYPE_FP32 ", ""))),
                RECORDER, {}),
    "big_batch": (config("big_batch", FP32, sample(9, 1, data("INPUT0"))), RECORDER, {}),
    "failing": (config("failing", FP32, sample(1, 1, data("INPUT0"), name="zero sample")), FAILING, {}),
    "short_file": (config("short_file", FP32, sample(1, 1, data("INPUT0", source='input_data_file: "short"'))),
                   RECORDER, {"short": bytes(4)}),
    "no_file": (config("no_file", FP32, sample(1, 1, data("INPUT0", source='input_data_file: "absent"'))), RECORDER, {}),
    # a larger file gives its first bytes; a sample of batch 0 is skipped (Triton 2.51 side by side)
    "large_file": (config("large_file", FP32, sample(1, 1, data("INPUT0", source='input_data_file: "large"'))),
                   RECORDER, {"large": struct.pack("<5f", 7, 0, 0, 0, 9)}),
    "batch_0": (config("batch_0", FP32, sample(0, 1, data("INPUT0", dims=3))), RECORDER, {}),
    "unbatched": (config("unbatched", FP32, sample(3, 1, data("INPUT0"))).replace("max_batch_size: 4", "max_batch_size: 0"),
                  RECORDER, {}),
    "variable": (config("variable", FP32, sample(1, 1, data("INPUT0", dims=-1))), RECORDER, {}),
    # decoupled models: an execution ends with its requests' final responses (Triton 2.51 side by side)
    "decoupled": (decoupled("decoupled", "zero_data: true"), DECOUPLED, {}),
    "decoupled_later": (decoupled("decoupled_later", 'input_data_file: "ones"'), DECOUPLED,
                        {"ones": struct.pack("<4f", 1, 1, 1, 1)}),
    "decoupled_error": (decoupled("decoupled_error", 'input_data_file: "twos"'), DECOUPLED,
                        {"twos": struct.pack("<4f", 2, 2, 2, 2)}),
    # a sequence model's warmup requests: no control inputs, correlation ID 0 (Triton 2.51 side by side)
    "sequence": (config("sequence", FP32, sample(2, 1, data("INPUT0"))) + 'sequence_batching { control_input [ '
                 '{ name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }\n',
                 SEQUENCE, {}),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name, (text, source, files) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
        (repo / name / "1" / "model.py").write_text(source)
        for file, content in files.items():
            (repo / name / "warmup").mkdir(exist_ok=True)
            (repo / name / "warmup" / file).write_bytes(content)
    with TritiumServer(repo, "--exit-on-error=false") as running:
        running.repo = repo
        yield running


def reasons(server) -> dict[str, str]:
    _, _, body = request(server.url, "POST", "/v2/repository/index", {})
    return {entry["name"]: entry.get("reason", entry.get("state")) for entry in json.loads(body)}


def executions(server, model: str) -> list:
    return [json.loads(line) for line in (server.repo / model / "executions.jsonl").read_text().splitlines()]


def test_each_sample_is_batch_size_requests_of_batch_1_each_with_the_samples_data(server):
    # a BYTES file holds one request's elements: each of the batch's requests gets them
    assert {reasons(server)[model] for model in ("from_file", "zeros", "large_file", "batch_0")} == {"READY"}
    assert executions(server, "from_file") == [[[[1, 1], "233"]] * 2] * 2
    assert executions(server, "zeros") == [[[[1, 4], 0.0]] * 3]
    assert executions(server, "large_file") == [[[[1, 4], 7.0]]]
    assert not (server.repo / "batch_0" / "executions.jsonl").exists()


@pytest.mark.parametrize("model, reason", [
    ("bad_shape", "Invalid argument: [request id: <id_unknown>] unexpected shape for input 'INPUT0' for model "
                  "'bad_shape'. Expected [-1,4], got [1,3]. NOTE: Setting a non-zero max_batch_size in the model "
                  "config requires a batch dimension to be prepended to each input shape. If you want to specify the "
                  "full shape including the batch dim in your input dims config, try setting max_batch_size to zero. "
                  "See the model configuration docs for more info on max_batch_size."),
    ("missing_input", "Invalid argument: [request id: <id_unknown>] expected 2 inputs but got 1 inputs for model "
                      "'missing_input'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
                      "Please provide all required input(s)."),
    ("wrong_type", "Invalid argument: [request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but "
                   "model 'wrong_type' expects 'FP32'"),
    ("no_type", "Invalid argument: [request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', "
                "but model 'no_type' expects 'FP32'"),   # (Triton 2.51 side by side)
    ("big_batch", "Invalid argument: failed to run warmup sample 's1': "
                  + "batch size 9 for 'big_batch_0', max allowed is 4; " * 9),
    ("unbatched", "Invalid argument: failed to run warmup sample 's1': "
                  + "batch size 3 for 'unbatched_0', max allowed is 0; " * 3),
    ("failing", "Invalid argument: failed to run warmup sample 'zero sample': An Error Occurred; "),
    ("variable", "Invalid argument: warmup setting expects all variable-size dimensions are specified for input "
                 "'INPUT0'"),
    ("decoupled_error", "Invalid argument: failed to run warmup sample 'w1': warm fail; warm fail; "),
    ("short_file", "Invalid argument: [request id: <id_unknown>] warmup setting expects 16 bytes, but the data "
                   "provided from short has 4 bytes"),
    ("no_file", "Internal: failed to open text file for read {repo}/no_file/warmup/absent: No such file or directory"),
])
def test_a_sample_a_request_could_not_be_or_that_fails_fails_the_load_in_tritons_words(server, model, reason):
    assert reasons(server)[model] == reason.format(repo=server.repo)
    if model != "decoupled_error":   # (its model ran: an error response fails it)
        assert not (server.repo / model / "executions.jsonl").exists()


def test_a_decoupled_models_execution_ends_with_its_requests_final_responses(server):
    assert (reasons(server)["decoupled"], reasons(server)["decoupled_later"]) == ("READY", "READY")
    assert executions(server, "decoupled") == [["execute", 2], ["answering", 2]] * 2
    # answered from a thread 0.3 s after execute returned: the next execution waits for them
    assert executions(server, "decoupled_later") == [["execute", 2], ["answering", 2]] * 2
    assert executions(server, "decoupled_error") == [["execute", 2], ["answering", 2]]


def test_a_sequence_models_warmup_requests_have_no_control_inputs_and_its_sequences_then_do(server):
    assert reasons(server)["sequence"] == "READY"
    body = {"parameters": {"sequence_id": 7, "sequence_start": True, "sequence_end": True},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [5, 5, 5, 5]}]}
    status, _, _ = request(server.url, "POST", "/v2/models/sequence/infer", body)
    assert status == 200
    assert executions(server, "sequence") == [[[0.0, None, 0], [0.0, None, 0]], [[5.0, 1.0, 7]]]


def test_warmup_executions_count_in_the_statistics_as_in_triton(server):
    """Triton 2.51 side by side: a model's warmup shows in its statistics before any request."""
    for model, inferences, executions, batch_size in (("zeros", 3, 1, 3), ("from_file", 4, 2, 2),
                                                      ("decoupled_later", 4, 2, 2)):
        _, _, body = request(server.url, "GET", f"/v2/models/{model}/stats")
        (stats,) = json.loads(body)["model_stats"]
        assert (stats["inference_count"], stats["execution_count"]) == (inferences, executions)
        assert stats["inference_stats"]["success"]["count"] == inferences
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(batch_size, executions)]
