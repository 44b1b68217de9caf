"""BatchExecutor: one BATCH message in, one BATCH_DONE out, with tiny in-test instances.

BATCH messages are built exactly as the broker sends them (broker/scheduler.py _send_batch):
``[BATCH record, (INFER record, external frames...) * n]``, each INFER record as the
gateway encodes it (gateway/dataplane.py infer and gateway/broker_link.py request: tensor
descriptors ``[name, datatype, shape, nbytes, external]``, small tensors inline after the
header, large ones as external frames counted by ``x``, plus the ``rid``). Only the
helpers ``infer_record``, ``batch_frames`` and ``parse_done`` know the wire format.
"""

from __future__ import annotations

import struct
import weakref
from types import SimpleNamespace

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.errors import ErrorCode, InternalError, InvalidArgument
from tritium.protocol import INLINE_LIMIT, Batch, BatchDone, Infer, Response, pack_tensors, read_record
from tritium.tracing.stamps import batch_stamps
from tritium.workers.backends.base import RESCHEDULED, InferenceRequest, InferenceResponse, Instance
from tritium.workers.executor import BatchExecutor
from tests.workers.batch_done import parse_done

BATCHING_CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "DOUBLE" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "PLUS1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""


def config(text: str = BATCHING_CONFIG) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


class Doubler(Instance):
    """Stacked execution: DOUBLE = IN * 2, PLUS1 = IN + 1; records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, list]] = []

    def execute_batch(self, inputs, output_names):
        self.calls.append((inputs, list(output_names)))
        x = inputs["IN"]
        outputs = {"DOUBLE": x * 2, "PLUS1": x + 1}
        return {name: outputs[name] for name in output_names}


class PerRequest(Instance):
    """Request-by-request execution (Python-backend style)."""

    def __init__(self, respond=None) -> None:
        self.seen: list[list[InferenceRequest]] = []
        self.respond = respond

    def execute(self, requests):
        self.seen.append(requests)
        if self.respond is not None:
            return self.respond(requests)
        return [InferenceResponse(outputs={"DOUBLE": r.inputs["IN"] * 2, "PLUS1": r.inputs["IN"] + 1},
                                  parameters={"rid_seen": r.request_id})
                for r in requests]


class Raises(Instance):
    def execute_batch(self, inputs, output_names):
        raise RuntimeError("boom")


class ReturnsFloat64(Instance):
    def execute_batch(self, inputs, output_names):
        return {"DOUBLE": inputs["IN"].astype(np.float64) * 2,
                "PLUS1": inputs["IN"] + 1}


def infer_record(rid, inputs, batch_size=1, outputs=None, request_id="", params=None,
                 model="m", version=1) -> list:
    """The INFER record and its external frames, as gateway/dataplane.py and broker_link encode them."""
    descriptors, inline, external = pack_tensors((name, datatype, list(shape), data)
                                                 for name, datatype, shape, data in inputs)
    infer = Infer(rid, model, descriptors, version=version, batch_size=batch_size, request_id=request_id or None,
                  outputs=outputs, params=params or None, external=len(external))
    return [infer.encode(inline), *external]


def batch_frames(requests: list[dict], number: int = 17) -> list:
    """[BATCH record, (INFER record, external...) * n] as broker/scheduler.py _send_batch builds it."""
    parts = [Batch(number, len(requests)).encode()]
    for request in requests:
        parts.extend(infer_record(**request))
    return parts


def fp32_input(array, name="IN"):
    array = np.ascontiguousarray(array, dtype="<f4")
    return (name, "FP32", list(array.shape), array.tobytes())


def rows(batch_size, start=0.0):
    return np.arange(batch_size * 4, dtype=np.float32).reshape(batch_size, 4) + start


def outputs_of(header) -> list:
    """[[name, datatype, shape], ...] of a RESPONSE."""
    return [list(d[:3]) for d in header.outputs or []]


def run(instance, requests, cfg=None, number=17):
    executor = BatchExecutor(instance, cfg or config())
    return parse_done(executor.run(batch_frames(requests, number)))


# -- stacking and splitting -------------------------------------------------------------------

def test_requests_are_stacked_along_dim_0_and_split_back():
    instance = Doubler()
    inputs = [rows(1, 0), rows(2, 100), rows(1, 200)]
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(inputs[0])], "batch_size": 1},
        {"rid": 2, "inputs": [fp32_input(inputs[1])], "batch_size": 2},
        {"rid": 3, "inputs": [fp32_input(inputs[2])], "batch_size": 1},
    ])
    # One execution, with every request stacked in order.
    (stacked, names), = instance.calls
    assert stacked["IN"].shape == (4, 4)
    np.testing.assert_array_equal(stacked["IN"], np.concatenate(inputs))
    assert names == ["DOUBLE", "PLUS1"]
    # Each request gets its own rows back.
    assert [h.rid for h, _ in responses] == [1, 2, 3]
    for (header, arrays), x in zip(responses, inputs):
        assert isinstance(header, Response)
        assert header.error is None
        assert outputs_of(header) == [["DOUBLE", "FP32", list(x.shape)], ["PLUS1", "FP32", list(x.shape)]]
        np.testing.assert_array_equal(arrays["DOUBLE"], x * 2)
        np.testing.assert_array_equal(arrays["PLUS1"], x + 1)
    assert done.ok == [True, True, True]
    assert done.response_frames == [0, 0, 0]                          # small outputs ride inline
    assert [len(outputs_of(h)) for h, _ in responses] == [2, 2, 2]


def test_a_small_input_is_read_in_place_from_its_record():
    instance = Doubler()
    parts = batch_frames([{"rid": 1, "inputs": [fp32_input(rows(2))], "batch_size": 2}])
    record = bytearray(parts[1])
    parts[1] = record
    BatchExecutor(instance, config()).run(parts)
    (given, _), = instance.calls
    assert np.shares_memory(given["IN"], np.frombuffer(record, dtype=np.uint8))
    np.testing.assert_array_equal(given["IN"], rows(2))


BIG_ROWS = INLINE_LIMIT // 16 + 1          # rows of 4 FP32 (16 bytes): over INLINE_LIMIT


def big_config():
    return config(BATCHING_CONFIG.replace("max_batch_size: 8", f"max_batch_size: {2 * BIG_ROWS}"))


def test_a_large_input_travels_as_an_external_frame_and_reaches_the_model_without_a_copy():
    instance = Doubler()
    big = rows(BIG_ROWS)
    frame = bytearray(big.tobytes())
    parts = batch_frames([{"rid": 1, "inputs": [("IN", "FP32", list(big.shape), frame)],
                           "batch_size": BIG_ROWS}])
    assert len(parts) == 3 and parts[2] is frame             # BATCH, INFER, the external frame
    BatchExecutor(instance, big_config()).run(parts)
    (given, _), = instance.calls
    assert np.shares_memory(given["IN"], np.frombuffer(frame, dtype=np.uint8))


def test_large_outputs_come_back_as_external_frames():
    big = rows(BIG_ROWS)
    done, responses = run(Doubler(), [
        {"rid": 1, "inputs": [fp32_input(big)], "batch_size": BIG_ROWS, "outputs": ["DOUBLE"]},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ], cfg=big_config())
    assert done.response_frames == [1, 0]
    descriptor = responses[0][0].outputs[0]
    assert descriptor[3] == big.nbytes and descriptor[4] is True
    np.testing.assert_array_equal(responses[0][1]["DOUBLE"], big * 2)
    np.testing.assert_array_equal(responses[1][1]["PLUS1"], rows(1) + 1)


def test_zmq_like_frames_with_a_buffer_attribute_are_read():
    class Frame:
        def __init__(self, data):
            self.buffer = memoryview(data)

    x = rows(1)
    parts = [Frame(p) for p in batch_frames([{"rid": 9, "inputs": [fp32_input(x)]}], number=3)]
    done, responses = parse_done(BatchExecutor(Doubler(), config()).run(parts))
    assert done.number == 3
    np.testing.assert_array_equal(responses[0][1]["DOUBLE"], x * 2)


def test_each_request_gets_only_the_outputs_it_asked_for():
    instance = Doubler()
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(rows(1))], "outputs": ["PLUS1"]},
        {"rid": 2, "inputs": [fp32_input(rows(1, 10))]},
        {"rid": 3, "inputs": [fp32_input(rows(1, 20))], "outputs": ["PLUS1", "DOUBLE"]},
    ])
    assert instance.calls[0][1] == ["DOUBLE", "PLUS1"]   # the union, in config order
    assert [o[0] for o in responses[0][0].outputs] == ["PLUS1"]
    assert [o[0] for o in responses[1][0].outputs] == ["DOUBLE", "PLUS1"]
    assert [o[0] for o in responses[2][0].outputs] == ["PLUS1", "DOUBLE"]
    np.testing.assert_array_equal(responses[0][1]["PLUS1"], rows(1) + 1)
    np.testing.assert_array_equal(responses[2][1]["DOUBLE"], rows(1, 20) * 2)
    assert [len(outputs_of(h)) for h, _ in responses] == [1, 2, 2]


def test_only_the_requested_outputs_are_asked_of_the_model():
    instance = Doubler()
    run(instance, [{"rid": 1, "inputs": [fp32_input(rows(1))], "outputs": ["PLUS1"]},
                   {"rid": 2, "inputs": [fp32_input(rows(1))], "outputs": ["PLUS1"]}])
    assert instance.calls[0][1] == ["PLUS1"]


def test_a_requested_output_the_model_did_not_produce_is_an_error():
    class OnlyDouble(Instance):
        def execute_batch(self, inputs, output_names):
            return {"DOUBLE": inputs["IN"] * 2}

    done, responses = run(OnlyDouble(), [
        {"rid": 1, "inputs": [fp32_input(rows(1))], "outputs": ["DOUBLE"]},
        {"rid": 2, "inputs": [fp32_input(rows(1))], "outputs": ["PLUS1"]},
    ])
    # The model broke its contract for the execution; at least the request that asked for
    # the missing output fails, with an INTERNAL error naming the model and the output.
    assert done.ok[1] is False
    error = responses[1][0].error
    assert error.code == ErrorCode.INTERNAL
    assert "PLUS1" in error.message and "'m'" in error.message


# -- reshape ---------------------------------------------------------------------------------

RESHAPE_CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
"""


