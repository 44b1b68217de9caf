"""The gRPC front end through tritonclient.grpc (sync, aio and streaming) and raw stubs."""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import struct
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.grpc_requests import stream_count
from tests.models import ALL_TYPES, add_sub_inputs, add_sub_model, all_types_model
from tests.servers import TritiumServer

PYTHON_MODELS = Path(__file__).parent / "python_repo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", max_batch_size=8)
    all_types_model(repo)
    for name in ("py_decoupled", "py_errors", "py_cancellable", "bls_cancel", "py_cancel_polling", "py_text"):
        shutil.copytree(PYTHON_MODELS / name, repo / name)
    with TritiumServer(repo) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    metadata = client.get_server_metadata()
    assert metadata.name == "triton" and "statistics" in metadata.extensions
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model["versions"] == ["1"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}


def test_unknown_model_is_not_found(client):
    # ModelReady answers "not ready" for a model it does not know, as Triton 2.51 does
    # (model_analyzer asks it of every model in the repository index); metadata is NOT_FOUND.
    assert client.is_model_ready("nope") is False
    assert client.is_model_ready("add_sub", "7") is False
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("nope")
    assert error.value.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'nope' is not found" in error.value.message()


def test_config_is_triton_model_config(client):
    config = client.get_model_config("add_sub", as_json=True)["config"]
    assert config["max_batch_size"] == 8 and config["backend"] == "onnxruntime"
    assert config["input"][0]["dims"] == ["16"]  # protobuf JSON prints int64 as strings, as tritonclient gets it from Triton
    proto = client.get_model_config("add_sub").config
    assert proto.instance_group[0].kind == proto.instance_group[0].KIND_CPU


def test_infer_and_statistics(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b), request_id="g1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("g1", "add_sub", "1")
    assert len(response.raw_output_contents) == 2
    stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 2 and stats["version"] == "1"


def test_every_datatype_through_raw_contents(client):
    inputs = []
    expected = {}
    for name, dtype in ALL_TYPES.items():
        array = (np.array([b"x", b"yz"], dtype=np.object_) if name == "BYTES" else np.arange(2).astype(dtype)).reshape(1, 2)
        tensor = grpcclient.InferInput(f"IN_{name}", [1, 2], name)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
        expected[name] = array
    result = client.infer("all_types", inputs)
    for name, array in expected.items():
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{name}"), array, err_msg=name)


@pytest.mark.parametrize("change, status, message", [
    ({"shape": [1, 15]}, "StatusCode.INVALID_ARGUMENT", "unexpected shape for input 'INPUT1' for model 'add_sub'"),
    ({"model": "nope"}, "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found"),
    ({"batch": 9}, "StatusCode.INVALID_ARGUMENT", "inference request batch-size must be <= 8 for 'add_sub'"),
])
def test_errors_have_triton_status_codes_and_the_server_keeps_serving(client, change, status, message):
    rows = change.get("batch", 1)
    a = np.ones((rows, change.get("shape", [1, 16])[1]), dtype=np.float32)
    with pytest.raises(InferenceServerException) as error:
        client.infer(change.get("model", "add_sub"), add_sub_inputs(a, a))
    assert error.value.status() == status and message in error.value.message()
    b = np.ones((1, 16), dtype=np.float32)
    np.testing.assert_array_equal(client.infer("add_sub", add_sub_inputs(b, b)).as_numpy("OUTPUT0"), 2 * b)


def test_model_infer_on_a_decoupled_model_is_unimplemented(client):
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("py_decoupled", [count])
    assert error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in error.value.message()


