"""Triton's gRPC messages (tritonclient.grpc.service_pb2) <-> the data plane's requests and results.

Inputs come from ``raw_input_contents`` (one entry per input, as tritonclient always
sends them) or from the typed ``contents``; outputs always go out in
``raw_output_contents``, one entry per output, as Triton does (tritonclient reads only
those).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from tritium.gateway.inference import (SEQUENCE_FLAGS, SEQUENCE_PARAMETERS, InferRequest, InferResult, InputTensor,
                               RequestedOutput)
from tritium.gateway.offload import DECODE_OFF_LOOP_BYTES
from tritium.gateway.shared_memory import SharedMemoryRef, shared_memory_ref
from tritium import datatypes
from tritium.errors import InvalidArgument

_IN_PLACE = 64 * 1024   # output data of this size or more is left out of the joined message (written in place)

# Request parameters with the triton_ prefix that gRPC clients may send (Triton's rule).
_ALLOWED_TRITON_PARAMETERS = {"triton_enable_empty_final_response"}
FINAL_RESPONSE = "triton_final_response"   # the parameter that marks a stream's last answer to a request
# Which typed contents field holds each datatype.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_CONTENTS_ORDER = ("bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents",
                   "fp32_contents", "fp64_contents", "bytes_contents")   # the order Triton looks at them in


def parameter_value(parameter: service_pb2.InferParameter) -> bool | int | float | str | None:
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice else None


def parameters_to_dict(parameters: Mapping[str, service_pb2.InferParameter], skip: tuple = ()) -> dict:
    return {key: parameter_value(parameter) for key, parameter in parameters.items() if key not in skip}


def fill_parameters(target: MutableMapping[str, service_pb2.InferParameter], values: dict) -> None:
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def decode_infer_request(message: service_pb2.ModelInferRequest) -> InferRequest:
    model = message.model_name
    if message.parameters:   # (empty maps are skipped: this is every gRPC inference's path)
        check_parameter_kinds(message.parameters)
    raw = message.raw_input_contents
    inputs, position = [], 0
    for tensor in message.inputs:
        shape = list(tensor.shape)
        if shape and min(shape) < 0:
            raise InvalidArgument(f"input '{tensor.name}' for model '{model}' has a negative dimension")
        # An input in shared memory has no raw_input_contents entry (tritonclient sends none);
        # the others take theirs in order, and entries left over are ignored, as by Triton.
        ref = _shared_memory("input", tensor.name, tensor.parameters) if tensor.parameters else None
        if ref is not None:
            data = b""
        elif tensor.HasField("contents"):
            if raw:
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'")
            data = contents_to_bytes(model, tensor)
        elif position < len(raw):
            data = raw[position]
            position += 1
        else:
            raise InvalidArgument(f"unable to find data for input tensor '{tensor.name}' for model '{model}' in request.")
        inputs.append(InputTensor(tensor.name, tensor.datatype, shape, data, ref))
    outputs = None
    if len(message.outputs):
        outputs = []
        for output in message.outputs:
            if not output.parameters:
                outputs.append(RequestedOutput(output.name, {}, None, None))
                continue
            parameters = parameters_to_dict(output.parameters)
            shared = _shared_memory("output", output.name, output.parameters)
            classes = _classification(output.parameters)
            if shared is not None and "classification" in parameters:   # Triton's order, before any lookup
                raise InvalidArgument("output can't set both 'shared_memory_region' and 'classification'")
            outputs.append(RequestedOutput(output.name, parameters, shared, classes))
    sequence_id, sequence_flags, parameters = _request_parameters(message.parameters)
    return InferRequest(model=model, version=message.model_version or None, inputs=inputs, outputs=outputs,
                        id=message.id, parameters=parameters,
                        sequence_id=sequence_id, sequence_flags=sequence_flags)


def _classification(parameters: Mapping[str, service_pb2.InferParameter]) -> int | None:
    """The classes an output asks for, checked as Triton's gRPC front end checks them (an
    int64 above 0: HTTP takes 0 as none)."""
    if "classification" not in parameters:
        return None
    parameter = parameters["classification"]
    if parameter.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidArgument("invalid value type for 'classification' parameter, expected int64_param")
    if parameter.int64_param <= 0:
        raise InvalidArgument("invalid value for 'classification' parameter, expected >= 0")
    return parameter.int64_param


def _shared_memory(kind: str, name: str, parameters: Mapping[str, service_pb2.InferParameter]) -> SharedMemoryRef | None:
    """The shared memory an input's or output's parameters name, refused in the order and words of
    Triton's gRPC front end: the region's type, then the offset and the size (each needs a region
    and an int64), then a region without a size. (HTTP takes an offset or size without a region.)"""
    has_region = "shared_memory_region" in parameters
    if has_region and parameters["shared_memory_region"].WhichOneof("parameter_choice") != "string_param":
        raise InvalidArgument(f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', "
                              "expected string_param.")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key not in parameters:
            continue
        if not has_region:
            raise InvalidArgument(f"'{key}' can not be specified without 'shared_memory_region' parameter "
                                  f"for tensor '{name}'")
        if parameters[key].WhichOneof("parameter_choice") != "int64_param":
            raise InvalidArgument(f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param.")
    if not has_region:
        return None
    if "shared_memory_byte_size" not in parameters:
        raise InvalidArgument("'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
                              f"parameter for tensor '{name}'")
    return shared_memory_ref(f"{kind} '{name}'", parameters_to_dict(parameters))


def costly_to_read(data: bytes | memoryview) -> bool:
    """Whether reading the message would hold the event loop for long: a large one whose values
    protobuf and Python decode one by one (typed contents), not one of raw contents, which are
    taken as they are."""
    return len(data) >= DECODE_OFF_LOOP_BYTES and _plain_parts(data) is None


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """A ModelInferRequest read on one of the gateway's threads (gateway/offload.py) before the
    event loop takes it: the request, or what reading it raised, and the message's id (and, with
    an error, the model and version it names)."""

    request: InferRequest | None
    error: Exception | None
    id: str
    model: str = ""
    version: str = ""

    @classmethod
    def of(cls, data: bytes | memoryview) -> "ReadAhead":
        """Safe on any thread: it holds no reader's state."""
        try:
            message = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError as exc:
            return cls(None, exc, "")
        try:
            return cls(decode_infer_request(message), None, message.id)
        except Exception as exc:
            return cls(None, exc, message.id, message.model_name, message.model_version)

    def result(self) -> InferRequest:
        if self.request is None:
            assert self.error is not None
            raise self.error
        return self.request


