"""Triton's core checks of a request's inputs, with its messages: their names (which inputs a
model declares, which it requires, which the request gave), datatypes and shapes. Shared by the
gateway (clients' requests) and the broker (models' BLS calls)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

from tritium.datatypes import BY_CONFIG_NAME
from tritium.errors import InvalidArgument
from tritium.model_config_proto import model_config_pb2


class DeclaredInput(NamedTuple):
    """An input as the model's config declares it."""
    datatype: str             # protocol name, e.g. "FP32"
    dims: tuple[int, ...]     # without the batch dimension
    optional: bool


def check_inputs(model: str, declared: Mapping[str, DeclaredInput], max_batch_size: int,
                 given: Sequence[tuple[str, str, Sequence[int]]], runs_without_inputs: bool = False) -> int:
    """The (name, datatype, shape) of each input given, as Triton's core checks them and in its
    order (names; the batch dimension of every input, then the batch size; then each input's
    datatype and shape), inputs in Triton's order: its core holds them in a hash map, which
    gives a few inputs (up to 13, in distinct buckets) in the reverse of the order the request
    lists them (checked with Triton 2.51). Returns the batch size. ``runs_without_inputs``: the
    model's scheduler gives its requests inputs of its own (sequence controls, implicit state) or it
    is an ensemble, so a batching model given none runs as a batch of one."""
    check_input_names(model, declared, [name for name, spec in declared.items() if not spec.optional],
                      [name for name, _, _ in given])
    ordered = given[::-1]
    batching = max_batch_size > 0
    if batching and not given and not runs_without_inputs:   # Triton's backend reads the batch from input 0
        raise InvalidArgument("out of bounds index 0: request has 0 inputs")
    batch_size = _batch_size(model, max_batch_size, ordered) if batching and given else 1
    for name, datatype, shape in ordered:
        spec = declared[name]
        check_datatype(model, name, datatype, spec.datatype)
        check_shape(model, name, spec.dims, batching, shape)
    if batching and batch_size == 0:   # Triton refuses it too (as a byte size mismatch)
        raise InvalidArgument(f"inference request batch-size must be >= 1 for '{model}'")
    return batch_size


def declared_inputs(config: model_config_pb2.ModelConfig) -> dict[str, DeclaredInput]:
    """A config's inputs, as ``check_inputs`` takes them."""
    return {t.name: DeclaredInput(_datatype_name(t.data_type), tuple(t.dims), t.optional) for t in config.input}


def _datatype_name(data_type: int) -> str:
    """The protocol name ("FP32") of a config's data type; an unknown one as the config names it
    (a config that loads has none)."""
    config_name = model_config_pb2.DataType.Name(data_type)
    known = BY_CONFIG_NAME.get(config_name)
    return known.name if known is not None else config_name


def unexpected_output(model: str, name: str) -> InvalidArgument:
    """A requested output the model does not have, in Triton's words (they name no request)."""
    return InvalidArgument(f"unexpected inference output '{name}' for model '{model}'")


def runs_without_inputs(platform: str, control_inputs: int, states: int) -> bool:
    """Whether a request given no inputs still reaches its model with some (``check_inputs``)."""
    return platform == "ensemble" or control_inputs > 0 or states > 0


def _batch_size(model: str, max_batch_size: int, given: Sequence[tuple[str, str, Sequence[int]]]) -> int:
    batch_size = -1
    for name, _, shape in given:
        if not shape:
            raise InvalidArgument(f"input '{name}' has no shape but model requires batch dimension for '{model}'")
        if batch_size < 0:
            batch_size = shape[0]
        elif shape[0] != batch_size:
            raise InvalidArgument(f"input '{name}' batch size does not match other inputs for '{model}'")
    if batch_size > max_batch_size:
        raise InvalidArgument(f"inference request batch-size must be <= {max_batch_size} for '{model}'")
    return batch_size


def check_input_names(model: str, declared: Collection[str], required: Sequence[str], given: Sequence[str]) -> None:
    """InvalidArgument as Triton's core words it: too few or too many inputs (counted before their
    names are looked at), one the model does not declare, one given twice, one required missing."""
    if not len(required) <= len(given) <= len(declared):
        raise _missing(model, declared, required, given)
    seen = set()
    for name in given:
        if name not in declared:
            raise InvalidArgument(f"unexpected inference input '{name}' for model '{model}'")
        if name in seen:
            raise InvalidArgument(f"input '{name}' already exists in request")   # (Triton's words)
        seen.add(name)
    if any(name not in seen for name in required):
        raise _missing(model, declared, required, given)


def _missing(model: str, declared: Collection[str], required: Sequence[str], given: Sequence[str]) -> InvalidArgument:
    missing = [name for name in required if name not in given]
    if len(required) == len(declared):
        expected = f"expected {len(required)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(declared)}"
    return InvalidArgument(
        f"{expected} but got {len(given)} inputs for model '{model}'. Got input(s) {_names(given[::-1], '[]')}, "
        f"but missing required input(s) {_names(missing, ']')}. Please provide all required input(s).")


def _names(names: Sequence[str], none: str) -> str:
    """As Triton's core lists them (the given inputs in its hash map's order, see check_inputs),
    ``none`` when there are none: its list of missing inputs then loses its "[" (2.51: "... missing
    required input(s) ]. Please ...")."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]" if names else none


def check_datatype(model: str, name: str, given: str, expected: str) -> None:
    if given != expected:
        raise InvalidArgument(f"inference input '{name}' data-type is '{given}', but model '{model}' expects '{expected}'")


def check_shape(model: str, name: str, dims: Sequence[int], batching: bool, shape: Sequence[int]) -> int:
    """Check ``shape`` against the config's ``dims``; the request's batch size for the input."""
    given = shape[1:] if batching else shape
    ok = (not batching or len(shape) >= 1) and len(given) == len(dims) and all(
        want == -1 or want == got for want, got in zip(dims, given))
    if not ok:
        expected = ([-1] if batching else []) + list(dims)
        note = ""   # (Triton's message ends with the space before it, note or not)
        if batching:
            note = ("NOTE: Setting a non-zero max_batch_size in the model config requires a "
                    "batch dimension to be prepended to each input shape. If you want to specify "
                    "the full shape including the batch dim in your input dims config, try "
                    "setting max_batch_size to zero. See the model configuration docs for more "
                    "info on max_batch_size.")
        raise InvalidArgument(
            f"unexpected shape for input '{name}' for model '{model}'. Expected "
            f"{_shape(expected)}, got {_shape(shape)}. {note}")
    return shape[0] if batching else 1


def _shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