def _stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_typed_contents_are_accepted_and_mixing_them_with_raw_is_refused(server):
    channel, stub = _stub(server)
    try:
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        for name, value in (("INPUT0", 2.0), ("INPUT1", 0.5)):
            tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            tensor.contents.fp32_contents.extend([value] * 16)
        response = stub.ModelInfer(request)
        assert len(response.raw_output_contents) == 2 and not response.outputs[0].HasField("contents")
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), [2.5] * 16)
        request.raw_input_contents.extend([np.ones(16, np.float32).tobytes()] * 2)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "contents field must not be specified when using raw_input_contents for 'INPUT0'" in error.value.details()
    finally:
        channel.close()


def test_typed_contents_of_megabytes_are_answered_in_full(server):
    # A message this large of typed contents is read off the event loop (gateway/offload.py),
    # on a stream in its place among the others.
    text = bytes(range(97, 123)) * 80_000
    large = service_pb2.ModelInferRequest(model_name="py_text", id="large")
    large.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(text)
    wrong = service_pb2.ModelInferRequest()
    wrong.CopyFrom(large)
    wrong.id, wrong.inputs[0].shape[:] = "wrong", [2]
    small = service_pb2.ModelInferRequest(model_name="py_text", id="small")
    small.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"ok")
    channel, stub = _stub(server)
    try:
        response = stub.ModelInfer(large)
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(wrong)
        streamed = list(stub.ModelStreamInfer(iter([large, wrong, small]), timeout=30))
    finally:
        channel.close()
    named = dict(zip((output.name for output in response.outputs), response.raw_output_contents))
    assert response.id == "large" and named["text_output"] == struct.pack("<I", len(text)) + text.upper()
    assert np.frombuffer(named["length"], np.int32).tolist() == [len(text)]
    expected_error = "unexpected shape for input 'text_input' for model 'py_text'. Expected [1], got [2]"
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and expected_error in error.value.details()
    assert sorted((answer.infer_response.id, answer.error_message[:120]) for answer in streamed) == [
        ("large", ""), ("small", ""), ("wrong", f"[request id: wrong] {expected_error}. ")]
    # py_text runs one request at a time: "small", taken after "large" was read, is answered after it
    answered = [answer.infer_response.id for answer in streamed if not answer.error_message]
    assert answered == ["large", "small"]
    assert streamed[-1].infer_response.raw_output_contents[0] == struct.pack("<I", 2) + b"OK"


def test_a_large_message_that_cannot_be_read_gets_the_error_reading_it_gives(server):
    channel, stub = _stub(server)
    try:
        request = service_pb2.ModelInferRequest(model_name="all_types")
        request.inputs.add(name="IN_INT8", datatype="INT8", shape=[1, 600_000]).contents.int_contents.extend(
            [300] * 600_000)   # 1.2 MB: read on a thread
        with pytest.raises(grpc.RpcError) as out_of_range:
            stub.ModelInfer(request)
        send_bytes = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                         request_serializer=lambda data: data, response_deserializer=lambda data: data)
        with pytest.raises(grpc.RpcError) as unparsable:
            send_bytes(b"\xff" * (2 << 20))
    finally:
        channel.close()
    assert out_of_range.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert out_of_range.value.details() == "input 'IN_INT8' for model 'all_types' has a value out of range for INT8"
    assert (unparsable.value.code(), unparsable.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")


def test_raw_input_contents_left_over_are_ignored_and_one_missing_is_named(server):
    channel, stub = _stub(server)
    try:
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.extend([np.full(16, 2, np.float32).tobytes()])
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request)
        assert (error.value.code(), error.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request.")
        request.raw_input_contents.extend([np.ones(16, np.float32).tobytes(), b"left over"])   # as Triton: ignored
        response = stub.ModelInfer(request)
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), [3.0] * 16)
    finally:
        channel.close()


def _stream(client, requests, expect, headers=None):
    """The answers on one stream: ``expect`` of them, then a short wait to see none more come."""
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    try:
        for model, inputs, kwargs in requests:
            client.async_stream_infer(model, inputs, **kwargs)
        collected = []
        while True:
            try:
                collected.append(answers.get(timeout=10 if len(collected) < expect else 0.3))
            except queue.Empty:
                return collected
    finally:
        client.stop_stream()