class InferRequestReader:
    """ModelInferRequest bytes -> InferRequest, reading with protobuf only what it has not seen.

    A client sends the same request metadata each time (the model, the inputs' names,
    datatypes and shapes, the outputs, the parameters) with new tensor contents; reading that
    metadata through protobuf's message objects is most of a request's decoding. So the
    metadata's bytes (the message less its id and its raw_input_contents) key what protobuf
    read from them the first time, and a message whose metadata was seen before takes only
    its id and its contents from its own bytes. Messages of any other shape (typed contents,
    shared memory, parameters on a tensor, fields out of field-number order) are read by
    protobuf alone, every time.

    Metadata that changes with every request (a sequence's id among the parameters, say)
    would make the walk over the message's fields a cost with no return: metadata is kept only
    the second time it is seen, and after MISSES_BEFORE_RESTING walks in a row that found
    nothing kept, the next RESTING messages go straight to protobuf.

    The walk itself is most of what a known message costs: a message that repeats, byte for
    byte, the fields around the id of the last known one (``_Layout``) has only its id and its
    contents walked.
    """

    LIMIT = 256   # kinds of metadata kept, and seen once (a client sending ever new ones clears them now and then)
    MISSES_BEFORE_RESTING = 32
    RESTING = 256

    def __init__(self) -> None:
        self._seen: dict[bytes, _Metadata] = {}
        self._seen_once: set[bytes] = set()
        self._misses = 0    # walks in a row that found no metadata kept
        self._resting = 0   # messages still to read without walking them
        self._last: _Layout | None = None   # of the last message whose metadata was kept
        # The model and version (None: the latest) the message last read names, for the error it
        # raised: Triton refuses an unknown model before it looks at the inputs.
        self.named: tuple[str, str | None] = ("", None)

    def read(self, data: bytes | memoryview) -> InferRequest:
        """The request; InvalidArgument as ``decode_infer_request`` raises it, DecodeError for
        bytes protobuf cannot parse."""
        if self._resting:
            self._resting -= 1
            message = service_pb2.ModelInferRequest.FromString(data)
            self.named = (message.model_name, message.model_version or None)
            return decode_infer_request(message)
        last = self._last
        if last is not None:
            known = last.parts(data)
            if known is not None:
                self._misses = 0
                self.named = last.metadata.named
                view = memoryview(data)   # the contents as views of the message, never copied
                return last.metadata.request(known[0], [view[start:stop] for start, stop in known[1]])
        parts = _plain_parts(data)
        if parts is not None:
            metadata = self._seen.get(parts[0])
            if metadata is not None:
                self._misses = 0
                self._last = _Layout(parts, metadata)
                self.named = metadata.named
                view = memoryview(data)
                return metadata.request(parts[1], [view[start:stop] for start, stop in parts[2]])
        self._misses += 1
        if self._misses >= self.MISSES_BEFORE_RESTING:
            self._misses, self._resting = 0, self.RESTING
        message = service_pb2.ModelInferRequest.FromString(data)
        self.named = (message.model_name, message.model_version or None)
        request = decode_infer_request(message)
        if parts is not None and _plain(message):
            self._remember(parts[0], request)
        return request

    def _remember(self, key: bytes, request: InferRequest) -> None:
        once = self._seen_once
        if key not in once:
            if len(once) >= self.LIMIT:
                once.clear()
            once.add(key)
            return
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()
        self._seen[key] = _Metadata(request)


