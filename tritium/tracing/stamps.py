"""The timestamps a traced request collects on its way, and how they ride the wire.

Only traced requests carry any of this (an INFER with ``tr``); the rest pay one dict
lookup. Each process stamps with its own ``CLOCK_MONOTONIC`` and says where it runs
(``at``: host, pid, and the offset of its wall clock from its monotonic clock). On one host
every process shares that clock, so stamps need no conversion; a stamp made on another
host is moved onto the gateway's timeline through the two hosts' wall clocks (kept in
step by NTP or PTP), which is what the offsets are for.

Wire (all optional header fields; docs/observability.md says what each stamp means):

- INFER ``tr``: 24 bytes, the request's trace id (16) and its model span's id (8).
- BATCH ``tr``: ``{"at": place, "r": {index: [queue_start_ns, compute_start_ns]}}``, the
  broker's stamps for the traced requests of the batch.
- RESPONSE ``tr``: ``{"at": {role: place}, "ts": [[name, ns, role], ...], "batch": {...},
  "steps": [...]}``: every stamp made after the gateway, from the instance (or, for an
  ensemble, from the broker), with the record of each ensemble step or BLS call made with
  the request's trace in ``steps``; a decoupled model's on the request's final response.
"""

from __future__ import annotations

import os
import socket
import time

import msgspec

from tritium.protocol import Infer, read_record

REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"
INFER_RESPONSE_COMPLETE = "INFER_RESPONSE_COMPLETE"


def place(label: str = "") -> list:
    """Where this process runs: [host, pid, wall clock minus monotonic clock (ns), label]."""
    return [socket.gethostname(), os.getpid(), time.time_ns() - time.monotonic_ns(), label]


_BROKER_PLACE: list | None = None


def _broker_place() -> list:
    global _BROKER_PLACE
    if _BROKER_PLACE is None:
        _BROKER_PLACE = place("broker")
    return _BROKER_PLACE


# -- broker ----------------------------------------------------------------------------------

def batch_stamps(requests) -> dict | None:
    """The BATCH header's ``tr`` for the traced requests among ``requests`` (COMPUTE_START: now,
    as the batch leaves); None when there are none."""
    traced = [index for index, request in enumerate(requests) if request.traced]
    if not traced:
        return None
    now = time.monotonic_ns()
    return {"at": _broker_place(), "r": {index: [requests[index].arrival_ns, now] for index in traced}}


def step_context(parent: bytes) -> bytes:
    """The context of an ensemble step's request: the ensemble's trace, a span of its own."""
    return parent[:16] + os.urandom(8)


def ensemble_record(arrival_ns: int, now: int, steps: list) -> dict:
    """The RESPONSE ``tr`` of an ensemble: the broker's stamps and each step's record."""
    return {"at": {"broker": _broker_place()}, "steps": steps,
            "ts": [[REQUEST_START, arrival_ns, "broker"], [QUEUE_START, arrival_ns, "broker"],
                   [REQUEST_END, now, "broker"]]}


def step_record(model: str, call: tuple[bytes, int], record: dict | None, now: int,
                role: str = "broker", tensors: tuple[list, list] | None = None) -> dict:
    """One ensemble step's (or BLS call's) record (``call``: its context and model version), its
    REQUEST_END the caller's receipt of its answer (``role``: the broker's, or the calling instance's);
    ``tensors``: the records of its inputs and outputs (trace level TENSORS)."""
    step = dict(record or {"at": {}, "ts": []}, m=model, v=call[1], ctx=call[0])
    step["at"] = dict(step["at"], **{role: _broker_place() if role == "broker" else _instance_place()})
    step["ts"] = [*step["ts"], [REQUEST_END, now, role]]
    if tensors is not None:
        step["inputs"], step["outputs"] = tensors
    return step


# -- instance --------------------------------------------------------------------------------

_INSTANCE_PLACE: list | None = None


def _instance_place(label: str = "") -> list:
    global _INSTANCE_PLACE
    if _INSTANCE_PLACE is None:
        _INSTANCE_PLACE = place(label)
    return _INSTANCE_PLACE


class CallTrace:
    """A traced request as its model sees it (``request.trace()``): the models it calls (BLS)
    with ``trace=request.trace()`` become children of its trace, as in Triton."""

    __slots__ = ("context", "tensors", "calls")

    def __init__(self, context: bytes, tensors: bool = False) -> None:
        self.context = context
        self.tensors = tensors   # trace level TENSORS: its calls' inputs and outputs are recorded
        self.calls: list[dict] = []

    def call_context(self) -> bytes:
        return step_context(self.context)

    def call_done(self, model: str, version: int, context: bytes, record: dict | None,
                  tensors: tuple[list, list] | None = None) -> None:
        self.calls.append(step_record(model, (context, version), record, time.monotonic_ns(), "instance", tensors))


def stamped_responses(parts: list, external_counts: list, requests: list[Infer], batch: dict, number: int,
                      times: tuple[int, int, int], label: str, calls: list | None = None) -> list:
    """``parts`` (the RESPONSE records of a batch, each followed by its external frames) with
    the stamps of every traced request added to its RESPONSE header; the others untouched.
    ``calls``: per request, the records of the BLS calls it made (None: none)."""
    here = _instance_place(label)
    input_end, output_start, end = times
    traced = {int(index): stamps for index, stamps in batch["r"].items()}
    links = [requests[index].trace for index in sorted(traced) if requests[index].trace is not None]
    rows = sum(request.batch_size or 1 for request in requests)
    first = min(traced)
    parts = list(parts)
    position = 0
    for index, external_count in enumerate(external_counts):
        if index in traced:
            queued, dispatched = traced[index]
            response, view, offset = read_record(parts[position])
            stamps = {
                "at": {"broker": batch["at"], "instance": here},
                "ts": _request_stamps(queued, dispatched, input_end, output_start, end),
                "batch": {"id": number, "requests": len(requests), "size": rows,
                          "links": links if index == first else None}}
            if calls and calls[index]:
                stamps["steps"] = calls[index]
            parts[position] = msgspec.structs.replace(response, trace=stamps).encode((view[offset:],))
        position += 1 + external_count
    return parts


def stream_stamps(broker_at: list, stamps: list, number: int, requests: int, input_end: int, label: str) -> dict:
    """The RESPONSE ``tr`` of a decoupled model's traced request, on its final response: the
    broker's stamps (``stamps``: [queue_start_ns, compute_start_ns]), its batch's inputs ready at
    ``input_end``, and its model done with it now (COMPUTE_OUTPUT_START and COMPUTE_END: the final
    response left)."""
    queued, dispatched = stamps
    now = time.monotonic_ns()
    return {"at": {"broker": broker_at, "instance": _instance_place(label)},
            "ts": _request_stamps(queued, dispatched, input_end, now, now),
            "batch": {"id": number, "requests": requests, "size": requests, "links": None}}


def _request_stamps(queued: int, dispatched: int, input_end: int, output_start: int, end: int) -> list:
    """A request's stamps from its arrival at the broker to its model done with it."""
    return [[REQUEST_START, queued, "broker"], [QUEUE_START, queued, "broker"],
            [COMPUTE_START, dispatched, "broker"], [COMPUTE_INPUT_END, input_end, "instance"],
            [COMPUTE_OUTPUT_START, output_start, "instance"], [COMPUTE_END, end, "instance"]]