def _count(n):
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return tensor


def test_stream_carries_a_decoupled_model_responses_with_final_flags(client):
    answers = _stream(client, [("py_decoupled", [_count(3)], {"request_id": "d3"})], expect=3)
    assert all(error is None for _, error in answers), [str(e) for _, e in answers]
    indexes = [int(result.as_numpy("INDEX")[0]) for result, _ in answers]
    finals = [result.get_response().parameters["triton_final_response"].bool_param for result, _ in answers]
    assert indexes == [0, 1, 2] and finals == [False, False, False]
    assert all(result.get_response().id == "d3" for result, _ in answers)


def test_empty_final_response_only_when_asked(client):
    answers = _stream(client, [("py_decoupled", [_count(2)], {"enable_empty_final_response": True})], expect=3)
    responses = [result.get_response() for result, _ in answers]
    assert [r.parameters["triton_final_response"].bool_param for r in responses] == [False, False, True]
    assert len(responses[-1].outputs) == 0 and responses[-1].model_name == "py_decoupled"


def test_a_stream_error_names_its_request_as_triton_s_do(server):
    """Refused before it starts: the request's id alone; failed by its model: its id, model,
    version as asked and the final flag (what Triton 2.51 sends, side by side)."""
    def request(model: str, id: str, name: str = "CODE", value: int = 0, version: str = ""):
        message = service_pb2.ModelInferRequest(model_name=model, id=id, model_version=version)
        message.inputs.add(name=name, datatype="INT32", shape=[1])
        message.raw_input_contents.append(np.array([value], np.int32).tobytes())
        return message

    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    no_contents = request("py_errors", "u5")
    del no_contents.raw_input_contents[:]
    refused = [request("nope", "u1"), request("py_errors", "u2", name="WRONG"), request("py_errors", "u4", version="7"),
               no_contents]
    answers = [next(iter(stub.ModelStreamInfer(iter([message]), timeout=30))) for message in refused]
    assert [(a.error_message, a.infer_response) for a in answers] == [
        ("Request for unknown model: 'nope' is not found", service_pb2.ModelInferResponse(id="u1")),
        ("unexpected inference input 'WRONG' for model 'py_errors'", service_pb2.ModelInferResponse(id="u2")),
        ("Request for unknown model: 'py_errors' version 7 is not found", service_pb2.ModelInferResponse(id="u4")),
        ("unable to find data for input tensor 'CODE' for model 'py_errors' in request.",
         service_pb2.ModelInferResponse(id="u5"))]
    (failed,) = stub.ModelStreamInfer(iter([request("py_errors", "u3", value=1)]), timeout=30)
    expected = service_pb2.ModelInferResponse(id="u3", model_name="py_errors")
    expected.parameters["triton_final_response"].bool_param = True
    assert (failed.error_message, failed.infer_response) == ("failed with code 1", expected)


def test_stream_errors_arrive_in_the_stream_which_stays_open(client):
    code = grpcclient.InferInput("CODE", [1], "INT32")
    code.set_data_from_numpy(np.array([1], dtype=np.int32))
    ok = grpcclient.InferInput("CODE", [1], "INT32")
    ok.set_data_from_numpy(np.array([0], dtype=np.int32))
    a = np.ones((1, 16), dtype=np.float32)
    answers = _stream(client, [("py_errors", [code], {}), ("py_errors", [ok], {}),
                               ("add_sub", add_sub_inputs(a, a), {})], expect=3)
    errors = [str(error) for _, error in answers if error is not None]
    results = [result for result, error in answers if error is None]
    assert errors == ["failed with code 1"]
    assert len(results) == 2
    assert {r.get_response().model_name for r in results} == {"py_errors", "add_sub"}
    assert all(r.get_response().parameters["triton_final_response"].bool_param for r in results)


