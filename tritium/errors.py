"""The one error hierarchy, and its mapping to HTTP status and gRPC codes.

Errors cross process boundaries as ``{"code": <ErrorCode value>, "message": ...}``
in a wire header (see ``tritium.protocol``), never pickled; ``TritiumError.from_wire``
rebuilds them on the other side. The HTTP and gRPC mappings follow Triton's
``HttpCodeFromError`` (server 24.01 and later).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Triton's error codes, with the status each maps to on the two front ends."""

    UNKNOWN = 1
    INTERNAL = 2
    NOT_FOUND = 3
    INVALID_ARG = 4
    UNAVAILABLE = 5
    UNSUPPORTED = 6
    ALREADY_EXISTS = 7
    CANCELLED = 8

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @property
    def grpc_code_name(self) -> str:
        """Name of the ``grpc.StatusCode`` member (kept as a string so this module needs no grpc)."""
        return _GRPC_CODE[self]


_HTTP_STATUS = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
}

_GRPC_CODE = {
    ErrorCode.UNKNOWN: "UNKNOWN",
    ErrorCode.INTERNAL: "INTERNAL",
    ErrorCode.NOT_FOUND: "NOT_FOUND",
    ErrorCode.INVALID_ARG: "INVALID_ARGUMENT",
    ErrorCode.UNAVAILABLE: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    ErrorCode.CANCELLED: "CANCELLED",
}


class TritiumError(Exception):
    """Base of every error tritium reports to a client or across processes."""

    code: ErrorCode = ErrorCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return self.code.http_status

    def to_wire(self) -> dict:
        return {"code": int(self.code), "message": self.message}

    @staticmethod
    def from_wire(error: dict) -> "TritiumError":
        try:
            code = ErrorCode(error.get("code", ErrorCode.INTERNAL))
        except ValueError:
            code = ErrorCode.INTERNAL
        return error_for_code(code, str(error.get("message", "")))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidArgument(TritiumError):
    code = ErrorCode.INVALID_ARG


class NotFound(TritiumError):
    code = ErrorCode.NOT_FOUND


class Unavailable(TritiumError):
    code = ErrorCode.UNAVAILABLE


class Unsupported(TritiumError):
    code = ErrorCode.UNSUPPORTED


class InternalError(TritiumError):
    code = ErrorCode.INTERNAL


class AlreadyExists(TritiumError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(TritiumError):
    code = ErrorCode.CANCELLED

    @classmethod
    def by_client(cls) -> Cancelled:
        """What a request the client cancelled (or whose deadline passed) is answered with."""
        return cls("the client cancelled the request")

    @classmethod
    def with_its_sequence(cls) -> Cancelled:
        """What the other queued requests of a sequence whose request was cancelled are answered
        with (Triton's message is empty)."""
        return cls("cancelled with its sequence: another request of the sequence was cancelled")


class Restricted(Unavailable):
    """A call to an API restricted by --http-restricted-api or --grpc-restricted-protocol,
    without the header it needs. Triton answers it with 403 on HTTP, UNAVAILABLE on gRPC."""

    http_status = 403


class ProtocolError(InternalError):
    """A peer sent bytes that are not a valid tritium wire message."""


_BY_CODE: dict[ErrorCode, type[TritiumError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, Unavailable, Unsupported, InternalError,
                AlreadyExists, Cancelled)
}


def error_for_code(code: ErrorCode, message: str) -> TritiumError:
    return _BY_CODE.get(code, TritiumError)(message)
