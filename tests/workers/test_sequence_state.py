"""Stateful models inside the instance: control tensors, direct padding and implicit state.

BATCH messages are built as the broker sends them for a stateful model: the BATCH record
carries each request's slot (``sl``), each INFER record its correlation id (``cid``) and
START/END flags (``sf``). What a model receives was compared with Triton 2.51 (shapes
``[1, 1]`` when the model batches, ``[1]`` when not; padding requests with READY false,
CORRID 0; a direct batch as wide as its highest slot).
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.workers.batch_done import parse_done
from tritium.errors import InvalidArgument
from tritium.protocol import Batch, Infer
from tritium.workers.backends.base import InferenceResponse, Instance
from tritium.workers.executor import BatchExecutor

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0.5, 1.5 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]"""
START, END = 1, 2


def config(max_batch_size=4, strategy="direct { }", corrid="TYPE_UINT64", state="", outputs="") -> object:
    text = f"""
name: "m" max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} {outputs} ]
sequence_batching {{ {strategy} {CONTROLS % corrid} {state} }}
"""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def record(rid: int, value: float, cid=0, flags=0, batched=True) -> bytes:
    data = np.array([[value]] if batched else [value], dtype="<f4")
    infer = Infer(rid, "m", [["IN", "FP32", list(data.shape), data.nbytes, False]], version=1, batch_size=1,
                  sequence_id=cid or None, sequence_flags=flags)
    return infer.encode([data.tobytes()])


def batch(records: list[bytes], slots: list[int], number: int = 1) -> list:
    return [Batch(number, len(records), slots).encode(), *records]


class Echo(Instance):
    """Python-backend style: OUT = IN; remembers every request it was given."""

    def __init__(self) -> None:
        self.seen = []

    def execute(self, requests):
        self.seen.append(requests)
        return [InferenceResponse(outputs={"OUT": r.inputs["IN"].copy()}) for r in requests]


def controls_of(request) -> dict:
    return {name: (str(a.dtype), list(a.shape), a.reshape(-1).tolist())
            for name, a in request.inputs.items() if name != "IN"}


# -- control tensors ------------------------------------------------------------------------

def test_control_tensors_arrive_with_their_declared_types_values_and_shapes():
    model = Echo()
    executor = BatchExecutor(model, config())
    parse_done(executor.run(batch([record(1, 3.0, cid=42, flags=START)], [0])))
    parse_done(executor.run(batch([record(2, 4.0, cid=42, flags=END)], [0])))
    first, last = model.seen[0][0], model.seen[1][0]
    assert controls_of(first) == {"START": ("int32", [1, 1], [1]), "END": ("float32", [1, 1], [0.5]),
                                  "READY": ("bool", [1, 1], [True]), "CORRID": ("uint64", [1, 1], [42])}
    assert controls_of(last)["START"] == ("int32", [1, 1], [0])
    assert controls_of(last)["END"] == ("float32", [1, 1], [1.5])
    assert (first.correlation_id, first.flags, last.flags) == (42, START, END)


def test_a_model_without_batching_gets_controls_of_shape_1():
    model = Echo()
    executor = BatchExecutor(model, config(max_batch_size=0))
    parse_done(executor.run(batch([record(1, 3.0, cid=7, flags=START | END, batched=False)], [0])))
    assert controls_of(model.seen[0][0])["READY"] == ("bool", [1], [True])
    assert controls_of(model.seen[0][0])["END"] == ("float32", [1], [1.5])


@pytest.mark.parametrize("corrid, cid, expected", [
    ("TYPE_UINT64", 2**64 - 1, ("uint64", [2**64 - 1])),
    ("TYPE_INT64", 2**64 - 1, ("int64", [-1])),
    ("TYPE_UINT32", 2**32 + 5, ("uint32", [5])),
    ("TYPE_INT32", 2**32 - 2, ("int32", [-2])),
    ("TYPE_STRING", "user-17", ("object", [b"user-17"])),
    ("TYPE_STRING", 99, ("object", [b"99"])),
    ("TYPE_UINT64", "user-17", ("uint64", [0])),
])
def test_corrid_carries_the_sequence_id_in_the_declared_type(corrid, cid, expected):
    model = Echo()
    executor = BatchExecutor(model, config(corrid=corrid))
    parse_done(executor.run(batch([record(1, 1.0, cid=cid, flags=START)], [0])))
    dtype, _, values = controls_of(model.seen[0][0])["CORRID"]
    assert (dtype, values) == expected