class _Metadata:
    """What a request's metadata says, read once: a new InferRequest of it for each message."""

    __slots__ = ("model", "version", "named", "inputs", "outputs", "parameters", "sequence_id", "sequence_flags")

    def __init__(self, request: InferRequest) -> None:
        self.model, self.version = request.model, request.version
        self.named = (request.model, request.version)   # (what the reader says a refused message names)
        self.inputs = [(tensor.name, tensor.datatype, tuple(tensor.shape)) for tensor in request.inputs]
        self.outputs = None if request.outputs is None else [output.name for output in request.outputs]
        self.parameters = dict(request.parameters)
        self.sequence_id, self.sequence_flags = request.sequence_id, request.sequence_flags

    def request(self, request_id: str, raw: list[memoryview]) -> InferRequest:
        if len(raw) < len(self.inputs):
            name = self.inputs[len(raw)][0]
            raise InvalidArgument(f"unable to find data for input tensor '{name}' for model '{self.model}' in request.")
        inputs = [InputTensor(name, datatype, list(shape), data) for (name, datatype, shape), data in zip(self.inputs, raw)]
        outputs = None if self.outputs is None else [RequestedOutput(name, {}, None, None) for name in self.outputs]
        return InferRequest(self.model, self.version, inputs, outputs, request_id, dict(self.parameters),
                            self.sequence_id, self.sequence_flags)


class _Layout:
    """A known message's fields around its id (``head``, the id's field or none, ``tail``),
    then only contents: a message of the same bytes there reads to the same metadata."""

    __slots__ = ("head", "with_id", "tail", "metadata")

    def __init__(self, parts: _PlainParts, metadata: _Metadata) -> None:
        key, _, _, self.head, self.with_id = parts
        self.tail = key[len(self.head):]
        self.metadata = metadata

    def parts(self, data: bytes | memoryview) -> tuple[str, list[tuple[int, int]]] | None:
        """The id and where each raw content is, as ``_plain_parts`` would find them; None
        when ``data`` is laid out otherwise (``_plain_parts`` then decides)."""
        head, tail = self.head, self.tail
        position, end = len(head), len(data)
        try:
            if data[:position] != head:
                return None
            request_id = ""
            if self.with_id:
                if data[position] != _ID:
                    return None
                start, position = _value_span(data, position, end)
                request_id = bytes(data[start:position]).decode()
            stop = position + len(tail)
            if data[position:stop] != tail:
                return None
            raw = _raw_contents(data, stop, end)
            return None if raw is None else (request_id, raw)
        except (IndexError, UnicodeDecodeError):
            return None


