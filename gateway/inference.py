"""Inference requests and results as the data plane sees them, free of any transport."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: bytes | memoryview      # little-endian row-major bytes; BYTES length-prefixed


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model: str
    version: str | None
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None = None   # None: all outputs
    id: str = ""
    parameters: dict = field(default_factory=dict)


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: object                  # a buffer: bytes, memoryview or zmq frame buffer


@dataclass(slots=True)
class InferResult:
    model: str
    version: int
    id: str
    outputs: list[OutputTensor]
    parameters: dict = field(default_factory=dict)
