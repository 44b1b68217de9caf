"""The KServe v2 HTTP body formats: JSON tensors and Triton's binary tensor data extension.

Decoding turns a request body into an ``InferRequest`` whose tensors are raw bytes: a
binary input is a slice (memoryview) of the body, never copied; a JSON input is
converted once with numpy. Encoding writes the JSON header, and the binary outputs
after it, in output order, as ``Inference-Header-Content-Length`` says.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from tritium.gateway.classification import classification_count
from tritium.gateway.http_fast_decode import decode_usual_request
from tritium.gateway.inference import (SEQUENCE_FLAGS, InferRequest, InferResult, InputTensor,
                               RequestedOutput)
from tritium.gateway.model_table import ModelSpec
from tritium.gateway.shared_memory import shared_memory_ref
from tritium.gateway.validation import element_count
from tritium import datatypes
from tritium.errors import InternalError, InvalidArgument

_LENGTH = struct.Struct("<I")
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_NO_ID = "[request id: <id_unknown>] "   # Triton's prefix for a request without an id (a raw one never has one)


_UTF8_BOM = b"\xef\xbb\xbf"


def parse_json_object(data: bytes, key_count: Callable[[dict], int] | None = None) -> dict:
    """The JSON object in ``data``; a key given twice keeps its first value, as Triton reads it.

    Each key in the text is followed by one ':', so when the parsed objects hold as many
    keys as the text has colons, no key was given twice (orjson would keep the last one).
    ``key_count`` may count fewer keys than there are (it need not walk tensor data): that
    only sends a body down the slow path, never past it.
    """
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if data[:3] == _UTF8_BOM:   # Triton's reader skips one
            data = data[3:]
            try:
                document = orjson.loads(data)
            except orjson.JSONDecodeError as again:
                document = _with_non_finite_numbers(data, again)
        else:
            document = _with_non_finite_numbers(data, exc)
    if not isinstance(document, dict):
        raise InvalidArgument("the request body must be a JSON object")
    if (key_count or _key_count)(document) != data.count(b":"):   # a duplicate key, or a ':' in a string
        document = json.loads(data, object_pairs_hook=_first_value_wins)
    return document


def _with_non_finite_numbers(data: bytes, error: orjson.JSONDecodeError) -> Any:
    """JSON with NaN, Infinity or -Infinity for numbers, which Triton's reader takes (and orjson
    refuses); any other text that is no JSON is refused with orjson's words."""
    if b"NaN" in data or b"Infinity" in data:
        try:
            return json.loads(data, object_pairs_hook=_first_value_wins)
        except ValueError:
            pass
    raise InvalidArgument(f"failed to parse the request JSON buffer: {error}") from None


def _key_count(value: dict | list) -> int:
    """Keys of the objects in ``value``, leaving lists of scalars (tensor data) unread."""
    if isinstance(value, dict):
        return len(value) + sum(_key_count(item) for item in value.values() if isinstance(item, (dict, list)))
    if value and isinstance(value[0], (dict, list)):
        return sum(_key_count(item) for item in value if isinstance(item, (dict, list)))
    return 0


def _infer_key_count(document: dict) -> int:
    """The keys of an inference request's own objects: the request, its inputs and outputs, their parameters."""
    parameters = document.get("parameters")
    count = len(document) + (len(parameters) if type(parameters) is dict else 0)
    for key in ("inputs", "outputs"):
        items = document.get(key)
        if type(items) is list:
            for item in items:
                if type(item) is dict:
                    parameters = item.get("parameters")
                    count += len(item) + (len(parameters) if type(parameters) is dict else 0)
    return count


def _first_value_wins(pairs: list[tuple[str, Any]]) -> dict:
    document: dict[str, Any] = {}
    for key, value in pairs:
        document.setdefault(key, value)
    return document