def test_input_and_output_reshape_from_the_config():
    seen = []

    class Model(Instance):
        def execute_batch(self, inputs, output_names):
            seen.append(inputs["IN"].shape)
            return {"OUT": inputs["IN"] * 3}         # shaped like reshape: [batch, 2, 2]

    x1, x2 = rows(1), rows(2, 50)
    done, responses = run(Model(), [
        {"rid": 1, "inputs": [fp32_input(x1)], "batch_size": 1},
        {"rid": 2, "inputs": [fp32_input(x2)], "batch_size": 2},
    ], cfg=config(RESHAPE_CONFIG))
    assert seen == [(3, 2, 2)]
    assert outputs_of(responses[0][0]) == [["OUT", "FP32", [1, 4]]]
    assert outputs_of(responses[1][0]) == [["OUT", "FP32", [2, 4]]]
    np.testing.assert_array_equal(responses[1][1]["OUT"], x2 * 3)


def test_reshape_of_a_non_batching_model():
    text = """
    name: "m"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1, 4 ] reshape { shape: [ 4 ] } } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1, 4 ] reshape { shape: [ 2, 2 ] } } ]
    """
    seen = []

    class Model(Instance):
        def execute(self, requests):
            seen.extend(r.inputs["IN"].shape for r in requests)
            return [InferenceResponse(outputs={"OUT": r.inputs["IN"].reshape(2, 2)}) for r in requests]

    done, responses = run(Model(), [{"rid": 1, "inputs": [fp32_input(rows(1))]}], cfg=config(text))
    assert done.ok == [True]
    assert seen == [(4,)]
    assert outputs_of(responses[0][0]) == [["OUT", "FP32", [1, 4]]]
    np.testing.assert_array_equal(responses[0][1]["OUT"], rows(1))


