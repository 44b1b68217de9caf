"""Triton's trace extension, the gateway's part: which requests are traced, their front-end
timestamps, and what becomes of a finished trace.

The settings are the broker's (pushed with the model table, seeded with this gateway's
``--trace-config``). A request is traced when its model's settings have a level, every
``rate``-th request, while ``count`` allows; an untraced request costs one attribute read.
A traced request's INFER carries its trace context, and its answer comes back with every
stamp the broker and the instance made (tritium/tracing/stamps.py); the gateway puts them
on its own timeline, then hands the trace to the broker for Triton's trace file, or exports
it as OpenTelemetry spans (gateway/trace_otel.py).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Protocol

from tritium.protocol import Control, Response, TraceDone, TraceSettingsQuery
from tritium.tracing.settings import TraceSettings
from tritium.tracing.stamps import INFER_RESPONSE_COMPLETE, REQUEST_END, place
from tritium.tracing.tensors import tensor_record

if TYPE_CHECKING:
    from tritium.gateway.http_server import Answer, HttpRequest, HttpResponse, Streaming
    from tritium.gateway.inference import InferRequest
    from tritium.gateway.trace_otel import OtelExporter

log = logging.getLogger(__name__)


class RequestTrace:
    """One traced request: its ids, the gateway's stamps, and the stamps that came back."""

    __slots__ = ("tracer", "model", "version", "mode", "trace_id", "request_span", "context", "parent",
                 "stamps", "remote", "timestamps", "tensors", "inputs", "outputs", "request_id", "completed",
                 "every_response", "ended")

    def __init__(self, tracer: "GatewayTracer", model: str, version: int, mode: str,
                 parent: tuple[bytes, bytes, int] | None, level: tuple[str, ...] = ("TIMESTAMPS",)) -> None:
        self.tracer, self.model, self.version, self.mode, self.parent = tracer, model, version, mode, parent
        self.trace_id = parent[0] if parent else os.urandom(16)
        self.request_span = os.urandom(8)                # the front end's span (InferRequest)
        self.context = self.trace_id + os.urandom(8)     # INFER ``tr``: the trace and the model's span
        self.stamps: list[list] = []
        self.remote: dict | None = None
        self.timestamps = "TIMESTAMPS" in level
        self.tensors = "TENSORS" in level and mode == "triton"   # (Triton's file only)
        self.inputs: list[dict] = []    # the tensors of the trace file's records (tritium/tracing/tensors.py)
        self.outputs: list[dict] = []
        self.request_id = ""            # the client's, which the trace file names
        self.completed = False          # its first response came (INFER_RESPONSE_COMPLETE)
        self.every_response = False     # each response is an INFER_RESPONSE_COMPLETE (``/generate_stream``'s)
        self.ended = False              # finished: sent on, what comes later is not its own

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append([name, ns or time.monotonic_ns(), "gateway"])

    def answered(self, response: Response) -> None:
        """A RESPONSE arrived (of a streamed request: each of them): keep the stamps it carries.
        The first is the request's INFER_RESPONSE_COMPLETE, as in Triton (on ``/generate_stream``,
        each, the flags-only final one too); the final one ends it. Responses still on their way
        when the client gave the request up (its trace already finished) are not recorded."""
        if self.ended:
            return
        now = time.monotonic_ns()
        if response.trace is not None:
            self.remote = response.trace
        if not self.completed or self.every_response:
            self.completed = True
            self.stamps.append([INFER_RESPONSE_COMPLETE, now, "gateway"])
        if response.final is not False and (
                self.remote is None or not any(stamp[0] == REQUEST_END for stamp in self.remote["ts"])):
            self.stamps.append([REQUEST_END, now, "gateway"])

    def tree(self) -> dict:
        """The request and its ensemble steps, every stamp on this gateway's timeline."""
        root = _on_timeline(self.remote or {"at": {}, "ts": []}, self.tracer.here)
        root.update(m=self.model, v=self.version, ctx=self.context)
        if self.request_id:
            root["rid"] = self.request_id
        root["ts"] = sorted(self.stamps + root["ts"], key=lambda stamp: stamp[1])
        if self.tensors:
            root.update(inputs=self.inputs, outputs=self.outputs)
        if not self.timestamps:
            root["stamps"] = False   # the file gets its tensors only, as Triton writes it
        return root

    def record_tensors(self, inputs: bool, tensors) -> None:
        """Keep ``tensors`` (the request's inputs, or one response's outputs: (name, datatype, shape,
        data) of each) for the trace file; a tensor that cannot be written costs the trace its
        tensors, never the request its answer."""
        if self.ended:
            return
        try:
            records = [tensor_record(t.name, t.datatype, t.shape, t.data) for t in tensors]
        except Exception:
            log.exception("the tensors of a traced request for model '%s' are not recorded", self.model)
            self.tensors = False
            return
        if inputs:
            self.inputs = records
        else:
            self.outputs.extend(records)   # a streamed request's: every response's, in order

    def finish(self) -> None:
        """Send the trace on, once."""
        if not self.ended:
            self.ended = True
            self.tracer.finished(self)