def decode_raw_request(spec: ModelSpec, version: str | None, body: bytes) -> InferRequest:
    """A body that is the bytes of the model's one input (``Inference-Header-Content-Length: 0``).

    Its shape comes from the config (a batch of 1 for a batching model; one variable dim
    takes what the bytes hold), a BYTES input is one element, and every output comes back
    binary. Errors are worded as Triton words them.
    """
    if len(spec.inputs) != 1:
        raise InvalidArgument(
            f"{_NO_ID}Raw request must only have 1 input (found 1) to be deduced but got {len(spec.inputs)} "
            f"inputs in '{spec.name}' model configuration")
    (config,) = spec.inputs.values()
    dims = list(config.dims)
    if config.datatype.is_bytes:
        if dims != [1]:
            raise InvalidArgument(
                f"{_NO_ID}For BYTE datatype raw input '{config.name}', the model must have input shape [1]")
        data: bytes | memoryview = datatypes.pack_bytes([bytes(body)])
    else:
        variable = [i for i, d in enumerate(dims) if d == -1]
        if len(variable) > 1:
            raise InvalidArgument(
                f"{_NO_ID}The shape of the raw input '{config.name}' can not be deduced because there are "
                "more than one variable-sized dimension")
        itemsize = config.datatype.itemsize
        if variable:
            known = element_count([d for d in dims if d != -1]) * itemsize
            dims[variable[0]] = len(body) // known if known else 0
        expected = element_count(dims) * itemsize
        if len(body) != expected:
            raise InvalidArgument(
                f"{_NO_ID}input byte size mismatch for input 'raw_input' for model '{spec.name}'. "
                f"Expected {expected}, got {len(body)}")
        data = body
    shape = [1, *dims] if spec.max_batch_size > 0 else dims
    return InferRequest(model=spec.name, version=version,
                        inputs=[InputTensor(config.name, config.datatype.name, shape, data)])


def decode_infer_request(model: str, version: str | None, body: bytes, header_length: int | None,
                         ) -> tuple[InferRequest, bool]:
    """Parse a body; return the request and whether outputs default to binary."""
    json_part, binary = _split_body(model, body, header_length)
    if header_length is not None:   # without one, the tensors are JSON data: never the usual body
        usual = decode_usual_request(model, version, json_part, binary)
        if usual is not None:
            return usual, False
    document = parse_json_object(json_part, _infer_key_count)
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("the request 'id' must be a string")
    parameters, sequence_id, sequence_flags, binary_default = _request_parameters(document.get("parameters"))
    inputs = _inputs(model, document.get("inputs"), binary, header_length is not None)
    outputs = _outputs(document.get("outputs"))
    request = InferRequest(model=model, version=version, inputs=inputs, outputs=outputs, id=request_id,
                           parameters=parameters, sequence_id=sequence_id, sequence_flags=sequence_flags)
    return request, binary_default


_LEADING_INTEGER = re.compile(rb"\s*([+-]?[0-9]+)")


def inference_header_length(text: bytes) -> int:
    """The ``Inference-Header-Content-Length`` header's value, read as Triton reads it: C++'s
    ``stoi`` (blanks, a signed integer, and whatever follows ignored: ``82abc`` is 82) into a C
    int; an empty value is 0 (a raw request), as Triton's HTTP library hands it over."""
    if text.isdigit() and len(text) <= 10:   # what every client sends (read per request, twice)
        value = int(text)
    else:
        value = _stoi(text)
    if not -2**31 <= value < 2**31:
        raise InvalidArgument("Unable to parse Inference-Header-Content-Length, value is out of range "
                              f"[ {-2**31}, {2**31 - 1} ], got: {text.decode('latin-1')}")
    return value


def _stoi(text: bytes) -> int:
    if not text.strip():
        return 0
    match = _LEADING_INTEGER.match(text)
    if match is None:
        raise InvalidArgument(f"Unable to parse Inference-Header-Content-Length, got: {text.decode('latin-1')}")
    digits = match.group(1).lstrip(b"+-").lstrip(b"0")
    # (ten digits hold any C int; Python's int() refuses texts past 4300 digits)
    return int(match.group(1)) if len(digits) <= 10 else 2**63


