"""ModelInfer's reader and writer (gateway/grpc_codec.py) change nothing. Every message reads
to the same request, or fails with the same error, the first time (through protobuf) and
every time after (its metadata remembered), as protobuf alone reads it; every result is
written to the very bytes protobuf writes for it."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from tritium.errors import InvalidArgument
from tritium.gateway.grpc_codec import (FINAL_RESPONSE, InferRequestReader, InferResponseWriter, decode_infer_request,
                                       encode_infer_response, stream_answer)
from tritium.gateway.inference import InferResult, OutputTensor


def add_sub(request_id: str = "", seed: int = 0, **fields) -> service_pb2.ModelInferRequest:
    """A request as perf_analyzer sends add_sub's."""
    message = service_pb2.ModelInferRequest(model_name="add_sub", id=request_id, **fields)
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        message.raw_input_contents.append(np.arange(seed, seed + 16, dtype=np.float32).tobytes())
    for name in ("OUTPUT0", "OUTPUT1"):
        message.outputs.add(name=name)
    return message


def protobuf_alone(data: bytes):
    return decode_infer_request(service_pb2.ModelInferRequest.FromString(data))


def primed(data: bytes) -> InferRequestReader:
    """A reader that keeps ``data``'s metadata (it keeps what it has seen twice) and knows its
    layout (from the first message read with kept metadata)."""
    reader = InferRequestReader()
    for _ in range(3):
        reader.read(data)
    assert len(reader._seen) == 1 and reader._last is not None
    return reader


@pytest.mark.parametrize("known_id", ["", "req-1"])
def test_messages_laid_out_as_the_last_known_one_or_not_read_the_same(known_id):
    """Ids of other lengths (a two-byte length past 127), none, or one where the known message
    had none; other contents; other metadata: each reads as protobuf reads it."""
    reader = primed(add_sub(known_id).SerializeToString())
    messages = [add_sub("x" * 300, seed=1), add_sub("", seed=2), add_sub("é", seed=3), add_sub(known_id, seed=4),
                add_sub(known_id, model_version="2"), add_sub(known_id, seed=5)]
    extra = add_sub(known_id, seed=6)
    extra.raw_input_contents.append(bytes(200))
    fewer_outputs, other_output = add_sub(known_id, seed=7), add_sub(known_id, seed=8)   # other metadata after the id
    del fewer_outputs.outputs[1]
    other_output.outputs[1].name = "OUTPUTX"   # of the same length
    messages += [extra, fewer_outputs, other_output]
    for message in messages:
        data = message.SerializeToString()
        assert reader.read(data) == protobuf_alone(data)


def test_a_message_reads_the_same_the_first_time_and_after_its_metadata_is_remembered():
    reader = InferRequestReader()
    messages = [add_sub(), add_sub("req-1", seed=5), add_sub("", seed=9), add_sub("é-2", seed=3)]
    for message in messages:
        data = message.SerializeToString()
        assert reader.read(data) == protobuf_alone(data)
    assert len(reader._seen) == 1   # one metadata: the ids and the contents are not part of it


def test_a_message_handed_on_as_a_view_reads_the_same():
    """A large message comes from the HTTP/2 reader as a view of its buffer (grpc_wire.MessageReader)."""
    reader = InferRequestReader()
    for message in [add_sub("req-1"), add_sub("req-2", seed=5), add_sub("", seed=9), add_sub("é-3", seed=3)]:
        data = message.SerializeToString()
        assert reader.read(memoryview(bytearray(data))) == protobuf_alone(data)
    assert len(reader._seen) == 1


def test_requests_read_from_remembered_metadata_share_nothing_a_caller_may_change():
    data = add_sub("a").SerializeToString()
    reader = primed(data)
    first = reader.read(data)
    first.parameters["changed"] = 1
    first.inputs[0].shape.append(7)
    first.outputs.pop()
    assert reader.read(data) == protobuf_alone(data)


@pytest.mark.parametrize("raw_entries", [0, 1])
def test_missing_contents_fail_with_protobufs_error_also_from_remembered_metadata(raw_entries):
    reader = primed(add_sub().SerializeToString())
    short = add_sub()
    del short.raw_input_contents[raw_entries:]
    data = short.SerializeToString()
    with pytest.raises(InvalidArgument) as expected:
        protobuf_alone(data)
    with pytest.raises(InvalidArgument) as got:
        reader.read(data)
    assert got.value.message == expected.value.message == (
        f"unable to find data for input tensor 'INPUT{raw_entries}' for model 'add_sub' in request.")