class GatewayTracer:
    """Samples requests with the broker's settings and sends finished traces on."""

    def __init__(self, link, startup: TraceSettings) -> None:
        self.link = link
        self.startup = startup
        self.here = place("gateway")
        self.on = False                    # any model traced at all: the one check an untraced request pays
        self._global = startup
        self._models: dict[str, TraceSettings] = {}
        self._revision: int | None = None
        self._seen: dict[str | None, int] = {}
        self._left: dict[str | None, int] = {}
        self._otel: OtelExporter | None = None
        self._apply_settings(startup, {})
        link.on_trace_settings = self.apply
        if startup.mode == "opentelemetry":
            self._exporter()   # a missing SDK stops startup, not the first traced request

    async def start(self) -> None:
        """Seed the broker with this gateway's startup settings (the first gateway's stay)."""
        await self.link.request(Control(self.link.next_rid(), TraceSettingsQuery(startup=self.startup.as_wire())))

    def apply(self, wire: dict | None) -> None:
        """Settings pushed by the broker; the same revision again changes nothing."""
        if wire is None or wire["revision"] == self._revision:
            return
        self._revision = wire["revision"]
        self._apply_settings(TraceSettings.from_wire(wire["global"]),
                             {model: TraceSettings.from_wire(values) for model, values in wire["models"].items()})

    def _apply_settings(self, settings: TraceSettings, models: dict[str, TraceSettings]) -> None:
        self._global, self._models = settings, models
        self._seen.clear()
        self._left.clear()
        self.on = settings.on or any(model.on for model in models.values())

    def sample(self, model: str, version: int, traceparent: bytes | str | None = None) -> RequestTrace | None:
        """A trace for this request, or None (Triton's rate: every rate-th request of the setting)."""
        settings = self._models.get(model)
        key = model if settings is not None else None
        settings = settings or self._global
        if not settings.on:
            return None
        seen = self._seen.get(key, 0) + 1
        self._seen[key] = seen
        if seen % settings.rate:
            return None
        left = self._left.get(key, settings.count)
        if left == 0:
            return None
        if left > 0:
            self._left[key] = left - 1
        return RequestTrace(self, model, version, settings.mode, parse_traceparent(traceparent), settings.level)

    def finished(self, trace: RequestTrace) -> None:
        """Export or hand over a finished trace; a failure costs the trace, never its request's answer."""
        exported = trace.mode == "opentelemetry"
        try:
            tree = trace.tree()
            if exported:
                self._exporter().export(trace, tree)
        except Exception:
            log.exception("trace of a request for model '%s' dropped", trace.model)
            return
        done = TraceDone(trace.model, None if exported else tree, self.startup.as_wire())
        self.link.request_then(Control(self.link.next_rid(), done), (), (), _ignore)

    def _exporter(self) -> OtelExporter:
        if self._otel is None:
            from tritium.gateway.trace_otel import OtelExporter

            self._otel = OtelExporter(self._global, self.here)
        return self._otel

    def close(self) -> None:
        if self._otel is not None:
            self._otel.close()


def _ignore(_reply) -> None:
    """A trace handed to the broker needs no answer."""


def _on_timeline(record: dict, here: list) -> dict:
    """``record`` (and its steps) with every stamp moved onto this process's clock: a stamp
    from this host already is; one from another host goes through the wall clocks."""
    shifts = {role: 0 if where[0] == here[0] else where[2] - here[2] for role, where in record["at"].items()}
    moved = dict(record)
    moved["ts"] = [[name, ns + shifts.get(role, 0), role] for name, ns, role in record["ts"]]
    if record.get("steps"):
        moved["steps"] = [_on_timeline(step, here) for step in record["steps"]]
    return moved


def parse_traceparent(value: bytes | str | None) -> tuple[bytes, bytes, int] | None:
    """W3C ``traceparent`` (version 00): (trace id, parent span id, flags), or None when absent or malformed."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    parts = text.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = bytes.fromhex(parts[1]), bytes.fromhex(parts[2]), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    return trace_id, span_id, flags


class Tracer(Protocol):
    """What the data plane asks of its tracer (a GatewayTracer, or NO_TRACING)."""

    on: bool
    startup: TraceSettings

    def sample(self, model: str, version: int, traceparent: bytes | str | None = None) -> RequestTrace | None: ...


class _NoTracing:
    """The tracer of a data plane started without one: nothing is traced."""

    on = False
    startup = TraceSettings()

    def sample(self, model: str, version: int, traceparent: bytes | str | None = None) -> None:
        return None   # never asked: ``on`` is false


NO_TRACING: Tracer = _NoTracing()


def traced_answer(trace: RequestTrace, request: HttpRequest, answer: Answer) -> Answer:
    """``answer`` for a traced HTTP request: the front end's stamps around the write, then the trace ends."""
    trace.stamp("HTTP_RECV_START", request.began_ns)
    trace.stamp("HTTP_RECV_END", request.received_ns)

    def send(response: HttpResponse | Streaming) -> None:
        trace.stamp("HTTP_SEND_START")
        answer(response)
        trace.stamp("HTTP_SEND_END")
        trace.finish()

    return send


def answer_if_sampled(infer_request: InferRequest, request: HttpRequest, answer: Answer) -> Answer:
    """``answer`` for an HTTP request that may be sampled once it is sent: whether it was is read
    when it is answered, as an answer can come from inside the call that sends it (broker lost)."""

    def send(response: HttpResponse | Streaming) -> None:
        trace = infer_request.trace
        (answer if trace is None else traced_answer(trace, request, answer))(response)

    return send