def _split_body(model: str, body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if header_length <= 0 or header_length > len(body):
        raise InvalidArgument(
            f"inference header size should be in range (0, {len(body)}), got: {header_length}")
    return body[:header_length], memoryview(body)[header_length:]   # the header is copied, it is small


def _boolean_parameter(parameters: object, key: str) -> bool:
    """A binary-data switch; anything but true or false fails as Triton's parser fails it (500)."""
    if not isinstance(parameters, dict) or key not in parameters:
        return False
    value = parameters[key]
    if not isinstance(value, bool):
        raise InternalError(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
    return value


def _parameters(value: object, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"'parameters' of the {where} must be a JSON object")
    for key, item in value.items():
        _check_parameter_type(key, item)
    return dict(value)


def _check_parameter_type(key: str, value: object) -> None:
    if not isinstance(value, (str, int, float, bool)):
        raise InvalidArgument(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def _request_parameters(value: object) -> tuple[dict, int | str, int, bool]:
    """The request's parameters read as Triton's HTTP front end reads them, one after another in
    the body's order, each of its own keys with its own parser and words (a 500 for a JSON type
    error): the parameters a model sees, the sequence id and flags, and whether outputs default
    to binary (``binary_data_output``). The sequence keys and ``binary_data_output`` become request
    fields, which a model does not see among its parameters; ``priority`` and ``timeout`` stay."""
    if value is None:
        return {}, 0, 0, False
    if not isinstance(value, dict):
        raise InvalidArgument("'parameters' of the request must be a JSON object")
    parameters: dict = {}
    sequence_id, flags, binary_default = 0, 0, False
    for key, item in value.items():
        if key == "sequence_id":
            unsigned = isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**64
            if not unsigned and not isinstance(item, str):
                raise InternalError("Unable to parse 'sequence_id': attempt to access JSON non-string as string")
            sequence_id = item
        elif key == "binary_data_output":
            binary_default = _boolean_parameter(value, key)
        elif key in SEQUENCE_FLAGS:
            if _boolean_parameter(value, key):
                flags |= SEQUENCE_FLAGS[key]
        elif key in ("priority", "timeout"):
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < 2**64:
                raise InternalError(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
                                    "unsigned-integer")
            parameters[key] = item
        elif key.startswith("triton_"):
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.")
        else:
            _check_parameter_type(key, item)
            parameters[key] = item
    return parameters, sequence_id, flags, binary_default


def _inputs(model: str, value: object, binary: memoryview, has_header_length: bool) -> list[InputTensor]:
    if not isinstance(value, list):
        raise InvalidArgument(f"the request for model '{model}' must have an 'inputs' list")
    inputs: list[InputTensor] = []
    offset = 0
    for item in value:
        if not isinstance(item, dict):
            raise InvalidArgument(f"every entry of 'inputs' for model '{model}' must be a JSON object")
        name, datatype, shape = _tensor_header(model, item)
        parameters = _parameters(item.get("parameters"), f"input '{name}'")
        size = parameters.get("binary_data_size")
        sources = ("data" in item) + (size is not None) + ("shared_memory_region" in parameters)
        if sources != 1:
            set_fields = [f" '{key}'" for key, given in (("data", "data" in item), ("binary_data_size", size is not None),
                                                        ("shared_memory_region", "shared_memory_region" in parameters))
                          if given]
            raise InvalidArgument(
                "Input must set only one of the following fields: 'data', 'binary_data_size' in "
                "'parameters', 'shared_memory_region' in 'parameters'. But "
                + (f"set{''.join(set_fields)}" if set_fields else "no field is set"))
        shared = shared_memory_ref(f"input '{name}'", parameters)
        data: bytes | memoryview
        if shared is not None:
            data = b""
        elif size is not None:
            if not has_header_length:
                raise InvalidArgument(
                    "must specify valid 'Infer-Header-Content-Length' in request header and "
                    "'binary_data_size' when passing inputs in binary data format")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidArgument(f"'binary_data_size' of input '{name}' must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidArgument(
                    f"unexpected size for input '{name}', expecting {offset + size - len(binary)} "
                    f"additional bytes for model '{model}'")
            data = binary[offset:offset + size]
            offset += size
        else:
            data = json_to_bytes(model, name, datatype, shape, item["data"])
        inputs.append(InputTensor(name, datatype, shape, data, shared))
    if offset != len(binary):
        raise InvalidArgument(f"unexpected additional input data for model '{model}'")
    return inputs


def _tensor_header(model: str, item: dict) -> tuple[str, str, list[int]]:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"every input for model '{model}' must have a 'name' string")
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatypes.from_name(datatype) is None:
        raise InvalidArgument(
            f"input '{name}' for model '{model}' has invalid datatype {datatype!r}; expected one "
            f"of {', '.join(d.name for d in datatypes.DATATYPES)}")
    shape = item.get("shape")
    if type(shape) is not list:
        raise InvalidArgument(
            f"input '{name}' for model '{model}' must have a 'shape' list of non-negative integers")
    if not all(type(d) is int and d >= 0 for d in shape):   # (Triton's words, which it answers with a 500)
        raise InvalidArgument("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return name, datatype, shape


def _shared_memory_conflicts(parameters: object) -> None:
    """Triton's first check of an output, before its name: an answer going into shared memory can
    go neither out as classes (whatever the values) nor as binary data."""
    if not isinstance(parameters, dict) or "shared_memory_region" not in parameters:
        return
    if "classification" in parameters:
        raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
    binary = parameters.get("binary_data", False)
    if not isinstance(binary, bool):
        raise InternalError("Unable to set 'binary_data': attempt to access JSON non-boolean as boolean")
    if binary:
        raise InvalidArgument("Output can't set both 'shared_memory_region' and 'binary_data'")


def _outputs(value: object) -> list[RequestedOutput] | None:
    if value is None or value == []:   # Triton reads an empty list as every output
        return None
    if not isinstance(value, list):
        raise InvalidArgument("'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    for item in value:
        if isinstance(item, dict):
            _shared_memory_conflicts(item.get("parameters"))
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgument("every entry of 'outputs' must be a JSON object with a 'name'")
        _boolean_parameter(item.get("parameters"), "binary_data")
        owner = f"output '{item['name']}'"
        parameters = item.get("parameters")
        if parameters is None:
            parameters = {}
        elif not isinstance(parameters, dict):
            raise InvalidArgument(f"'parameters' of the {owner} must be a JSON object")
        # (the values of keys Triton does not read are not checked: no model sees an output's parameters)
        shared = shared_memory_ref(owner, parameters)
        outputs.append(RequestedOutput(item["name"], parameters, shared, classification_count(owner, parameters)))
    return outputs


def json_to_bytes(model: str, name: str, datatype: str, shape: list[int], data: object) -> bytes:
    """Serialize JSON tensor data (flat or nested, row-major) the way binary data would be."""
    dt = datatypes.BY_NAME[datatype]   # a name _tensor_header checked
    values = _flatten(data, model, name)
    # (every datatype numpy lacks is one JSON cannot carry); Triton refuses each element, so
    # a tensor with none passes
    if values and (not dt.json_allowed or dt.numpy is None):
        raise InvalidArgument(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}")
    # BYTES elements are counted later, as for binary data (Triton's core counts them, with
    # its own words); other types here, as Triton's JSON reader does.
    if len(values) != element_count(shape) and not dt.is_bytes:
        raise InvalidArgument("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if not values or dt.numpy is None:   # (no elements: the type is not refused)
        return b""
    if dt.is_bytes:
        if not all(isinstance(v, str) for v in values):
            raise InvalidArgument(f"input '{name}' for model '{model}' is BYTES: 'data' must hold strings")
        return datatypes.pack_bytes(v.encode("utf-8") for v in values)
    if dt.name == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise InvalidArgument(f"input '{name}' for model '{model}' is BOOL: 'data' must hold true or false")
        return np.array(values, dtype=np.bool_).tobytes()
    return _numbers_to_bytes(model, name, dt.name, dt.numpy, values)


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words (the value itself may be large)."""
    if isinstance(value, bool) or value is None:
        return _as_json(value)
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else "a number"


def _as_json(value) -> str:
    """A value as the client wrote it (null, not None)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _numbers_to_bytes(model: str, name: str, datatype: str, dtype: np.dtype, values: list) -> bytes:
    integer = dtype.kind in "iu"
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            kind = "integers" if integer else "numbers"
            raise InvalidArgument(
                f"input '{name}' for model '{model}' is {datatype}: 'data' must hold {kind}, got {_as_json(v)}")
    if not datatypes.fits(dtype, values):
        raise InvalidArgument(f"input '{name}' for model '{model}' has a value out of range for {datatype}")
    return np.array(values, dtype=dtype).tobytes()


def _flatten(data: object, model: str, name: str) -> list:
    if not isinstance(data, list):   # (Triton: a 500, "attempt to access JSON non-array as array")
        raise InvalidArgument(f"input '{name}' for model '{model}': 'data' must be a JSON array, got {_json_kind(data)}")
    if not data or not isinstance(data[0], list):   # the usual flat list
        if any(isinstance(v, list) for v in data):
            raise _ragged(model, name)
        return data
    flat: list = []
    for row in data:   # the usual rows of scalars, read here; deeper arrays the general way
        if not isinstance(row, list) or (row and isinstance(row[0], list)):
            return flatten_json(data, _ragged(model, name))
        if any(isinstance(v, list) for v in row):
            raise _ragged(model, name)
        flat.extend(row)
    return flat


def _ragged(model: str, name: str) -> InvalidArgument:
    return InvalidArgument(f"'data' of input '{name}' for model '{model}' is ragged")


def flatten_json(data: list, ragged: Exception | None = None) -> list:
    """The scalars of nested JSON arrays, in order. ``ragged``: raised for an array that holds
    arrays and scalars both (None: read them all the same). Iterative: JSON may nest deeper than
    Python's recursion limit, and Triton reads any depth. An array of scalars is taken whole."""
    flat: list = []
    levels: list[list] = [[data, 0]]   # [an array, where to go on reading it]
    while levels:
        level = levels[-1]
        array, start = level
        if start == 0:
            arrays = sum(isinstance(v, list) for v in array)
            if not arrays:
                flat.extend(array)
                levels.pop()
                continue
            if ragged is not None and arrays != len(array):
                raise ragged
        for position in range(start, len(array)):
            item = array[position]
            if isinstance(item, list):
                level[1] = position + 1
                levels.append([item, 0])
                break
            flat.append(item)
        else:
            levels.pop()
    return flat


# -- responses --------------------------------------------------------------------------

def encode_infer_response(result: InferResult, requested: list[RequestedOutput] | None,
                          binary_default: bool) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """(headers, body) of a successful inference response. ``binary_default`` (the request's
    ``binary_data_output``) applies to the outputs the request did not name, as in Triton: a named
    output is binary only if its own ``binary_data`` says so."""
    wanted = {o.name: o.parameters for o in requested} if requested else {}
    outputs: list[dict[str, object]] = []
    chunks: list[bytes | memoryview] = []
    for output in result.outputs:
        parameters = wanted.get(output.name)
        entry: dict[str, object] = {"name": output.name, "datatype": output.datatype, "shape": output.shape}
        if output.in_shared_memory:  # name, datatype and shape only, as in Triton
            outputs.append(entry)
            continue
        if binary_default if parameters is None else parameters.get("binary_data", False):
            data = output.data
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = output_to_json(output.name, output.datatype, output.data)
        outputs.append(entry)
    document: dict[str, object] = {}
    if result.id:
        document["id"] = result.id
    document["model_name"] = result.model
    document["model_version"] = str(result.version)
    if result.parameters:
        document["parameters"] = result.parameters
    document["outputs"] = outputs
    header = orjson.dumps(document, option=_JSON_OPTIONS)
    if not any(len(chunk) for chunk in chunks):   # only empty outputs: plain JSON, as from Triton
        return [(b"content-type", b"application/json")], header
    body = b"".join([header, *chunks])
    return [(b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(len(header)).encode())], body


def output_to_json(name: str, datatype: str, data: bytes | memoryview) -> list | np.ndarray:
    dt = datatypes.BY_NAME[datatype]   # the worker's output names a datatype of the table
    if not dt.json_allowed or dt.numpy is None:   # (every datatype numpy lacks is one JSON cannot carry)
        raise InvalidArgument(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            f"format for output {name}")
    if dt.is_bytes:
        items: list[str] = []
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            (length,) = _LENGTH.unpack_from(view, offset)
            raw = bytes(view[offset + 4:offset + 4 + length])
            offset += 4 + length
            try:
                items.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidArgument(
                    f"output '{name}' holds bytes that are not UTF-8, which JSON cannot carry; "
                    "request it with binary_data") from exc
        return items
    array = np.frombuffer(data, dtype=dt.numpy)
    if dt.name == "FP32":  # Triton writes each float as the double it widens to
        array = array.astype(np.float64)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return _with_non_finite(array)
    return array


_NON_FINITE = {"nan": orjson.Fragment(b"NaN"), "inf": orjson.Fragment(b"Infinity"),
               "-inf": orjson.Fragment(b"-Infinity")}


def _with_non_finite(array: np.ndarray) -> list:
    """Floats as Triton writes them, NaN and the infinities as the tokens its JSON writer allows
    (not valid JSON, but what Python's json, and so tritonclient, reads back; orjson would write null)."""
    return [value if math.isfinite(value) else _NON_FINITE[repr(value)] for value in array.tolist()]
