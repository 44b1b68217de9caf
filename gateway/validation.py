"""Checks of an inference request against the model's config, with Triton's messages.

Everything here runs before a request is queued, so that a bad request costs the
broker and the instances nothing.
"""

from __future__ import annotations

import struct

from tritium.gateway.inference import InferRequest, RequestedOutput
from tritium.gateway.model_table import ModelSpec, TensorSpec
from tritium.errors import InvalidArgument, Unsupported
from tritium.input_names import check_input_names

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
    model = spec.name
    check_input_names(model, spec.inputs, spec.required_inputs, [tensor.name for tensor in request.inputs])
    batch_size = 1
    for index, tensor in enumerate(request.inputs):
        config = spec.inputs[tensor.name]
        if tensor.datatype != config.datatype.name:
            raise InvalidArgument(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{model}' expects '{config.datatype.name}'")
        size = _check_shape(spec, config, tensor.shape)
        if spec.max_batch_size > 0:
            if index == 0:
                batch_size = size
            elif size != batch_size:
                raise InvalidArgument(
                    f"input '{tensor.name}' batch size does not match other inputs for '{model}'")
        _check_data_size(model, config, tensor.name, tensor.shape, tensor.data)
    if spec.max_batch_size > 0 and batch_size == 0:   # Triton refuses it too (as a byte size mismatch)
        raise InvalidArgument(f"inference request batch-size must be >= 1 for '{model}'")
    if spec.max_batch_size > 0 and batch_size > spec.max_batch_size:
        raise InvalidArgument(
            f"inference request batch-size must be <= {spec.max_batch_size} for '{model}'")
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


def _check_shape(spec: ModelSpec, config: TensorSpec, shape: list[int]) -> int:
    """Check ``shape`` against the config dims; return the request's batch size for the input."""
    batching = spec.max_batch_size > 0
    dims = shape[1:] if batching else shape
    ok = (not batching or len(shape) >= 1) and len(dims) == len(config.dims) and all(
        want == -1 or want == got for want, got in zip(config.dims, dims))
    if not ok:
        expected = ([-1] if batching else []) + list(config.dims)
        note = ""
        if batching:
            note = (" NOTE: Setting a non-zero max_batch_size in the model config requires a "
                    "batch dimension to be prepended to each input shape. If you want to specify "
                    "the full shape including the batch dim in your input dims config, try "
                    "setting max_batch_size to zero. See the model configuration docs for more "
                    "info on max_batch_size.")
        raise InvalidArgument(
            f"unexpected shape for input '{config.name}' for model '{spec.name}'. Expected "
            f"{_shape(expected)}, got {_shape(shape)}.{note}")
    return shape[0] if batching else 1


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


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