def test_with_triton_grpc_error_header_a_stream_error_ends_the_stream_with_its_status(client):
    code = grpcclient.InferInput("CODE", [1], "INT32")
    code.set_data_from_numpy(np.array([1], dtype=np.int32))
    answers = _stream(client, [("py_errors", [code], {})], expect=1, headers={"triton_grpc_error": "true"})
    assert len(answers) == 1 and answers[0][1] is not None
    assert answers[0][1].status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed with code 1" in answers[0][1].message()


def test_aio_client_infer_and_stream(server):
    async def run():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            result = await client.infer("add_sub", add_sub_inputs(a, a, grpcaio))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)

            async def requests():
                count = grpcaio.InferInput("COUNT", [1], "INT32")
                count.set_data_from_numpy(np.array([4], dtype=np.int32))
                yield {"model_name": "py_decoupled", "inputs": [count]}

            seen = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                seen.append(int(result.as_numpy("INDEX")[0]))
                if len(seen) == 4:
                    break
            return seen
        finally:
            await client.close()

    assert asyncio.run(run()) == [0, 1, 2, 3]


def test_message_size_limit_is_configurable(tmp_path):
    add_sub_model(tmp_path, "big")
    with TritiumServer(tmp_path, "--grpc-max-message-size=4096") as small:
        client = grpcclient.InferenceServerClient(small.grpc_url)
        a = np.zeros((1, 16), dtype=np.float32)
        assert client.infer("big", add_sub_inputs(a, a, grpcclient)).as_numpy("OUTPUT0").shape == (1, 16)
        request = service_pb2.ModelInferRequest(model_name="big", raw_input_contents=[b"\0" * 8192])
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(small.grpc_url))
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(request)
        assert failure.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


STOL_ERROR = ("failed to get model version from specified version string '{}' (details: stol), "
              "version should be an integral value > 0")


@pytest.mark.parametrize("version, expected", [
    ("1.0", "1"), ("1e3", "1"), (" 1", "1"),     # std::stol reads the leading integer, as Triton
])
def test_a_version_string_is_read_as_triton_reads_it(client, version, expected):
    assert client.get_model_metadata("add_sub", version).versions == [expected]
    assert client.get_model_config("add_sub", version).config.name == "add_sub"
    assert client.is_model_ready("add_sub", version)


