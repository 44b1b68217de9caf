"""Triton's header forwarding (``--http-header-forward-pattern``, ``--grpc-header-forward-pattern``):
the headers of an inference request whose names match the pattern become string parameters of
the request, which the model reads (``request.parameters()`` in a Python model).

As in Triton, the pattern matches anywhere in the name and ignores case (Triton puts ``(?i)``
before it and asks RE2 for a partial match), and names keep the case the client sent. A
header that names one of the parameters Triton reads itself (``priority``, ``sequence_id``...)
is refused, as later Triton releases do: 2.51 passed it on as a string, which here would
reach the scheduler. A forwarded header replaces a parameter of the same name given in the
request itself, which is what a model reading Triton's parameters as JSON sees (Triton keeps
both, the header's last).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable

from tritium.errors import InvalidArgument

# Parameters Triton reads itself, which no header may set.
RESERVED = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"))


_CASE_SENSITIVE = "(?-i)"


def compile_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """The flag's pattern, ready to match header names; None when forwarding is off. re.error
    for a pattern that is not a regular expression. Triton's own tests turn the case back on
    with a leading ``(?-i)``, which RE2 takes after Triton's ``(?i)`` and Python's ``re`` does
    not take at all: such a pattern is matched as it is, case included."""
    if not pattern:
        return None
    if pattern.startswith(_CASE_SENSITIVE):
        return re.compile(pattern[len(_CASE_SENSITIVE):])
    return re.compile(pattern, re.IGNORECASE)


def forwarded_http_headers(pattern: re.Pattern[str], lines: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The parameters a request's header lines give it (values read as UTF-8)."""
    found = {}
    for raw_name, value in lines:
        name = raw_name.decode("latin-1")
        if _forwards(pattern, name):
            found[name] = value.decode("utf-8", "replace")
    return found


def binary_metadata_value(name: str, value: bytes) -> bytes:
    """A ``-bin`` metadata value as sent (base64, its padding optional) decoded; InvalidArgument
    when it is not base64, a client's mistake."""
    try:
        return base64.b64decode(value + b"==")
    except binascii.Error:
        raise InvalidArgument(f"metadata '{name}' is not valid base64") from None


def forwarded_grpc_metadata(pattern: re.Pattern[str],
                            metadata: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, str]:
    """The parameters a call's metadata gives it, a ``-bin`` value base64-decoded as gRPC hands it
    to Triton: pairs of bytes as tritium's server reads them (a ``-bin`` value still in base64),
    or grpc.aio's (str, and str or the decoded bytes)."""
    found = {}
    for raw_name, value in metadata:
        name = raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name
        if not _forwards(pattern, name):
            continue
        if isinstance(raw_name, bytes) and name.endswith("-bin") and isinstance(value, bytes):
            value = binary_metadata_value(name, value)
        found[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return found


def _forwards(pattern: re.Pattern[str], name: str) -> bool:
    """Whether the header ``name`` becomes a parameter; InvalidArgument for a reserved name."""
    if pattern.search(name) is None:
        return False
    if name in RESERVED or name.startswith("triton_"):
        raise InvalidArgument(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
    return True