def _raw_contents(data: bytes | memoryview, position: int, end: int) -> list[tuple[int, int]] | None:
    """Where each raw content is, from ``position`` to the end; None if anything else is there,
    or more than ``_FIELDS`` of them (IndexError for a message cut short)."""
    raw: list[tuple[int, int]] = []
    while position < end:
        if data[position] != _RAW_INPUT_CONTENTS or len(raw) == _FIELDS:
            return None
        field = _value_span(data, position, end)
        raw.append(field)
        position = field[1]
    return raw


def _value_span(data: bytes | memoryview, position: int, end: int) -> tuple[int, int]:
    """Where the value of the length-delimited field whose tag is at ``position`` starts and
    ends (IndexError when it ends past ``end``)."""
    length = data[position + 1]
    position += 2
    if length & 0x80:
        length, position = _varint(data, position - 1)
    stop = position + length
    if stop > end:
        raise IndexError("a field past the message's end")
    return position, stop


_RAW_INPUT_CONTENTS = 7 << 3 | 2   # the tags (field number, wire type 2) ModelInferRequest's fields start with
_ID = 3 << 3 | 2
# Metadata larger, or messages of more fields, are left to protobuf: a key that size is not kept,
# and walking that many fields in Python would cost the event loop more than protobuf does.
_METADATA_BYTES = 16 * 1024
_FIELDS = 256


_PlainParts = tuple[bytes, str, list[tuple[int, int]], bytes, bool]


def _plain_parts(data: bytes | memoryview) -> _PlainParts | None:
    """(the metadata's bytes, the id, where each raw content is, the metadata's bytes before the
    id, whether there is an id) of a message whose fields come in field-number order, as
    protobuf writes them; None for any other. The metadata is bytes (a key) even when the
    message is a view (a large one's)."""
    raw: list[tuple[int, int]] = []
    first_raw = id_start = id_value = id_end = -1
    position, end = 0, len(data)
    fields = 0
    try:
        while position < end:
            fields += 1
            if fields > _FIELDS:
                return None
            tag = data[position]
            if tag & 0x87 != 2:   # every field of the message is length-delimited, numbered under 16
                return None
            start = position
            position, stop = _value_span(data, position, end)
            if tag == _RAW_INPUT_CONTENTS:
                if first_raw < 0:
                    first_raw = start
                raw.append((position, stop))
            elif first_raw >= 0 or stop > _METADATA_BYTES:
                return None
            elif tag == _ID:
                id_start, id_value, id_end = start, position, stop
            position = stop
        metadata_end = end if first_raw < 0 else first_raw
        if id_start < 0:
            metadata = bytes(data[:metadata_end])
            return metadata, "", raw, metadata, False
        head = bytes(data[:id_start])
        return head + data[id_end:metadata_end], bytes(data[id_value:id_end]).decode(), raw, head, True
    except (IndexError, UnicodeDecodeError):
        return None


def _varint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it (IndexError past the end)."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("a varint over 10 bytes")


def _plain(message: service_pb2.ModelInferRequest) -> bool:
    """Whether every input takes its data from raw_input_contents, in order (no typed contents,
    no shared memory), and no output has parameters: what ``_Metadata`` can stand for."""
    return all(not tensor.parameters and not tensor.HasField("contents") for tensor in message.inputs) \
        and all(not output.parameters for output in message.outputs)


def _request_parameters(message_parameters: Mapping[str, service_pb2.InferParameter]) -> tuple[int | str, int, dict]:
    """The sequence id and flags, and the other parameters (kinds checked by check_parameter_kinds)."""
    if not message_parameters:
        return 0, 0, {}
    sequence_id, sequence_flags = _sequence(message_parameters)
    parameters = parameters_to_dict(message_parameters, SEQUENCE_PARAMETERS)
    if parameters.get("timeout", 0) < 0:
        parameters["timeout"] %= 2**64   # Triton reads the int64 as uint64
    return sequence_id, sequence_flags, parameters


# The value kinds Triton's gRPC front end accepts for the parameters it reads itself.
_PARAMETER_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",), "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"), "timeout": ("int64_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}


# What Triton passes on to the model (its message leaves out the double it also takes).
_MODEL_PARAMETER_KINDS = ("int64_param", "bool_param", "string_param", "double_param")


