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
import re
from collections.abc import Iterable

from tritium.errors import InvalidArgument

# Parameters Triton reads itself, which no header may set.
RESERVED = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"))


def compile_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """The flag's pattern, ready to match header names; None when forwarding is off. re.error
    for a pattern that is not a regular expression."""
    return re.compile(pattern, re.IGNORECASE) if pattern else None


def forwarded_headers(pattern: re.Pattern[str], headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The parameters ``headers`` (name, value) give the request; InvalidArgument for a reserved name."""
    found = {}
    for name, value in headers:
        if pattern.search(name) is None:
            continue
        if name in RESERVED or name.startswith("triton_"):
            raise InvalidArgument(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
        found[name] = value
    return found


def http_header_text(lines: Iterable[tuple[bytes, bytes]]) -> Iterable[tuple[str, str]]:
    """HTTP header lines as text (values read as UTF-8)."""
    for name, value in lines:
        yield name.decode("latin-1"), value.decode("utf-8", "replace")


def grpc_metadata_text(metadata: Iterable[tuple[bytes | str, bytes | str]]) -> Iterable[tuple[str, str]]:
    """gRPC metadata as text, a ``-bin`` value base64-decoded as gRPC hands it to Triton: pairs
    of bytes as tritium's server reads them, or grpc.aio's (str, str or decoded bytes)."""
    for name, value in metadata:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
            if name.endswith("-bin") and isinstance(value, bytes):
                value = base64.b64decode(value + b"==")
        yield name, value.decode("utf-8", "replace") if isinstance(value, bytes) else value