@pytest.mark.parametrize("version, message", [
    ("abc", STOL_ERROR.format("abc")),
    ("99999999999999999999", STOL_ERROR.format("99999999999999999999")),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_a_version_that_is_no_number_is_invalid_everywhere(client, version, message):
    calls = [lambda: client.get_model_metadata("add_sub", version), lambda: client.get_model_config("add_sub", version),
             lambda: client.is_model_ready("add_sub", version),
             lambda: client.get_inference_statistics("add_sub", version),
             lambda: client.infer("add_sub", add_sub_inputs(np.ones((1, 16), np.float32), np.ones((1, 16), np.float32)),
                                  model_version=version)]
    for call in calls:
        with pytest.raises(InferenceServerException) as failure:
            call()
        assert (failure.value.status(), failure.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


@pytest.mark.parametrize("version, message", [
    ("abc", STOL_ERROR.format("abc")),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_a_version_that_is_no_number_is_invalid_before_the_model_is_looked_for(client, version, message):
    calls = [lambda: client.get_model_metadata("nope", version), lambda: client.get_model_config("nope", version),
             lambda: client.infer("nope", add_sub_inputs(np.ones((1, 16), np.float32), np.ones((1, 16), np.float32)),
                                  model_version=version)]
    for call in calls:
        with pytest.raises(InferenceServerException) as failure:
            call()
        assert (failure.value.status(), failure.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_an_unknown_model_is_named_before_what_is_wrong_with_the_inputs(server):
    """As Triton: the model is looked for first, so a bad request to an unknown model is NOT_FOUND."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    no_data = service_pb2.ModelInferRequest(model_name="nope")
    no_data.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    both = service_pb2.ModelInferRequest(model_name="add_sub", model_version="7",
                                         raw_input_contents=[np.ones(16, np.float32).tobytes()])
    both.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16]).contents.fp32_contents.extend([1.0] * 16)
    errors = []
    for request in (no_data, both):
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(request, timeout=10)
        errors.append((failure.value.code(), failure.value.details()))
    assert errors == [(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found"),
                      (grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'add_sub' version 7 is not found")]


def test_a_large_request_read_off_the_event_loop_names_its_unknown_model_first(server):
    """A request of over 1 MiB of typed contents is read on one of the gateway's threads; its
    error is still the unknown model's, not its inputs' (typed contents beside raw ones)."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="nope", model_version="3", raw_input_contents=[b"x"])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 7]).contents.fp32_contents.extend([1.0] * 300_000)
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(request, timeout=30)
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.NOT_FOUND,
                                                               "Request for unknown model: 'nope' is not found")


WITHOUT_REGION = "can not be specified without 'shared_memory_region' parameter for tensor '{}'"
WRONG_TYPE = "invalid value type for '{}' parameter for tensor '{{}}', expected {}."


# Each as Triton 2.51 answers it (checked side by side): the region's type first, then the offset
# and the size (each needs a region, and an int64), then a region without a size.
@pytest.mark.parametrize("where", ["input", "output"])
@pytest.mark.parametrize("parameters, message", [
    ({"shared_memory_offset": 4}, "'shared_memory_offset' " + WITHOUT_REGION),
    ({"shared_memory_byte_size": 64, "shared_memory_offset": 0}, "'shared_memory_offset' " + WITHOUT_REGION),
    ({"shared_memory_byte_size": 64}, "'shared_memory_byte_size' " + WITHOUT_REGION),
    ({"shared_memory_region": "r", "shared_memory_offset": 0},
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor '{}'"),
    ({"shared_memory_region": None, "shared_memory_byte_size": 64}, WRONG_TYPE.format("shared_memory_region", "string_param")),
    ({"shared_memory_region": 5}, WRONG_TYPE.format("shared_memory_region", "string_param")),
    ({"shared_memory_region": "r", "shared_memory_byte_size": "64"},
     WRONG_TYPE.format("shared_memory_byte_size", "int64_param")),
    ({"shared_memory_region": "r", "shared_memory_byte_size": "64", "shared_memory_offset": "0"},
     WRONG_TYPE.format("shared_memory_offset", "int64_param")),
    ({"shared_memory_region": "r", "shared_memory_offset": "0"}, WRONG_TYPE.format("shared_memory_offset", "int64_param")),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 2**63},   # a uint64_param
     WRONG_TYPE.format("shared_memory_byte_size", "int64_param")),
])
def test_shared_memory_parameters_are_refused_in_triton_s_order_and_words(server, where, parameters, message):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[np.ones(16, np.float32).tobytes()] * 2)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    tensor = request.inputs[0] if where == "input" else request.outputs.add(name="OUTPUT0")
    for key, value in parameters.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        elif value is None:
            tensor.parameters[key].SetInParent()   # present, with no value
        elif value >= 2**63:
            tensor.parameters[key].uint64_param = value
        else:
            tensor.parameters[key].int64_param = value
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(request, timeout=10)
    expected = message.format("INPUT0" if where == "input" else "OUTPUT0")
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, expected)


@pytest.mark.parametrize("kind, value, message", [
    ("int64_param", 0, "invalid value for 'classification' parameter, expected >= 0"),   # (HTTP takes 0 as none)
    ("int64_param", -1, "invalid value for 'classification' parameter, expected >= 0"),
    ("string_param", "2", "invalid value type for 'classification' parameter, expected int64_param"),
    ("uint64_param", 2, "invalid value type for 'classification' parameter, expected int64_param"),
])
def test_a_classification_that_is_no_positive_int64_is_refused_with_triton_s_words(server, kind, value, message):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[np.ones(16, np.float32).tobytes()] * 2)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    setattr(request.outputs.add(name="OUTPUT0").parameters["classification"], kind, value)
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(request, timeout=10)
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_an_output_cannot_go_both_to_shared_memory_and_out_as_classes(server):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="add_sub", raw_input_contents=[np.ones(16, np.float32).tobytes()] * 2)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
    output = request.outputs.add(name="OUTPUT0")
    output.parameters["classification"].int64_param = 2
    output.parameters["shared_memory_region"].string_param = "nowhere"   # refused before it is looked for
    output.parameters["shared_memory_byte_size"].int64_param = 64   # (without it, that is the first refusal)
    with pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(request, timeout=10)
    assert (failure.value.code(), failure.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "output can't set both 'shared_memory_region' and 'classification'")


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ModelConfig", "RepositoryModelLoad"])
def test_bytes_that_are_no_protobuf_are_refused_without_a_traceback(server, method):
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as failure:
            call(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
    assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INTERNAL, "Unable to parse request")
    assert "Traceback" not in server.logs() and "DecodeError" not in server.logs()