def check_parameter_kinds(parameters: Mapping[str, service_pb2.InferParameter]) -> None:
    """Triton's INVALID_ARGUMENT for a reserved parameter of the wrong kind (a string priority,
    a NaN timeout) or a triton_ key it does not know, in the message's order and before the
    inputs, as Triton checks them; a negative priority is refused, a negative timeout wraps to
    uint64 as on Triton."""
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        kinds = _PARAMETER_KINDS.get(key)
        if kinds is None:   # the model's own
            if key.startswith("triton_"):
                raise InvalidArgument(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                    "keys starting with 'triton_' are allowed: " + ", ".join(sorted(_ALLOWED_TRITON_PARAMETERS)))
            if kind not in _MODEL_PARAMETER_KINDS:
                raise InvalidArgument(f"invalid value type for '{key}' parameter, expected int64_param, "
                                      "bool_param, or string_param.")
        elif kind not in kinds:
            raise InvalidArgument(f"invalid value type for '{key}' parameter, expected {' or '.join(kinds)}.")
        elif key == "priority" and kind == "int64_param" and parameter.int64_param < 0:
            raise InvalidArgument("invalid value for 'priority', expected value >= 0.")


def _sequence(parameters: Mapping[str, service_pb2.InferParameter]) -> tuple[int | str, int]:
    """Triton's sequence parameters (their kinds checked by check_parameter_kinds)."""
    sequence_id, flags = 0, 0
    if "sequence_id" in parameters:
        parameter = parameters["sequence_id"]
        # Triton keeps the id as uint64: a negative int64 wraps around.
        sequence_id = (parameter.string_param if parameter.HasField("string_param")
                       else parameter.int64_param % 2**64)
    for key in ("sequence_start", "sequence_end"):
        if key in parameters and parameters[key].bool_param:
            flags |= SEQUENCE_FLAGS[key]
    return sequence_id, flags


def contents_to_bytes(model: str, tensor: service_pb2.ModelInferRequest.InferInputTensor) -> bytes:
    dt = datatypes.from_name(tensor.datatype)
    if dt is None:
        raise InvalidArgument(f"input '{tensor.name}' for model '{model}' has invalid datatype '{tensor.datatype}'")
    _check_contents_fields(model, tensor, dt.name)
    field = _CONTENTS_FIELD.get(dt.name)
    if field is None:   # FP16, BF16: no typed field; none given (checked), so no data
        return b""
    values = getattr(tensor.contents, field)
    if dt.is_bytes:
        return datatypes.pack_bytes(values)
    dtype = dt.numpy
    assert dtype is not None   # every datatype with a contents field but BYTES has one
    if dtype.kind in "iu" and dtype.itemsize < 4:   # carried in 32-bit contents: may not fit
        wide = _numbers(values, np.dtype(np.int32 if dtype.kind == "i" else np.uint32))
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidArgument(f"input '{tensor.name}' for model '{model}' has a value out of range for {dt.name}")
        return wide.astype(dtype).tobytes()
    return _numbers(values, dtype).tobytes()


def _check_contents_fields(model: str, tensor: service_pb2.ModelInferRequest.InferInputTensor, datatype: str) -> None:
    """One typed field holds the data, the datatype's: refused as Triton words it otherwise."""
    given = [field for field in _CONTENTS_ORDER if len(getattr(tensor.contents, field))]
    where = f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}'"
    if len(given) > 1:
        raise InvalidArgument(f"{where}, binary data was already supplied.")
    if given and _CONTENTS_FIELD.get(datatype) != given[0]:
        field_type = {"int_contents": "INT32", "uint_contents": "UINT32"}.get(given[0]) or \
            given[0].removesuffix("_contents").upper()
        raise InvalidArgument(f"{where} of type '{field_type}', expected datatype '{datatype}'")


_CHUNK = 1 << 16


def _numbers(values, dtype: np.dtype) -> np.ndarray:
    """A repeated number field as an array, converted a chunk at a time: one numpy call over
    millions of values would hold the GIL, and with it the event loop, for seconds (a large
    message is read on a thread, and the loop runs between the chunks)."""
    count = len(values)
    if count <= _CHUNK:
        return np.fromiter(values, dtype, count=count)
    array = np.empty(count, dtype)
    items = iter(values)
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        array[start:stop] = np.fromiter(items, dtype, count=stop - start)
    return array