# -- failures --------------------------------------------------------------------------------

def test_a_request_with_other_non_batch_shapes_fails_alone():
    text = BATCHING_CONFIG.replace(
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]')
    instance = Doubler()
    odd = np.arange(3, dtype=np.float32).reshape(1, 3)
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [fp32_input(odd)]},
        {"rid": 3, "inputs": [fp32_input(rows(1, 5))]},
    ], cfg=config(text))
    assert done.ok == [True, False, True]
    assert instance.calls[0][0]["IN"].shape == (2, 4)
    assert responses[1][0].error.code == ErrorCode.INVALID_ARG
    assert "'m'" in responses[1][0].error.message
    np.testing.assert_array_equal(responses[2][1]["DOUBLE"], rows(1, 5) * 2)


def test_a_request_whose_record_is_cut_short_fails_alone():
    instance = Doubler()
    parts = batch_frames([{"rid": 1, "inputs": [fp32_input(rows(1))]},
                          {"rid": 2, "inputs": [fp32_input(rows(1))]},
                          {"rid": 3, "inputs": [fp32_input(rows(1, 5))]}])
    parts[2] = parts[2][:-4]                    # rid 2: its inline tensor overruns the record
    done, responses = parse_done(BatchExecutor(instance, config()).run(parts))
    assert done.ok == [True, False, True]
    assert instance.calls[0][0]["IN"].shape == (2, 4)
    assert responses[1][0].rid == 2
    assert responses[1][0].error.code == ErrorCode.INTERNAL
    np.testing.assert_array_equal(responses[2][1]["DOUBLE"], rows(1, 5) * 2)


def test_a_bad_request_fails_alone():
    instance = Doubler()
    bad = ("IN", "FP32", [1, 4], np.zeros(2, "<f4").tobytes())      # 2 elements for shape [1, 4]
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [bad]},
        {"rid": 3, "inputs": [fp32_input(rows(1, 5))]},
    ])
    assert done.ok == [True, False, True]
    assert [len(outputs_of(h)) for h, _ in responses] == [2, 0, 2]
    assert instance.calls[0][0]["IN"].shape == (2, 4)               # the two good ones only
    header = responses[1][0]
    assert header.rid == 2
    assert header.error.code == ErrorCode.INVALID_ARG
    assert "'IN'" in header.error.message
    np.testing.assert_array_equal(responses[2][1]["DOUBLE"], rows(1, 5) * 2)


def test_malformed_bytes_in_one_request_fail_it_alone():
    text = """
    name: "m"
    max_batch_size: 8
    input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "LEN" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """
    seen = []

    class Lengths(Instance):
        def execute_batch(self, inputs, output_names):
            seen.append(inputs["S"].tolist())
            return {"LEN": np.array([[len(s[0])] for s in inputs["S"]], dtype=np.float32)}

    good = struct.pack("<I", 3) + b"\xffab"
    done, responses = run(Lengths(), [
        {"rid": 1, "inputs": [("S", "BYTES", [1, 1], good)]},
        {"rid": 2, "inputs": [("S", "BYTES", [1, 1], struct.pack("<I", 9) + b"x")]},
    ], cfg=config(text))
    assert done.ok == [True, False]
    assert seen == [[[b"\xffab"]]]
    assert responses[0][1]["LEN"].tolist() == [[3.0]]
    assert responses[1][0].error.code == ErrorCode.INVALID_ARG