def test_contents_beyond_the_inputs_are_ignored_as_by_protobufs_reading():
    reader = primed(add_sub().SerializeToString())
    extra = add_sub(seed=4)
    extra.raw_input_contents.append(b"left over")
    data = extra.SerializeToString()
    assert reader.read(data) == protobuf_alone(data)


def typed_contents() -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="add_sub")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    return message


def shared_memory_input() -> service_pb2.ModelInferRequest:
    message = add_sub()
    parameters = message.inputs[0].parameters
    parameters["shared_memory_region"].string_param = "region"
    parameters["shared_memory_byte_size"].int64_param = 64
    del message.raw_input_contents[0]
    return message


def classified_output() -> service_pb2.ModelInferRequest:
    message = add_sub()
    message.outputs[0].parameters["classification"].int64_param = 2
    return message


@pytest.mark.parametrize("make", [typed_contents, shared_memory_input, classified_output])
def test_other_shapes_of_request_are_read_by_protobuf_every_time(make):
    reader = InferRequestReader()
    data = make().SerializeToString()
    assert reader.read(data) == protobuf_alone(data)
    assert reader.read(data) == protobuf_alone(data)
    assert reader._seen == {}


def test_fields_out_of_field_number_order_are_read_by_protobuf():
    """Contents before the inputs (protobuf writes them after): the same request."""
    message = add_sub()
    reader = primed(message.SerializeToString())
    contents = service_pb2.ModelInferRequest(raw_input_contents=message.raw_input_contents).SerializeToString()
    metadata = service_pb2.ModelInferRequest()
    metadata.CopyFrom(message)
    del metadata.raw_input_contents[:]
    data = contents + metadata.SerializeToString()
    assert reader.read(data) == protobuf_alone(data)
    assert reader.read(data).inputs[1].data == message.raw_input_contents[1]


def test_unparsable_bytes_fail_as_protobuf_fails_also_when_their_metadata_is_known():
    good = add_sub("id").SerializeToString()
    reader = primed(good)
    bad_id = good.replace(b"\x1a\x02id", b"\x1a\x02\xff\xfe")   # the id no UTF-8
    truncated = good[:-5]
    for data in (bad_id, truncated, b"\x0a\x7f"):
        with pytest.raises(DecodeError):
            service_pb2.ModelInferRequest.FromString(data)
        with pytest.raises(DecodeError):
            reader.read(data)


def test_a_message_cut_inside_its_id_fails_as_protobuf_fails_when_nothing_follows_the_id():
    """A known layout with nothing after the id: the id's length must still be checked."""
    reader = primed(service_pb2.ModelInferRequest(model_name="m", id="abc").SerializeToString())
    cut = service_pb2.ModelInferRequest(model_name="m", id="abd").SerializeToString()[:-1]
    with pytest.raises(DecodeError):
        service_pb2.ModelInferRequest.FromString(cut)
    with pytest.raises(DecodeError):
        reader.read(cut)


def test_a_known_layout_followed_by_more_contents_than_protobufs_walk_takes_is_left_to_protobuf():
    """Thousands of empty raw contents after a known layout: not walked in Python past the limit
    the first walk keeps (the event loop would stall), read by protobuf as before."""
    good = add_sub("req-1").SerializeToString()
    reader = primed(good)
    data = good + b"\x3a\x00" * 5000
    assert reader._last.parts(data) is None
    assert reader._last.parts(good + b"\x3a\x00" * 10) is not None
    assert reader.read(data) == protobuf_alone(data)


def test_metadata_is_kept_the_second_time_it_is_seen():
    reader = InferRequestReader()
    data = add_sub().SerializeToString()
    assert reader.read(data) == protobuf_alone(data) and reader._seen == {}
    assert reader.read(data) == protobuf_alone(data) and len(reader._seen) == 1


def test_metadata_that_never_repeats_sends_messages_straight_to_protobuf_for_a_while():
    """A sequence id that changes with every request: the walk over the fields rests, then tries again."""
    reader = InferRequestReader()

    def sequence_request(number: int) -> bytes:
        message = add_sub(seed=number)
        message.parameters["sequence_id"].int64_param = number
        return message.SerializeToString()

    for number in range(1, InferRequestReader.MISSES_BEFORE_RESTING + 1):
        data = sequence_request(number)
        assert reader.read(data) == protobuf_alone(data)
    assert reader._resting == InferRequestReader.RESTING and reader._seen == {}
    plain = add_sub().SerializeToString()
    for _ in range(InferRequestReader.RESTING):   # read right, but not walked: nothing kept
        assert reader.read(plain) == protobuf_alone(plain)
    assert reader._resting == 0 and reader._seen == {}
    reader.read(plain)
    reader.read(plain)
    assert len(reader._seen) == 1   # walking again


