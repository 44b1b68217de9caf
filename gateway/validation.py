"""Checks of an inference request against the model's config, with Triton's messages.

Everything here runs before a request is queued, so that a bad request costs the
broker and the instances nothing.
"""

from __future__ import annotations

import struct

from tritium.gateway.inference import InferRequest, RequestedOutput
from tritium.gateway.model_table import ModelSpec, TensorSpec
from tritium.errors import InvalidArgument, Unsupported
from tritium.input_checks import check_inputs

_LENGTH = struct.Struct("<I")


def validate_inputs(spec: ModelSpec, request: InferRequest) -> int:
    """The inputs, as Triton's core checks them (its errors name the request); the batch size.

    What makes inputs valid is their names, datatypes, shapes and sizes (BYTES aside, whose
    elements are counted in their data): the model remembers those it found valid, as a
    client sends the same again and again."""
    key = tuple([(tensor.name, tensor.datatype, tuple(tensor.shape), len(tensor.data)) for tensor in request.inputs])
    valid = spec.valid_inputs
    batch_size = valid.get(key)
    if batch_size is None:
        batch_size = _validate_inputs(spec, request)
        if not any(tensor.datatype == "BYTES" for tensor in request.inputs):
            if len(valid) >= _VALID_INPUTS_KEPT:
                valid.clear()
            valid[key] = batch_size
    return batch_size


_VALID_INPUTS_KEPT = 256


def _validate_inputs(spec: ModelSpec, request: InferRequest) -> int:
    inputs = request.inputs
    batch_size = check_inputs(spec.name, spec.declared_inputs, spec.max_batch_size,
                              [(tensor.name, tensor.datatype, tensor.shape) for tensor in inputs])
    for tensor in inputs:
        _check_data_size(spec.name, spec.inputs[tensor.name], tensor.name, tensor.shape, tensor.data)
    return batch_size


def check_requested_outputs(spec: ModelSpec, request: InferRequest) -> None:
    """The outputs asked for exist (Triton's error does not name the request); one named twice
    is answered once, as by Triton."""
    if request.outputs is None:
        return
    named: dict[str, RequestedOutput] = {}
    for output in request.outputs:
        if output.name not in spec.outputs:
            raise InvalidArgument(f"unexpected inference output '{output.name}' for model '{spec.name}'")
        named.setdefault(output.name, output)
    if len(named) < len(request.outputs):
        request.outputs = list(named.values())


def check_single_response(spec: ModelSpec, front_end_message: str) -> None:
    """Decoupled models answer 0..N times: only streaming front ends can carry that (501)."""
    if spec.decoupled:
        raise Unsupported(front_end_message)


def element_count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _check_data_size(model: str, config: TensorSpec, name: str, shape: list[int], data) -> None:
    expected_elements = element_count(shape)
    if config.datatype.is_bytes:
        found = count_bytes_elements(data, name, model)
        if found != expected_elements:
            raise InvalidArgument(
                f"expected {expected_elements} string elements for inference input '{name}' "
                f"for model '{model}', got {found}")
        return
    expected = expected_elements * config.datatype.itemsize
    if len(data) != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
            f"{expected}, got {len(data)}")


def count_bytes_elements(data, name: str, model: str) -> int:
    """Elements of a length-prefixed BYTES tensor; malformed framing is a 400."""
    view = memoryview(data)
    offset, end, count = 0, len(view), 0
    while offset < end:
        if offset + 4 > end:
            raise InvalidArgument(
                f"BYTES input '{name}' for model '{model}' ends inside an element length prefix")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4 + length
        if offset > end:
            raise InvalidArgument(
                f"BYTES input '{name}' for model '{model}' has an element of {length} bytes that "
                "runs past the end of the data")
        count += 1
    return count