def test_a_partial_element_frame_fails_alone():
    done, responses = run(Doubler(), [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [("IN", "FP32", [1, 4], b"\x00" * 15)]},
    ])
    assert done.ok == [True, False]
    assert responses[1][0].error.code == ErrorCode.INVALID_ARG


def test_a_partial_element_frame_fails_alone_on_the_per_request_path():
    instance = PerRequest()
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [("IN", "FP32", [1, 4], b"\x00" * 15)]},
    ])
    assert done.ok == [True, False]
    assert responses[1][0].error.code == ErrorCode.INVALID_ARG


def test_an_exception_in_the_model_fails_every_request_with_internal():
    done, responses = run(Raises(), [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [fp32_input(rows(2))], "batch_size": 2},
    ])
    assert done.ok == [False, False]
    assert done.response_frames == [0, 0]
    for header, arrays in responses:
        assert arrays == {}
        assert header.error.code == ErrorCode.INTERNAL
        assert "model 'm'" in header.error.message
        assert "boom" in header.error.message
    assert all(t >= 0 for t in done.timings)


def test_a_tritium_error_from_the_model_keeps_its_code():
    class Refuses(Instance):
        def execute_batch(self, inputs, output_names):
            raise InvalidArgument("values must be positive")

    done, responses = run(Refuses(), [{"rid": 1, "inputs": [fp32_input(rows(1))]}])
    assert responses[0][0].error.to_wire() == {"code": int(ErrorCode.INVALID_ARG),
                                               "message": "values must be positive"}


def test_an_output_dtype_other_than_the_config_is_an_error():
    done, responses = run(ReturnsFloat64(), [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ])
    assert done.ok == [False, False]
    for header, _ in responses:
        assert header.error.code == ErrorCode.INTERNAL
        message = header.error.message
        assert "DOUBLE" in message and "'m'" in message and "FP64" in message and "TYPE_FP32" in message


def test_an_output_with_the_wrong_batch_dimension_is_an_error():
    class DropsARow(Instance):
        def execute_batch(self, inputs, output_names):
            x = inputs["IN"][:-1]
            return {"DOUBLE": x * 2, "PLUS1": x + 1}

    done, responses = run(DropsARow(), [
        {"rid": 1, "inputs": [fp32_input(rows(2))], "batch_size": 2},
        {"rid": 2, "inputs": [fp32_input(rows(2))], "batch_size": 2},
    ])
    assert done.ok == [False, False]
    for header, _ in responses:
        assert header.error.code == ErrorCode.INTERNAL
        assert "'DOUBLE'" in header.error.message and "'m'" in header.error.message


# -- BATCH_DONE ------------------------------------------------------------------------------

def test_batch_done_header():
    done, responses = run(Doubler(), [
        {"rid": 5, "inputs": [fp32_input(rows(1))], "outputs": ["DOUBLE"]},
        {"rid": 6, "inputs": [fp32_input(rows(1))]},
    ], number=99)
    assert isinstance(done, BatchDone)
    assert done.number == 99
    assert done.response_frames == [0, 0]
    assert [len(outputs_of(h)) for h, _ in responses] == [1, 2]
    assert done.ok == [True, True]
    assert len(done.timings) == 3
    assert all(isinstance(t, int) and t >= 0 for t in done.timings)
    assert [h.rid for h, _ in responses] == [5, 6]


def test_batch_done_when_every_request_is_bad():
    bad = ("IN", "FP32", [1, 4], b"")
    instance = Doubler()
    done, responses = run(instance, [{"rid": 1, "inputs": [bad]}, {"rid": 2, "inputs": [bad]}])
    assert instance.calls == []
    assert done.ok == [False, False]
    assert done.response_frames == [0, 0]
    assert all(t >= 0 for t in done.timings)


# -- execute(requests) instances ---------------------------------------------------------------

def test_execute_gets_separate_requests_with_their_metadata():
    instance = PerRequest()
    x1, x2 = rows(1), rows(3, 7)
    done, responses = run(instance, [
        {"rid": 1, "inputs": [fp32_input(x1)], "request_id": "first", "params": {"k": "v"}},
        {"rid": 2, "inputs": [fp32_input(x2)], "batch_size": 3, "outputs": ["DOUBLE"]},
    ])
    (requests,) = instance.seen
    assert [r.request_id for r in requests] == ["first", ""]
    assert [r.batch_size for r in requests] == [1, 3]
    assert requests[0].parameters == {"k": "v"}
    assert requests[1].parameters == {}
    assert requests[0].requested_outputs is None
    assert requests[1].requested_outputs == ["DOUBLE"]
    np.testing.assert_array_equal(requests[1].inputs["IN"], x2)
    assert done.ok == [True, True]
    assert [len(outputs_of(h)) for h, _ in responses] == [2, 1]
    assert responses[0][0].params == {"rid_seen": "first"}
    np.testing.assert_array_equal(responses[0][1]["PLUS1"], x1 + 1)
    np.testing.assert_array_equal(responses[1][1]["DOUBLE"], x2 * 2)
    assert all(t >= 0 for t in done.timings)