def test_a_client_sending_ever_new_metadata_keeps_the_reader_bounded():
    reader = InferRequestReader()
    reader.MISSES_BEFORE_RESTING = 10**9   # walking every message
    for number in range(InferRequestReader.LIMIT + 10):
        message = add_sub()
        message.parameters["sequence_id"].int64_param = number + 1
        data = message.SerializeToString()
        assert [reader.read(data).sequence_id for _ in range(3)] == [number + 1] * 3
    assert 0 < len(reader._seen) <= InferRequestReader.LIMIT
    assert 0 < len(reader._seen_once) <= InferRequestReader.LIMIT


def result(request_id: str = "", shape=(1, 16), data: bytes = bytes(range(64)), **extra) -> InferResult:
    outputs = [OutputTensor("OUTPUT0", "FP32", list(shape), memoryview(data)),
               OutputTensor("OUTPUT1", "FP32", list(shape), data)]
    return InferResult("add_sub", 1, request_id, outputs, **extra)


WRITTEN = {
    "add_sub's": result(),
    "with an id": result("req-7"),
    "a non-ASCII id": result("é-1"),
    "a scalar output": result(shape=(), data=bytes(4)),
    "an empty output": result(shape=(0, 16), data=b""),
    "large dims": result(shape=(1, 300, 2**40), data=b"x"),
    "large contents": result(data=bytes(70_000)),
    "parameters": result(parameters={"sequence_id": 5, "note": "n", "flag": True, "x": 1.5}),
    "an output in shared memory": InferResult("m", 3, "", [OutputTensor("Y", "INT64", [2], b"", in_shared_memory=True),
                                                           OutputTensor("Z", "BYTES", [1], b"\x01\x00\x00\x00a")]),
    "no outputs": InferResult("m", 12, "id", []),
    "numpy dims": InferResult("m", 1, "", [OutputTensor("Y", "FP32", [np.int64(2), np.int64(3)], bytes(24))]),
}


@pytest.mark.parametrize("name", WRITTEN)
def test_a_result_is_written_to_the_bytes_protobuf_writes(name):
    writer = InferResponseWriter()
    expected = encode_infer_response(WRITTEN[name]).SerializeToString()
    assert writer.write(WRITTEN[name]) == expected
    assert writer.write(WRITTEN[name]) == expected   # from what it kept


@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize("name", WRITTEN)
def test_a_stream_answer_is_written_to_the_bytes_protobuf_writes(name, final):
    """A stream's answers carry triton_final_response, and travel in a ModelStreamInferResponse."""
    written = InferResponseWriter().write(WRITTEN[name], final)
    expected = encode_infer_response(WRITTEN[name], {FINAL_RESPONSE: final})
    assert written == expected.SerializeToString()
    assert service_pb2.ModelInferResponse.FromString(written).parameters[FINAL_RESPONSE].bool_param is final
    wrapped = service_pb2.ModelStreamInferResponse(infer_response=expected)
    assert service_pb2.ModelStreamInferResponse.FromString(stream_answer(written)) == wrapped
    if not WRITTEN[name].parameters:   # (protobuf's order of several map entries differs between writes)
        assert stream_answer(written) == wrapped.SerializeToString()


def test_large_output_data_is_a_piece_of_its_own_not_copied_into_the_message():
    """The data of a large output (a view of an instance's pool, say) is written to the client
    as it is: it is one of the message's pieces, not copied into one message."""
    large = memoryview(bytes(range(256)) * 300)
    written = InferResult("m", 1, "", [OutputTensor("A", "UINT8", [76800], large), OutputTensor("B", "FP32", [1], bytes(4))])
    pieces = InferResponseWriter().pieces(written)
    assert any(piece is large for piece in pieces)
    assert b"".join(pieces) == encode_infer_response(written).SerializeToString()
    assert len(InferResponseWriter().pieces(result())) == 1   # small answers: one piece


