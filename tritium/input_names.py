"""Triton's core check of a request's inputs by name, with its messages: which inputs a model
declares, which it requires, which the request gave. Shared by the gateway (clients' requests)
and the broker (models' BLS calls)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tritium.errors import InvalidArgument


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
            raise InvalidArgument(f"input '{name}' is given more than once for model '{model}'")
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
        f"{expected} but got {len(given)} inputs for model '{model}'. Got input(s) {_names(given)}, but "
        f"missing required input(s) {_names(missing)}. Please provide all required input(s).")


def _names(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