def test_a_backend_may_keep_attributes_and_weak_references_of_its_own_on_requests_and_responses():
    """tritium.backend's request and response types, as a custom backend could use them when
    they were dataclasses."""
    held = []

    def respond(requests):
        answers = []
        for request in requests:
            request.started_by_backend = request.request_id   # an attribute of the backend's own
            response = InferenceResponse(outputs={"DOUBLE": request.inputs["IN"], "PLUS1": request.inputs["IN"]})
            response.note = "mine"
            held.append((weakref.ref(request), response))
            answers.append(response)
        return answers

    done, _ = run(PerRequest(respond), [{"rid": 1, "inputs": [fp32_input(rows(1))], "request_id": "a"}])
    assert done.ok == [True]
    assert [(reference() is None or reference().started_by_backend == "a", response.note)
            for reference, response in held] == [(True, "mine")]


def test_execute_gets_writable_inputs_of_its_own_that_change_nothing_else():
    def respond(requests):
        for request in requests:
            request.inputs["IN"][:] += 100   # a model may change its inputs, as in Triton
        return [InferenceResponse(outputs={"DOUBLE": r.inputs["IN"], "PLUS1": r.inputs["IN"]}) for r in requests]

    instance = PerRequest(respond)
    x1, x2, x3 = rows(1), rows(2, 10), rows(1, 50)
    frames = batch_frames([{"rid": 1, "inputs": [fp32_input(x1)]},
                           {"rid": 2, "inputs": [fp32_input(x2)], "batch_size": 2},
                           {"rid": 3, "inputs": [fp32_input(x3)]}])
    received = [bytes(frame) for frame in frames]
    done, responses = parse_done(BatchExecutor(instance, config()).run(frames))
    assert done.ok == [True, True, True]
    for (_, arrays), x in zip(responses, (x1, x2, x3)):
        np.testing.assert_array_equal(arrays["DOUBLE"], x + 100)   # each request its own rows, once
    assert [bytes(frame) for frame in frames] == received          # the received messages are untouched


def test_requests_of_other_non_batch_shapes_each_get_their_inputs_on_the_per_request_path():
    cfg = config(BATCHING_CONFIG.replace("dims: [ 4 ] } ]", "dims: [ -1 ] } ]", 1))
    instance = PerRequest()
    x1, x2 = rows(1), np.arange(6, dtype=np.float32).reshape(1, 6)
    done, responses = run(instance, [{"rid": 1, "inputs": [fp32_input(x1)]},
                                     {"rid": 2, "inputs": [fp32_input(x2)]}], cfg)
    assert done.ok == [True, True]
    np.testing.assert_array_equal(responses[0][1]["PLUS1"], x1 + 1)
    np.testing.assert_array_equal(responses[1][1]["PLUS1"], x2 + 1)


def test_execute_can_fail_one_request():
    def respond(requests):
        return [InferenceResponse(error=InvalidArgument("no")) if r.request_id == "bad"
                else InferenceResponse(outputs={"DOUBLE": r.inputs["IN"], "PLUS1": r.inputs["IN"]})
                for r in requests]

    done, responses = run(PerRequest(respond), [
        {"rid": 1, "inputs": [fp32_input(rows(1))], "request_id": "bad"},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ])
    assert done.ok == [False, True]
    assert responses[0][0].error.to_wire() == {"code": int(ErrorCode.INVALID_ARG), "message": "no"}


def test_execute_returning_the_wrong_number_of_responses_fails_all():
    done, responses = run(PerRequest(lambda requests: []), [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ])
    assert done.ok == [False, False]
    for header, _ in responses:
        assert header.error.code == ErrorCode.INTERNAL
        assert "'m'" in header.error.message


def test_an_exception_in_execute_fails_every_request_with_internal():
    def respond(requests):
        raise ValueError("bad state")

    done, responses = run(PerRequest(respond), [
        {"rid": 1, "inputs": [fp32_input(rows(1))]},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ])
    assert done.ok == [False, False]
    for header, _ in responses:
        assert header.error.code == ErrorCode.INTERNAL
        assert "model 'm'" in header.error.message and "bad state" in header.error.message


def test_a_bad_request_is_not_passed_to_execute():
    instance = PerRequest()
    done, _ = run(instance, [
        {"rid": 1, "inputs": [("IN", "FP32", [1, 4], b"\x00" * 4)]},
        {"rid": 2, "inputs": [fp32_input(rows(1))]},
    ])
    assert len(instance.seen[0]) == 1
    assert done.ok == [False, True]


# -- non-batching models and other datatypes ------------------------------------------------------