def test_a_stream_message_that_is_no_protobuf_gets_an_error_and_the_stream_goes_on(server):
    good = service_pb2.ModelInferRequest(model_name="add_sub")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                       response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        answers = list(stream(iter([b"\xff\xff\xff\xff\x0f", good.SerializeToString()]), timeout=10))
    unparsable, missing = sorted(a.error_message for a in answers)
    assert unparsable == "Unable to parse request"
    assert missing.startswith("[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'add_sub'")


def _add_sub_request(**parameters):
    """A correct add_sub request with ``parameters`` given as {key: (kind, value)}."""
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    for key, (kind, value) in parameters.items():
        setattr(request.parameters[key], kind, value)
    return request


_PRIORITY_KINDS = "invalid value type for 'priority' parameter, expected int64_param or uint64_param."
_TIMEOUT_KINDS = "invalid value type for 'timeout' parameter, expected int64_param."
_EMPTY_FINAL_KINDS = ("invalid value type for 'triton_enable_empty_final_response' parameter, "
                      "expected bool_param.")


# Texts and codes as Triton 2.51 answers them.
@pytest.mark.parametrize("parameters, message", [
    ({"priority": ("string_param", "1")}, _PRIORITY_KINDS),
    ({"priority": ("bool_param", True)}, _PRIORITY_KINDS),
    ({"priority": ("double_param", 1.0)}, _PRIORITY_KINDS),
    ({"priority": ("int64_param", -1)}, "invalid value for 'priority', expected value >= 0."),
    ({"timeout": ("string_param", "x")}, _TIMEOUT_KINDS),
    ({"timeout": ("double_param", float("nan"))}, _TIMEOUT_KINDS),
    ({"timeout": ("uint64_param", 5)}, _TIMEOUT_KINDS),
    ({"timeout": ("bool_param", True)}, _TIMEOUT_KINDS),
    ({"sequence_id": ("double_param", 3.0)},
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ({"sequence_end": ("string_param", "true")},
     "invalid value type for 'sequence_end' parameter, expected bool_param."),
    ({"triton_enable_empty_final_response": ("int64_param", 1)}, _EMPTY_FINAL_KINDS),
    ({"triton_enable_empty_final_response": ("string_param", "true")}, _EMPTY_FINAL_KINDS),
    ({"triton_other": ("bool_param", True)},
     "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
     "starting with 'triton_' are allowed: triton_enable_empty_final_response"),
])
def test_a_parameter_of_the_wrong_kind_is_invalid_argument(server, parameters, message):
    channel, stub = _stub(server)
    try:
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(_add_sub_request(**parameters), timeout=10)
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
        stream = list(stub.ModelStreamInfer(iter([_add_sub_request(**parameters)]), timeout=10))
        assert [answer.error_message for answer in stream] == [message]
    finally:
        channel.close()


@pytest.mark.parametrize("parameters", [
    {"priority": ("uint64_param", 1)}, {"priority": ("int64_param", 0)},
    {"timeout": ("int64_param", -5)}, {"timeout": ("int64_param", 10_000_000)},
    {"triton_enable_empty_final_response": ("bool_param", False)},
])
def test_parameters_of_the_kinds_triton_reads_are_accepted(server, parameters):
    channel, stub = _stub(server)
    try:
        response = stub.ModelInfer(_add_sub_request(**parameters), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), [2.0] * 16)
    finally:
        channel.close()


