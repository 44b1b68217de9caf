"""Triton's generate extension: flat JSON in and out, for ``/generate`` and ``/generate_stream``.

A request is one JSON object. A key naming one of the model's inputs becomes that input,
shaped to fit the input's dims (the fixed dims divide the element count, the innermost
variable dim takes the rest, the others 1; a batching model gets a batch of 1); any other key, and every key of a nested
``parameters`` object that is not an input, becomes a request parameter. A response is
one JSON object: ``model_name``, ``model_version``, ``id`` when the request had one, every
output under its name (one element as a scalar, more as a flat list), and every response
parameter under its name.
"""

from __future__ import annotations

import json

import orjson

from tritium.gateway.http_codec import flatten_json, json_to_bytes, output_to_json
from tritium.gateway.inference import InferRequest, InferResult, InputTensor
from tritium.gateway.model_table import ModelSpec, TensorSpec
from tritium.errors import InvalidArgument

SINGLE_RESPONSE_ONLY = ("generate expects model to produce exactly 1 response, use generate stream for model "
                        "that generates various number of responses")


def repeated_inputs(spec: ModelSpec, body: bytes) -> list[str]:
    """The inputs the body's top-level object names more than once, in order (its parsed object
    keeps one value of each, as JSON parsers do; Triton reads the keys in order and refuses a
    repeated input). The body is read again only when an input's quoted name occurs twice in it."""
    if b"\\u" not in body and not any(body.count(b'"' + name.encode() + b'"') > 1 for name in spec.inputs):
        return []   # (a key written with escapes, \u0049NPUT0, is read the slow way)
    return [key for key in _repeated_keys(body) if key in spec.inputs]


def _repeated_keys(body: bytes) -> list[str]:
    objects: list[list] = []

    def kept(pairs: list) -> dict:
        objects.append(pairs)
        return {}

    try:
        json.loads(body, object_pairs_hook=kept)
    except ValueError:
        return []
    seen: set[str] = set()
    repeated = []
    for key, _ in objects[-1] if objects else ():   # the last object closed is the top-level one
        if key in seen:
            repeated.append(key)
        seen.add(key)
    return repeated


def generate_request(spec: ModelSpec, version: str | None, document: dict, body: bytes = b"") -> InferRequest:
    """``document``: ``body`` parsed. Messages are Triton's."""
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("the request 'id' must be a string")
    for key in repeated_inputs(spec, body):   # found by Triton's core, which names the request
        raise InvalidArgument(f"[request id: {request_id or '<id_unknown>'}] input '{key}' already exists in request")
    inputs: list[InputTensor] = []
    parameters: dict = {}
    nested = document.get("parameters", {})
    if not isinstance(nested, dict):
        raise InvalidArgument("Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as "
                              "object")
    top = {k: v for k, v in document.items() if k not in ("id", "parameters")}
    for source, context in ((top, ""), (nested, "Converting keyword: 'parameters': ")):
        for key, value in source.items():
            tensor = spec.inputs.get(key)
            if tensor is not None:
                if any(given.name == key for given in inputs):
                    raise InvalidArgument(f"{context}input '{key}' already exists in request")
                inputs.append(_input(spec, tensor, value))
            elif isinstance(value, (str, int, float, bool)):
                parameters[key] = value
            else:
                raise InvalidArgument(
                    f"{context}parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
    return InferRequest(model=spec.name, version=version, inputs=inputs, id=request_id, parameters=parameters)


def _input(spec: ModelSpec, tensor: TensorSpec, value) -> InputTensor:
    """As Triton converts it: the top-level array's length is the element count, and nested
    arrays are read flat against it."""
    values = value if isinstance(value, list) else [value]
    shape = _shape(tensor.name, ([-1] if spec.max_batch_size > 0 else []) + list(tensor.dims), len(values))
    flat = flatten_json(values)
    datatype = tensor.datatype.name   # (an object is one element, whose type is wrong: Triton's words)
    if len(flat) != len(values) and datatype != "BYTES":   # (strings are counted later, by the core's words)
        raise InvalidArgument("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES" and not all(isinstance(v, str) for v in flat):
        raise InvalidArgument("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
    if datatype == "BOOL" and not all(isinstance(v, bool) for v in flat):
        raise InvalidArgument("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
    data = json_to_bytes(spec.name, tensor.name, datatype, shape, flat)
    return InputTensor(tensor.name, datatype, shape, data)


def _shape(name: str, dims: list[int], count: int) -> list[int]:
    """``dims`` (the batch dim included) filled for ``count`` elements, as Triton does: the fixed
    dims divide the count, the innermost variable dim takes what is left, the others 1."""
    left = count
    for d in dims:
        if d != -1:
            if d == 0 or left % d:
                raise InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= d
    shape = list(dims)
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], left = left, 1
    if left != 1:
        raise InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def generate_response(result: InferResult) -> bytes:
    document: dict[str, object] = {}
    if result.id:
        document["id"] = result.id
    document["model_name"] = result.model
    document["model_version"] = str(result.version)
    for output in result.outputs:
        values = output_to_json(output.name, output.datatype, output.data)
        document[output.name] = values[0] if len(values) == 1 else values
    document.update(result.parameters)
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)  # keys sorted, as Triton's