def test_a_non_batching_model_keeps_the_shape():
    text = """
    name: "m"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]
    """

    class Neg(Instance):
        def execute_batch(self, inputs, output_names):
            return {"OUT": -inputs["IN"]}

    x = np.arange(6, dtype="<i8").reshape(2, 3)
    done, responses = run(Neg(), [{"rid": 1, "inputs": [("IN", "INT64", [2, 3], x.tobytes())]}],
                          cfg=config(text))
    assert done.ok == [True]
    assert outputs_of(responses[0][0]) == [["OUT", "INT64", [2, 3]]]
    assert responses[0][1]["OUT"].tolist() == (-x).tolist()


def test_bytes_outputs_are_serialized():
    text = """
    name: "m"
    max_batch_size: 8
    input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "UP" data_type: TYPE_STRING dims: [ 1 ] } ]
    """

    class Upper(Instance):
        def execute_batch(self, inputs, output_names):
            return {"UP": np.array([[s[0].upper()] for s in inputs["S"]], dtype=object)}

    frames = [struct.pack("<I", 2) + b"ab", struct.pack("<I", 0)]
    done, responses = run(Upper(), [
        {"rid": 1, "inputs": [("S", "BYTES", [1, 1], frames[0])]},
        {"rid": 2, "inputs": [("S", "BYTES", [1, 1], frames[1])]},
    ], cfg=config(text))
    assert done.ok == [True, True]
    assert outputs_of(responses[0][0]) == [["UP", "BYTES", [1, 1]]]
    assert responses[0][1]["UP"] == struct.pack("<I", 2) + b"AB"
    assert responses[1][1]["UP"] == struct.pack("<I", 0)


# -- a model that is not decoupled answering through its response senders ------------------------

def test_a_batch_answered_partly_through_senders_and_partly_later_reaches_each_request_by_its_place():
    """rid 1 returned, rid 2 sent during execute, rid 3 sent after execute returned: the first
    two leave at once as RESPONSE_PARTs, the batch ends as a decoupled one with rid 3 open."""
    from tritium.protocol import ResponsePart, read_record

    kept = []

    def respond(requests):
        requests[1].response_sender(InferenceResponse(outputs={"DOUBLE": requests[1].inputs["IN"] * 2}), True)
        kept.append(requests[2].response_sender)
        return [InferenceResponse(outputs={"DOUBLE": requests[0].inputs["IN"] * 2}), None, None]

    sent: list[list] = []
    executor = BatchExecutor(PerRequest(respond), config(), send=sent.append)
    frames = batch_frames([{"rid": rid, "inputs": [fp32_input(rows(1, 10 * rid))], "outputs": ["DOUBLE"]}
                           for rid in (1, 2, 3)], number=5)
    (done_record,) = executor.run(frames)
    done = read_record(done_record)[0]
    assert (done.number, done.still_open) == (5, [2])

    def parts_of(message):
        part, response = read_record(message[0])[0], read_record(message[1])
        return part.batch, part.index, response[0].rid, np.frombuffer(response[1][response[2]:], np.float32).tolist()

    assert [parts_of(m) for m in sent] == [(5, 0, 1, (rows(1, 10) * 2).ravel().tolist()),
                                           (5, 1, 2, (rows(1, 20) * 2).ravel().tolist())]
    kept[0](InferenceResponse(outputs={"DOUBLE": rows(1, 30) * 2}), True)   # later, from the model's thread
    assert parts_of(sent[2]) == (5, 2, 3, (rows(1, 30) * 2).ravel().tolist())
    assert isinstance(read_record(sent[2][0])[0], ResponsePart)


def test_a_batch_on_the_per_request_path_leaves_no_reference_cycle_behind():
    """What a batch builds is freed as soon as it is answered: a cycle (a request reachable from
    its own response sender's bookkeeping) would leave every batch to the cyclic collector,
    several microseconds per request (measured by bench/instance_cpu.py)."""
    import gc

    class Doubling(Instance):   # keeps nothing of what it is given
        def execute(self, requests):
            return [InferenceResponse(outputs={"DOUBLE": r.inputs["IN"] * 2}) for r in requests]

    executor = BatchExecutor(Doubling(), config(), send=lambda parts: None)
    frames = batch_frames([{"rid": rid, "inputs": [fp32_input(rows(1, rid))], "outputs": ["DOUBLE"]}
                           for rid in (1, 2, 3)])
    executor.run(frames)   # warm: caches filled once
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            executor.run(frames)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_request_is_cancellable_while_its_execute_runs_and_while_it_is_answered_later():
    """cancel(batch, index) marks the request of that place: during execute (the heartbeat
    thread's call), and after it for a request its model answers later; other batches and
    answered requests are left alone."""
    seen, kept = [], []
    executor = None

    def respond(requests):
        executor.cancel(4, 1)       # another batch: nothing
        executor.cancel(5, 1)       # as the heartbeat thread does while execute runs
        seen.append([request.cancelled for request in requests])
        kept.append(requests[2])
        return [InferenceResponse(outputs={"DOUBLE": r.inputs["IN"]}) for r in requests[:2]] + [None]

    executor = BatchExecutor(PerRequest(respond), config(), send=lambda parts: None)
    frames = batch_frames([{"rid": rid, "inputs": [fp32_input(rows(1, rid))], "outputs": ["DOUBLE"]}
                           for rid in (1, 2, 3)], number=5)
    executor.run(frames)
    assert seen == [[False, True, False]]
    executor.cancel(5, 2)           # answered later: still cancellable
    assert kept[0].cancelled
    kept[0].response_sender(InferenceResponse(outputs={"DOUBLE": rows(1, 3)}), True)
    assert executor._answering == {} and executor._executing is None


