"""Inference requests and results as the data plane sees them, free of any transport."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tritium.gateway.shared_memory import SharedMemoryRef

if TYPE_CHECKING:
    from tritium.gateway.tracing import RequestTrace


class InputTensor(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview      # little-endian row-major bytes; BYTES length-prefixed
    shared_memory: SharedMemoryRef | None = None   # the data is there instead (read by the data plane)


class RequestedOutput(msgspec.Struct):
    name: str
    parameters: dict = msgspec.field(default_factory=dict)
    shared_memory: SharedMemoryRef | None = None   # write the result there, not in the response
    classification: int | None = None              # the top-k classes instead of the values
    region: object = None   # the open region shared_memory names, held from the request's start


class InferRequest(msgspec.Struct):
    model: str
    version: str | None
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None = None   # None: all outputs
    id: str = ""
    parameters: dict = msgspec.field(default_factory=dict)
    sequence_id: int | str = 0      # Triton's correlation id (0 or "": not in a sequence)
    sequence_flags: int = 0         # Triton's request flags: 1 START, 2 END
    traceparent: bytes | str | None = None   # the client's W3C trace context, read only while tracing is on
    trace: RequestTrace | None = None        # set when this request is traced


SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
# The request flag each parameter sets (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END).
SEQUENCE_FLAGS = {"sequence_start": 1, "sequence_end": 2}


class OutputTensor(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview      # a view of the broker's reply (a zmq frame's buffer), or bytes made here
    in_shared_memory: bool = False  # written to the client's region; the response carries no data


class InferResult(msgspec.Struct):
    model: str
    version: int
    id: str
    outputs: list[OutputTensor]
    parameters: dict = msgspec.field(default_factory=dict)