# -- direct: padding ------------------------------------------------------------------------

def test_a_direct_batch_is_padded_with_not_ready_requests_up_to_its_highest_slot():
    model = Echo()
    executor = BatchExecutor(model, config())
    done, responses = parse_done(executor.run(batch([record(1, 10.0, cid=5), record(2, 20.0, cid=6)], [1, 3])))
    given = model.seen[0]
    assert len(given) == 4
    assert [controls_of(r)["READY"][2] for r in given] == [[False], [True], [False], [True]]
    assert [controls_of(r)["CORRID"][2] for r in given] == [[0], [5], [0], [6]]
    assert given[0].inputs["IN"].tolist() == [[0.0]]
    assert controls_of(given[0])["START"][2] == [0] and controls_of(given[0])["END"][2] == [0.5]
    # Only the real requests are answered, in their order.
    assert done.ok == [True, True]
    assert [h.rid for h, _ in responses] == [1, 2]
    assert [a["OUT"].tolist() for _, a in responses] == [[[10.0]], [[20.0]]]


def test_an_oldest_batch_is_not_padded():
    model = Echo()
    executor = BatchExecutor(model, config(strategy="oldest { max_candidate_sequences: 4 }"))
    parse_done(executor.run(batch([record(1, 10.0, cid=5), record(2, 20.0, cid=6)], [3, 1])))
    assert [controls_of(r)["CORRID"][2] for r in model.seen[0]] == [[5], [6]]


# -- implicit state ----------------------------------------------------------------------------

STATE = """state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] %s } ]"""


class StackedAccumulator(Instance):
    """ONNX-style: every input stacked; OUT = IN + STATE_IN, STATE_OUT = OUT."""

    def __init__(self) -> None:
        self.batches = []

    def execute_batch(self, inputs, output_names):
        self.batches.append((inputs["IN"].shape[0], list(output_names)))
        total = inputs["IN"] + inputs["STATE_IN"]
        return {"OUT": total, "STATE_OUT": total.copy()}


class PythonAccumulator(Instance):
    def execute(self, requests):
        out = []
        for r in requests:
            total = r.inputs["IN"] + r.inputs["STATE_IN"]
            out.append(InferenceResponse(outputs={"OUT": total, "STATE_OUT": total}))
        return out


def totals(responses) -> list[float]:
    return [float(arrays["OUT"].reshape(-1)[0]) for _, arrays in responses]


@pytest.mark.parametrize("model_class", [StackedAccumulator, PythonAccumulator])
def test_implicit_state_follows_each_slot_from_start_to_end(model_class):
    executor = BatchExecutor(model_class(), config(state=STATE % ""))
    run = lambda records, slots: parse_done(executor.run(batch(records, slots)))[1]  # noqa: E731
    assert totals(run([record(1, 1.0, 5, START), record(2, 100.0, 6, START)], [0, 1])) == [1.0, 100.0]
    assert totals(run([record(3, 2.0, 6)], [1])) == [102.0]
    responses = run([record(4, 3.0, 5, END), record(5, 4.0, 6)], [0, 1])
    assert totals(responses) == [4.0, 106.0]
    # The state output is not a model output here: it never reaches the client.
    assert all(set(arrays) == {"OUT"} for _, arrays in responses)
    # A new sequence in slot 0 starts again from the initial state (zeros).
    assert totals(run([record(6, 7.0, 8, START)], [0])) == [7.0]


def test_the_model_is_asked_for_the_output_state_and_padding_gets_a_state_of_zeros():
    model = StackedAccumulator()
    executor = BatchExecutor(model, config(state=STATE % ""))
    parse_done(executor.run(batch([record(1, 1.0, 5, START), record(2, 2.0, 6, START)], [0, 1])))
    responses = parse_done(executor.run(batch([record(3, 1.0, 6)], [1])))[1]
    assert totals(responses) == [3.0]
    assert model.batches == [(2, ["OUT", "STATE_OUT"]), (2, ["OUT", "STATE_OUT"])]


def test_a_start_resets_the_state_of_a_running_sequence():
    executor = BatchExecutor(PythonAccumulator(), config(state=STATE % ""))
    parse_done(executor.run(batch([record(1, 5.0, 5, START)], [0])))
    assert totals(parse_done(executor.run(batch([record(2, 1.0, 5, START)], [0])))[1]) == [1.0]