def test_a_request_cancelled_while_its_batch_waits_is_answered_cancelled_without_running():
    """The heartbeat thread's cancel for a batch not started yet (it waits behind the one
    running) is kept until that batch comes up: its request is answered CANCELLED and the
    model never sees it, as Triton drops a cancelled request it still holds. A cancel for a
    batch already run (the data socket's copy, read after it) leaves nothing behind."""
    model = PerRequest()
    executor = BatchExecutor(model, config(), send=lambda parts: None)
    requests = [{"rid": rid, "inputs": [fp32_input(rows(1, rid))], "outputs": ["DOUBLE"]} for rid in (1, 2, 3)]
    executor.run(batch_frames(requests[:1], number=5))
    executor.cancel(6, 1)   # batch 6 is not here yet
    executor.cancel(5, 0)   # batch 5 ran: nothing to keep
    done, responses = parse_done(executor.run(batch_frames(requests, number=6)))
    assert done.ok == [True, False, True] and done.ran
    assert [r.rid for r, _ in responses] == [1, 2, 3]
    assert (responses[1][0].error.code, responses[1][0].error.message) == (
        ErrorCode.CANCELLED, "the client cancelled the request")
    assert [[r.request_id for r in seen] for seen in model.seen] == [[""], ["", ""]]
    assert [len(seen) for seen in model.seen] == [1, 2]
    assert executor._cancelled_ahead == set()
    done, _ = parse_done(executor.run(batch_frames(requests, number=7)))
    assert done.ok == [True, True, True]
    executor.cancel(8, 0)
    done, responses = parse_done(executor.run(batch_frames(requests[:1], number=8)))
    assert (done.ok, done.ran, responses[0][0].error.code) == ([False], False, ErrorCode.CANCELLED)
    assert len(model.seen) == 3   # a batch all of whose requests were dropped never reaches the model


def test_a_decoupled_batch_whose_requests_were_all_cancelled_while_it_waited_says_it_did_not_run():
    sent = []
    model = PerRequest()
    executor = BatchExecutor(model, config(BATCHING_CONFIG + "model_transaction_policy { decoupled: true }"),
                             send=sent.append)
    executor.cancel(3, 0)
    done = read_record(executor.run(batch_frames([{"rid": 1, "inputs": [fp32_input(rows(1, 1))]}], number=3))[0])[0]
    assert (done.ran, done.still_open, model.seen) == (False, [], [])
    ((part, record),) = [(read_record(parts[0])[0], read_record(parts[1])[0]) for parts in sent]
    assert (part.batch, part.index, record.error.code, record.final) == (3, 0, ErrorCode.CANCELLED, True)


def test_a_sequence_request_cancelled_while_its_batch_waits_still_runs():
    """The broker ends a sequence with its cancelled request: the instance runs it."""
    executor = BatchExecutor(PerRequest(), config(BATCHING_CONFIG + "sequence_batching { }"), send=lambda parts: None)
    executor.cancel(6, 0)
    assert executor._cancelled_ahead == set()


def test_a_response_sent_before_execute_fails_stands_and_the_others_get_the_error():
    def respond(requests):
        requests[0].response_sender(InferenceResponse(outputs={"DOUBLE": requests[0].inputs["IN"] * 2}), True)
        raise RuntimeError("boom after sending")

    done, responses = run(PerRequest(respond), [{"rid": rid, "inputs": [fp32_input(rows(1, rid))],
                                                 "outputs": ["DOUBLE"]} for rid in (1, 2)])
    assert done.ok == [False, False]   # both count as failures, as in Triton
    assert responses[0][1]["DOUBLE"].tolist() == (rows(1, 1) * 2).tolist()
    assert "boom after sending" in responses[1][0].error.message


def test_a_decoupled_models_failure_after_every_request_was_answered_is_logged(caplog):
    def respond(requests):
        requests[0].response_sender(None, True)
        raise InternalError("returned a list")

    sent: list[list] = []
    cfg = config(BATCHING_CONFIG + "model_transaction_policy { decoupled: true }")
    executor = BatchExecutor(PerRequest(respond), cfg, send=sent.append)
    with caplog.at_level("ERROR", logger="tritium.workers.executor"):
        (done,) = executor.run(batch_frames([{"rid": 1, "inputs": [fp32_input(rows(1))]}]))
    assert len(sent) == 1   # the final flag only: the error has no request left to go to
    assert [r.getMessage() for r in caplog.records] == ["returned a list"]
    assert read_record(done)[0].raised   # the broker counts the answered request failed, as Triton