def test_the_writer_keeps_a_bounded_number_of_descriptions():
    writer = InferResponseWriter()
    for rows in range(InferResponseWriter.LIMIT + 10):
        written = result(shape=(rows, 16))
        assert writer.write(written) == encode_infer_response(written).SerializeToString()
    assert len(writer._encoded) <= InferResponseWriter.LIMIT


def test_large_metadata_and_many_fields_are_read_by_protobuf_and_not_kept():
    """A key the size of a large parameter is not kept, and a message of very many fields is
    not walked in Python: both are read by protobuf, each time, to the same request."""
    reader = InferRequestReader()
    large = add_sub()
    large.parameters["note"].string_param = "x" * 20_000
    many = add_sub()
    many.raw_input_contents.extend([b"left over"] * 300)
    for message in (large, many):
        data = message.SerializeToString()
        assert reader.read(data) == protobuf_alone(data)
        assert reader.read(data) == protobuf_alone(data)
    assert reader._seen == {}


@pytest.mark.parametrize("datatype, field, value", [("INT8", "int_contents", 1000), ("UINT8", "uint_contents", 300),
                                                    ("INT16", "int_contents", -40000)])
def test_typed_contents_out_of_their_datatypes_range_are_the_clients_mistake(datatype, field, value):
    """int_contents carry 32 bits whatever the datatype: a value INT8 cannot hold is refused
    naming the model, the input and the datatype (as HTTP's JSON data is), not an internal error."""
    message = service_pb2.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=[1])
    getattr(tensor.contents, field).append(value)
    with pytest.raises(InvalidArgument, match=f"^input 'X' for model 'm' has a value out of range for {datatype}$"):
        decode_infer_request(message)



@pytest.mark.parametrize("datatype, fields, message", [
    ("FP32", {"int_contents": [1]}, " of type 'INT32', expected datatype 'FP32'"),
    ("FP16", {"fp32_contents": [1.0]}, " of type 'FP32', expected datatype 'FP16'"),
    ("INT64", {"uint_contents": [1]}, " of type 'UINT32', expected datatype 'INT64'"),
    ("BYTES", {"bool_contents": [True]}, " of type 'BOOL', expected datatype 'BYTES'"),
    ("FP32", {"fp32_contents": [1.0], "fp64_contents": [1.0]}, ", binary data was already supplied."),
])
def test_typed_contents_in_another_datatypes_field_are_refused_in_tritons_words(datatype, fields, message):
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[1])
    for field, values in fields.items():
        getattr(tensor.contents, field).extend(values)
    with pytest.raises(InvalidArgument) as refused:
        decode_infer_request(request)
    assert refused.value.message == f"unexpected explicit tensor data for input tensor 'X' for model 'm'{message}"


def test_the_reader_tells_what_a_message_it_refused_names_on_each_of_its_paths():
    """Parsed by protobuf, or known from its metadata (the fast path): either way the model and
    version of the refused request are the ones protobuf would read, a later field's included."""
    reader = InferRequestReader()
    good = service_pb2.ModelInferRequest(model_name="m", model_version="2", raw_input_contents=[b"\0" * 4])
    good.inputs.add(name="X", datatype="FP32", shape=[1])
    for _ in range(2):   # kept the second time it is seen
        reader.read(good.SerializeToString())
    missing = service_pb2.ModelInferRequest(model_name="m", model_version="2")
    missing.inputs.add(name="X", datatype="FP32", shape=[1])
    with pytest.raises(InvalidArgument):   # the same metadata without its contents: the fast path
        reader.read(missing.SerializeToString())
    assert reader.named == ("m", "2") and not isinstance(reader.named, service_pb2.ModelInferRequest)
    assert reader.named is reader._last.metadata.named   # from the kept metadata: the fast path
    late_version = service_pb2.ModelInferRequest(model_name="n").SerializeToString() + \
        service_pb2.ModelInferRequest(model_version="7", inputs=[missing.inputs[0]]).SerializeToString()
    with pytest.raises(InvalidArgument):   # fields out of protobuf's order: parsed, the version read late
        reader.read(late_version)
    assert reader.named == ("n", "7")


def test_request_parameters_are_checked_before_the_inputs_as_triton_checks_them():
    message = service_pb2.ModelInferRequest(model_name="m")
    message.parameters["triton_other"].bool_param = True
    message.inputs.add(name="X", datatype="FP32", shape=[-1])   # a negative dimension: refused, but later
    with pytest.raises(InvalidArgument) as refused:
        decode_infer_request(message)
    assert refused.value.message.startswith("parameter keys starting with 'triton_' are reserved for Triton usage.")