def test_initial_state_from_zero_data_and_from_a_file(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "ten").write_bytes(np.array([10.0], dtype="<f4").tobytes())
    from_file = STATE % 'initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "ten" name: "ten" }'
    executor = BatchExecutor(PythonAccumulator(), config(state=from_file), model_dir=tmp_path)
    assert totals(parse_done(executor.run(batch([record(1, 1.0, 5, START)], [0])))[1]) == [11.0]
    zero = STATE % 'initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "z" }'
    executor = BatchExecutor(PythonAccumulator(), config(state=zero))
    assert totals(parse_done(executor.run(batch([record(1, 1.0, 5, START)], [0])))[1]) == [1.0]


@pytest.mark.parametrize("data, message", [
    (None, "failed to open text file for read {path}: No such file or directory"),
    (b"\0\0", "initial_state setting expects 4 bytes, but the data provided from tenonly has 2 bytes."),
])
def test_an_initial_state_file_missing_or_short_is_refused_in_tritons_words(tmp_path, data, message):
    (tmp_path / "initial_state").mkdir()
    if data is not None:
        (tmp_path / "initial_state" / "ten").write_bytes(data)
    from_file = STATE % 'initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "ten" name: "ten" }'
    with pytest.raises(InvalidArgument) as caught:
        BatchExecutor(PythonAccumulator(), config(state=from_file), model_dir=tmp_path)
    assert caught.value.message == message.format(path=tmp_path / "initial_state" / "ten")


def test_a_declared_output_state_reaches_the_client_that_asks_for_it():
    cfg = config(state=STATE % "", outputs=', { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] }')
    executor = BatchExecutor(StackedAccumulator(), cfg)
    responses = parse_done(executor.run(batch([record(1, 2.0, 5, START)], [0])))[1]
    assert responses[0][1]["STATE_OUT"].tolist() == [[2.0]]
    assert totals(parse_done(executor.run(batch([record(2, 3.0, 5)], [0])))[1]) == [5.0]


def test_a_failed_execution_leaves_the_state_as_it_was():
    class FailsOnce(PythonAccumulator):
        failed = False

        def execute(self, requests):
            if not self.failed and float(requests[0].inputs["IN"].reshape(-1)[0]) < 0:
                self.failed = True
                raise RuntimeError("boom")
            return super().execute(requests)

    executor = BatchExecutor(FailsOnce(), config(state=STATE % ""))
    parse_done(executor.run(batch([record(1, 2.0, 5, START)], [0])))
    done, _ = parse_done(executor.run(batch([record(2, -1.0, 5)], [0])))
    assert done.ok == [False]
    assert totals(parse_done(executor.run(batch([record(3, 3.0, 5)], [0])))[1]) == [5.0]


# -- answers sent through response senders ----------------------------------------------------

class AnswersLater(Instance):
    """Python-backend style, not decoupled: returns None for every request and keeps its
    response sender, to answer from a thread of its own."""

    def __init__(self) -> None:
        self.kept = []

    def execute(self, requests):
        self.kept = [(r, r.response_sender) for r in requests]
        return [None] * len(requests)


def test_a_direct_batchs_padding_may_be_answered_later_and_its_answer_goes_nowhere():
    from tritium.protocol import ResponsePart, read_record

    model, sent = AnswersLater(), []
    executor = BatchExecutor(model, config(), send=sent.append)
    (done_record,) = executor.run(batch([record(1, 10.0, cid=5)], [1], number=4))
    assert read_record(done_record)[0].still_open == [0]   # the real request only: the padding is nobody's
    for request, send in model.kept:   # the padding (slot 0) first
        send(InferenceResponse(outputs={"OUT": request.inputs["IN"] + 1}), True)
    assert len(sent) == 1
    part, (response, view, offset) = read_record(sent[0][0])[0], read_record(sent[0][1])
    assert (part, response.rid) == (ResponsePart(4, 0), 1)
    assert np.frombuffer(view[offset:], "<f4").tolist() == [11.0]


def test_a_model_with_implicit_state_may_not_answer_after_its_execute_returns():
    model, sent = AnswersLater(), []
    executor = BatchExecutor(model, config(state=STATE % ""), send=sent.append)
    done, responses = parse_done(executor.run(batch([record(1, 1.0, 5, START)], [0])))
    assert done.ok == [False] and not done.still_open
    assert "model 'm' keeps implicit sequence state" in responses[0][0].error.message
    request, send = model.kept[0]
    send(InferenceResponse(outputs={"OUT": request.inputs["IN"], "STATE_OUT": request.inputs["IN"]}), True)
    assert sent == []   # answered already