def test_a_response_both_sent_and_returned_is_answered_by_the_sent_one_and_counts_as_a_failure():
    def respond(requests):
        requests[0].response_sender(InferenceResponse(outputs={"DOUBLE": requests[0].inputs["IN"] * 2}), True)
        return [InferenceResponse(outputs={"DOUBLE": r.inputs["IN"] * 3}) for r in requests]

    done, responses = run(PerRequest(respond), [{"rid": rid, "inputs": [fp32_input(rows(1, rid))],
                                                 "outputs": ["DOUBLE"]} for rid in (1, 2)])
    assert done.ok == [False, True]   # as Triton counts them
    assert [r[1]["DOUBLE"].tolist() for r in responses] == [(rows(1, 1) * 2).tolist(), (rows(1, 2) * 3).tolist()]


def test_a_decoupled_batch_sent_when_requests_come_one_at_a_time_gives_up_the_cpu_after_its_first_response():
    """The broker marks the batch (``lone``): the instance yields once, right after the first
    response left, so that the processes forwarding it need not wait for the model's next ones."""
    def respond(requests):
        for token in range(3):
            requests[0].response_sender(InferenceResponse(outputs={"DOUBLE": requests[0].inputs["IN"] * token}), False)
        requests[0].response_sender(None, True)

    cfg = config(BATCHING_CONFIG + "model_transaction_policy { decoupled: true }")
    for lone, expected in ((True, [1]), (False, [])):
        sent: list[list] = []
        yielded: list[int] = []
        executor = BatchExecutor(PerRequest(respond), cfg, send=sent.append)
        executor.yield_cpu = lambda: yielded.append(len(sent))   # how many responses had left by then
        executor.run([Batch(9, 1, lone=lone).encode(), *infer_record(1, [fp32_input(rows(1))], outputs=["DOUBLE"])])
        assert (len(sent), yielded) == (4, expected), lone


def test_requests_of_different_clients_with_the_same_rid_each_get_their_own_answer():
    """Every gateway and every BLS socket numbers its requests from 1: one batch may hold two with
    the same rid. Each must get its own answer, in its place (they were once kept by rid)."""
    first, second = rows(1, 0), rows(1, 100)
    for instance in (Doubler(), PerRequest()):
        done, responses = run(instance, [
            {"rid": 7, "inputs": [fp32_input(first)], "batch_size": 1},
            {"rid": 7, "inputs": [fp32_input(second)], "batch_size": 1},
        ])
        assert [h.rid for h, _ in responses] == [7, 7]
        np.testing.assert_array_equal(responses[0][1]["DOUBLE"], first * 2)
        np.testing.assert_array_equal(responses[1][1]["DOUBLE"], second * 2)


# -- requests a model releases to run again (iterative sequences) -------------------------------

def rescheduling(places: set[int]):
    """A PerRequest answer: RESCHEDULED at ``places``, DOUBLE and PLUS1 elsewhere."""
    def respond(requests):
        return [RESCHEDULED if index in places else
                InferenceResponse(outputs={"DOUBLE": r.inputs["IN"] * 2, "PLUS1": r.inputs["IN"] + 1})
                for index, r in enumerate(requests)]
    return respond


def three_requests():
    return [dict(rid=rid, inputs=[fp32_input(rows(1, rid))]) for rid in (1, 2, 3)]


def test_a_request_released_to_run_again_gets_no_response_and_is_named_in_the_batch_done():
    done, responses = run(PerRequest(rescheduling({1})), three_requests())
    assert done.rescheduled == [1] and done.ok == [True, True]
    assert [header.rid for header, _ in responses] == [1, 3]
    np.testing.assert_array_equal(responses[1][1]["DOUBLE"], rows(1, 3) * 2)


def test_trace_stamps_go_to_the_responses_of_their_own_requests_when_one_runs_again():
    traced = [SimpleNamespace(traced=index != 1, arrival_ns=index) for index in range(3)]
    frames = batch_frames(three_requests())
    frames[0] = Batch(17, 3, trace=batch_stamps(traced)).encode()
    executor = BatchExecutor(PerRequest(rescheduling({0})), config())
    done, responses = parse_done(executor.run(frames))
    assert done.rescheduled == [0]
    assert [(header.rid, header.trace is not None) for header, _ in responses] == [(2, False), (3, True)]
    # A batch whose only traced request runs again has no stamps to give, and nothing breaks.
    frames = batch_frames(three_requests()[:1])
    frames[0] = Batch(18, 1, trace=batch_stamps(traced[:1])).encode()
    done, responses = parse_done(BatchExecutor(PerRequest(rescheduling({0})), config()).run(frames))
    assert (done.rescheduled, responses) == ([0], [])


def test_a_decoupled_request_released_to_run_again_is_not_left_open():
    decoupled = config(BATCHING_CONFIG + "model_transaction_policy { decoupled: true }")
    sent = []
    executor = BatchExecutor(PerRequest(lambda requests: [RESCHEDULED, None]), decoupled, send=sent.append)
    done, _, _ = read_record(executor.run(batch_frames(three_requests()[:2]))[0])
    assert (done.rescheduled, done.still_open) == ([0], [1])
    assert (17, 0) not in executor._answering and (17, 1) in executor._answering