def encode_infer_response(result: InferResult, parameters: dict | None = None) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=result.model, model_version=str(result.version),
                                              id=result.id)
    for output in result.outputs:  # data in raw_output_contents, never in the typed contents
        response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        # An output in shared memory keeps its place with an empty entry, so indexes still match.
        response.raw_output_contents.append(b"" if output.in_shared_memory else bytes(output.data))
    fill_parameters(response.parameters, {**result.parameters, **(parameters or {})})
    return response


class InferResponseWriter:
    """InferResult -> ModelInferResponse bytes, written directly: the message a result without
    parameters makes (model, version, id, the outputs' descriptions, raw_output_contents) is a
    few length-prefixed fields, and the parts that repeat from answer to answer (the model and
    version, each output's description) are kept, encoded. The bytes are those protobuf writes;
    a result with parameters is written by protobuf."""

    LIMIT = 1024   # descriptions kept (a model with ever new output shapes clears them now and then)

    def __init__(self) -> None:
        self._encoded: dict[tuple, bytes] = {}

    def write(self, result: InferResult, final: bool | None = None) -> bytes:
        """The response's bytes; with ``final`` (a stream's answers), its parameter
        ``triton_final_response`` too."""
        return joined(self.pieces(result, final))

    def pieces(self, result: InferResult, final: bool | None = None) -> tuple[bytes | memoryview, ...]:
        """The response's bytes as pieces written one after the other: one when it is small; else its
        fields and each output's data as they are (a large one is not copied: it may lie in an
        instance's pool)."""
        if result.parameters:
            extra = None if final is None else {FINAL_RESPONSE: final}
            return (encode_infer_response(result, extra).SerializeToString(),)
        encoded = self._encoded
        if len(encoded) >= self.LIMIT:
            encoded.clear()
        head = encoded.get((result.model, result.version))
        if head is None:
            head = encoded[(result.model, result.version)] = \
                _field(1, result.model.encode()) + _field(2, str(result.version).encode())
        parts: list[bytes | memoryview] = [head]
        if result.id:
            parts.append(_field(3, result.id.encode()))
        if final is not None:
            parts.append(_FINAL_TRUE if final else _FINAL_FALSE)
        contents: list[bytes | memoryview] = []
        large = False
        for output in result.outputs:
            shape = tuple(output.shape)
            description = encoded.get((output.name, output.datatype, shape))
            if description is None:
                description = encoded[(output.name, output.datatype, shape)] = _output_description(output)
            parts.append(description)
            data = b"" if output.in_shared_memory else output.data
            contents += (b"\x32", _varint_bytes(len(data)), data)
            large = large or len(data) >= _IN_PLACE
        parts += contents
        return tuple(parts) if large else (b"".join(parts),)   # the transport joins runs of small pieces


def joined(pieces: tuple[bytes | memoryview, ...]) -> bytes:
    """A message's pieces as one."""
    first = pieces[0]
    return first if len(pieces) == 1 and isinstance(first, bytes) else b"".join(pieces)


def stream_answer(response: bytes) -> bytes:
    """A ModelStreamInferResponse holding the ModelInferResponse ``response`` (field 2), as
    protobuf writes it."""
    return b"\x12" + _varint_bytes(len(response)) + response


def _final_entry(final: bool) -> bytes:
    """Field 4 of ModelInferResponse: the parameters map's entry triton_final_response."""
    value = b"\x08\x01" if final else b"\x08\x00"   # bool_param, written even when false (a oneof member)
    entry = _field(1, FINAL_RESPONSE.encode()) + b"\x12" + _varint_bytes(len(value)) + value
    return b"\x22" + _varint_bytes(len(entry)) + entry


def _output_description(output) -> bytes:
    """Field 5 of ModelInferResponse: one InferOutputTensor (name, datatype, packed shape)."""
    body = _field(1, output.name.encode()) + _field(2, output.datatype.encode())
    if output.shape:
        body += _field(3, b"".join(_varint_bytes(int(dim) & 0xFFFFFFFFFFFFFFFF) for dim in output.shape))
    return b"\x2a" + _varint_bytes(len(body)) + body   # (written even when empty, as any element of a repeated field)


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited field; protobuf leaves an empty string or message out."""
    if not value:
        return b""
    return bytes((number << 3 | 2,)) + _varint_bytes(len(value)) + value


def _varint_bytes(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_FINAL_TRUE, _FINAL_FALSE = _final_entry(True), _final_entry(False)
