"""Checks of an inference request against the model's config, with Triton's messages.

Everything here runs before a request is queued, so that a bad request costs the
broker and the instances nothing.
"""

from __future__ import annotations

import struct

from tritium.gateway.inference import InferRequest, RequestedOutput
from tritium.gateway.model_table import ModelSpec, TensorSpec
from tritium.errors import InvalidArgument, Unsupported
from tritium.input_checks import check_inputs, unexpected_output

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
                              [(tensor.name, tensor.datatype, tensor.shape) for tensor in inputs], spec.runs_without_inputs)
    for tensor in reversed(inputs):   # in Triton's order, as check_inputs
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
            raise unexpected_output(spec.name, output.name)
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
        check_bytes_elements(data, name, model, expected_elements)
        return
    expected = expected_elements * config.datatype.itemsize
    if len(data) != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
            f"{expected}, got {len(data)}")


def check_bytes_elements(data, name: str, model: str, expected: int) -> None:
    """A BYTES tensor's length-prefixed elements, refused as Triton refuses them: its core counts
    the elements (stopping at one too many) and takes an element running past the end as the
    rest of the data; then its backend finds that element short (an error without the request)."""
    view = memoryview(data)
    offset, end, count = 0, len(view), 0
    short: tuple[int, int] | None = None   # (an element's length, the bytes there were for it)
    while offset < end:
        if end - offset < 4:
            raise InvalidArgument(
                f"incomplete string length indicator for inference input '{name}' for model '{model}', "
                f"expecting 4 bytes but only {end - offset} bytes available. Please make sure the string "
                "length indicator is in one buffer.")
        (length,) = _LENGTH.unpack_from(view, offset)
        count += 1
        if count > expected:
            raise InvalidArgument(f"unexpected number of string elements {count} for inference input '{name}' "
                                  f"for model '{model}', expecting {expected}")
        offset += 4
        if length > end - offset:
            short, offset = (length, end - offset), end
        else:
            offset += length
    if count != expected:
        raise InvalidArgument(
            f"expected {expected} string elements for inference input '{name}' for model '{model}', got {count}")
    if short is not None:
        raise InvalidArgument(f"incomplete string data for inference input '{name}', expecting string of length "
                              f"{short[0]} but only {short[1]} bytes available")