def test_a_log_format_triton_does_not_know_is_refused_with_triton_s_grpc_text(client):
    with pytest.raises(InferenceServerException) as failure:
        client.update_log_settings({"log_format": "bogus"})
    assert (failure.value.status(), failure.value.message()) == (
        "StatusCode.INVALID_ARGUMENT", "invalid argument for log_format, got: bogus")


@pytest.mark.parametrize("key, field, message", [
    ("log_info", "string_param", "expect boolean for 'log_info'"),
    ("log_error", None, "expect boolean for 'log_error'"),
    ("log_verbose_level", "bool_param", "expect int32 for 'log_verbose_level'"),
    ("log_format", "uint32_param", "expect string for 'log_format'"),
])
def test_a_log_setting_of_the_wrong_kind_is_refused_with_triton_s_grpc_text(server, key, field, message):
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        request = service_pb2.LogSettingsRequest()
        setting = request.settings[key]
        if field is not None:
            setattr(setting, field, {"string_param": "1", "bool_param": True, "uint32_param": 1}[field])
        with pytest.raises(grpc.RpcError) as failure:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request, timeout=10)
        assert (failure.value.code(), failure.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    finally:
        channel.close()


@pytest.mark.parametrize("kind", ["uint64_param", None])
def test_a_model_parameter_of_a_kind_triton_does_not_pass_on_is_refused(server, kind):
    message = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        message.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    parameter = message.parameters["p"]
    if kind is not None:
        setattr(parameter, kind, 3)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(message, timeout=10)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid value type for 'p' parameter, expected int64_param, bool_param, or string_param.")
    message.parameters["p"].double_param = 0.5   # Triton passes a double on too
    assert len(stub.ModelInfer(message, timeout=10).raw_output_contents) == 2


def _stopped_streams(server) -> int:
    """How many of py_cancellable's streams stopped early, once their client cancelled."""
    ((result, _),) = stream_count(server.grpc_url, "py_cancellable", 0, 1)
    return int(result.as_numpy("INDEX")[0])


def _until_stopped(server, before: int) -> int:
    deadline = time.monotonic() + 10
    while (stopped := _stopped_streams(server)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    return stopped


def test_a_decoupled_model_sees_its_stream_cancelled_and_stops(server):
    """As with Triton 2.51: stop_stream(cancel_requests=True) reaches the model's running request
    (request.is_cancelled() and response_sender.is_cancelled()), which stops streaming."""
    before = _stopped_streams(server)
    got = stream_count(server.grpc_url, "py_cancellable", 200, 3, cancel=True)
    assert [result.as_numpy("INDEX").tolist() for result, _ in got] == [[0], [1], [2]]
    assert _until_stopped(server, before) == before + 1   # long before its 200 responses (10 s)


def test_a_decoupled_model_streaming_inside_execute_sees_its_stream_cancelled(server):
    """The model's one instance is busy in execute: the cancel reaches it there (the instance's
    heartbeat thread marks the request), as Triton's stub lets a model poll is_cancelled()."""
    before = _stopped_streams(server)
    got = stream_count(server.grpc_url, "py_cancellable", -200, 3, cancel=True)
    assert [result.as_numpy("INDEX").tolist() for result, _ in got] == [[0], [1], [2]]
    started = time.monotonic()
    assert _until_stopped(server, before) == before + 1
    assert time.monotonic() - started < 5   # its 200 responses would take 10 s


@pytest.mark.parametrize("leaving", ["fin", "reset"])
def test_an_http_client_leaving_its_generate_stream_stops_the_decoupled_model(server, leaving):
    """Over HTTP too: a /generate_stream client that half-closes or resets after the first event
    has left, and the model's running request sees it (is_cancelled()) long before its 200 events."""
    before = _stopped_streams(server)
    host, port = server.url.rsplit(":", 1)
    body = b'{"COUNT": 200}'
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/py_cancellable/generate_stream HTTP/1.1\r\nhost: t\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
        if leaving == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_WR)
    started = time.monotonic()
    assert _until_stopped(server, before) == before + 1
    assert time.monotonic() - started < 5   # its 200 events would take 10 s


def test_a_model_polling_during_a_long_execute_sees_its_client_give_up(server):
    """A ModelInfer past its deadline while its (not decoupled) model works inside execute: the
    model sees request.is_cancelled() and returns early."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))

    def call(count: int, timeout: float):
        message = service_pb2.ModelInferRequest(model_name="py_cancel_polling")
        tensor = message.inputs.add(name="COUNT", datatype="INT32", shape=[1])
        tensor.contents.int_contents.append(count)
        reply = stub.ModelInfer(message, timeout=timeout)
        return np.frombuffer(reply.raw_output_contents[0], np.int32)[0]

    before = call(0, 10)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as gave_up:
        call(1000, 0.3)   # 10 s of work
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert call(0, 10) == before + 1   # waits for the instance: it stopped early
    assert time.monotonic() - started < 5


def test_a_request_given_up_while_it_waits_at_its_busy_instance_never_runs(server, client):
    """A model without batching takes a second request while one runs (it waits at the
    instance): given up there (its deadline), it is dropped unrun, as Triton drops a cancelled
    request from its queue, and counted as a CANCELED failure, not executed."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))

    def call(count: int, timeout: float):
        message = service_pb2.ModelInferRequest(model_name="py_cancel_polling")
        tensor = message.inputs.add(name="COUNT", datatype="INT32", shape=[1])
        tensor.contents.int_contents.append(count)
        return stub.ModelInfer.future(message, timeout=timeout)

    def statistics() -> tuple[int, int, int]:
        stats = client.get_inference_statistics("py_cancel_polling", as_json=True)["model_stats"][0]
        inference = stats["inference_stats"]
        return (int(stats.get("execution_count", 0)), int(inference["success"].get("count", 0)),
                int(inference["fail"].get("count", 0)))

    executions, successes, failures = statistics()
    running = call(100, 10)   # a second of work: the cancel below has long enough to reach the instance
    time.sleep(0.15)
    with pytest.raises(grpc.RpcError) as gave_up:
        call(50, 0.2).result()   # sent to the instance, where it waits behind the first
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert np.frombuffer(running.result().raw_output_contents[0], np.int32)[0] == 100
    deadline = time.monotonic() + 5
    while statistics()[2] == failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert statistics() == (executions + 1, successes + 1, failures + 1)


def test_a_model_cancelling_its_bls_response_iterator_stops_the_called_model(server, client):
    before = _stopped_streams(server)
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], np.int32))
    result = client.infer("bls_cancel", [count])
    assert result.as_numpy("SEEN").tolist() == [0, 1]
    # As in Triton, the iterator reads on after its cancel up to the final response: the called
    # model's stream stopped (its final flag alone), maybe after one response already on its way.
    assert result.as_numpy("AFTER").tolist() in ([-1], [2, -1])
    assert _until_stopped(server, before) == before + 1
