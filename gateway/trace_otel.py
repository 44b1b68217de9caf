"""``--trace-config mode=opentelemetry``: a finished trace as OpenTelemetry spans, exported
over OTLP/HTTP by the SDK's batch span processor.

The gateway exports every span (it receives every timestamp), each saying which process
on which host did the work (``tritium.process``, ``host.name``, ``process.pid``). One trace
per request, the client's own when it sent a W3C ``traceparent``::

    InferRequest                  gateway: HTTP_* events
      <model>                     broker: REQUEST_START .. REQUEST_END
        queue                     broker: QUEUE_START .. COMPUTE_START
        batch                     broker: the batch it ran in, linked to every traced request of it
        compute                   instance: COMPUTE_START .. COMPUTE_END
        <step model> ...          an ensemble's steps, each the same shape

A batch span is exported once, under the first traced request of its batch.
"""

from __future__ import annotations

import time

from tritium.errors import Unsupported
from tritium.tracing.settings import DEFAULT_OTEL_URL, OTEL_MISSING, TraceSettings

# Imported by gateway/tracing.py only when a trace is exported this way: without the SDK,
# that import fails with the error that says which extra to install.
try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
except ImportError:  # the [otel] extra is not installed
    raise Unsupported(OTEL_MISSING) from None
from tritium.tracing.stamps import (
    COMPUTE_END,
    COMPUTE_START,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
)

_MODEL_EVENTS = (REQUEST_START, QUEUE_START, REQUEST_END)


class _PresetIds(RandomIdGenerator):
    """Random ids, except the next span's when it was chosen before (it went out on the wire)."""

    def __init__(self) -> None:
        self.next_span: int | None = None
        self.next_trace: int | None = None

    def generate_span_id(self) -> int:
        chosen, self.next_span = self.next_span, None
        return chosen if chosen is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        chosen, self.next_trace = self.next_trace, None
        return chosen if chosen is not None else super().generate_trace_id()


def resource_attributes(items: tuple[str, ...]) -> dict[str, str]:
    """``--trace-config opentelemetry,resource=KEY=VALUE[,KEY=VALUE]`` as attributes."""
    attributes = {"service.name": "triton"}
    for item in items:
        for pair in item.split(","):
            key, equals, value = pair.partition("=")
            if equals and key.strip():
                attributes[key.strip()] = value.strip()
    return attributes


class OtelExporter:
    def __init__(self, settings: TraceSettings, here: list) -> None:
        url = settings.url or DEFAULT_OTEL_URL
        self.ids = _PresetIds()
        self.provider = TracerProvider(resource=Resource.create(resource_attributes(settings.resource)),
                                       id_generator=self.ids, sampler=ALWAYS_ON)
        exporter = OTLPSpanExporter(endpoint=url if "://" in url else f"http://{url}")
        self.provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=settings.bsp_max_queue_size,
            schedule_delay_millis=settings.bsp_schedule_delay,
            max_export_batch_size=min(settings.bsp_max_export_batch_size, settings.bsp_max_queue_size)))
        self.tracer = self.provider.get_tracer("tritium")
        self.here = here

    def export(self, trace, tree: dict) -> None:
        """The spans of one finished request (``tree``: gateway/tracing.py ``RequestTrace.tree``)."""
        wall = time.time_ns() - time.monotonic_ns()
        stamps = tree["ts"]
        parent = None
        if trace.parent is not None:
            trace_id, span_id, flags = trace.parent
            remote = otel_trace.SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"),
                                            is_remote=True, trace_flags=otel_trace.TraceFlags(flags))
            parent = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(remote))
        self.ids.next_trace = int.from_bytes(trace.trace_id, "big")
        self.ids.next_span = int.from_bytes(trace.request_span, "big")
        request = self.tracer.start_span("InferRequest", context=parent, kind=otel_trace.SpanKind.SERVER,
                                         start_time=stamps[0][1] + wall, attributes=_where("gateway", self.here))
        for name, ns, role in stamps:
            if role == "gateway" and name != REQUEST_END:
                request.add_event(name, timestamp=ns + wall)
        self._model_span(tree, otel_trace.set_span_in_context(request), wall)
        request.end(stamps[-1][1] + wall)

    def _model_span(self, tree: dict, parent, wall: int) -> None:
        at = dict(tree.get("at") or {}, gateway=self.here)
        stamps = {name: (ns + wall, role) for name, ns, role in tree["ts"]}
        start, end = tree["ts"][0][1] + wall, tree["ts"][-1][1] + wall
        start = stamps.get(REQUEST_START, (start,))[0]
        end = stamps.get(REQUEST_END, (end,))[0]
        self.ids.next_span = int.from_bytes(tree["ctx"][16:], "big")
        span = self.tracer.start_span(tree["m"], context=parent, start_time=start, attributes={
            "triton.model_name": tree["m"], "triton.model_version": str(tree["v"]),
            **_where("broker", at.get("broker"))})
        for name in _MODEL_EVENTS:
            if name in stamps:
                span.add_event(name, timestamp=stamps[name][0])
        inside = otel_trace.set_span_in_context(span)
        self._phases(stamps, at, tree.get("batch"), inside)
        for step in tree.get("steps") or ():
            self._model_span(step, inside, wall)
        span.end(end)

    def _phases(self, stamps: dict, at: dict, batch: dict | None, parent) -> None:
        """queue, batch and compute: the spans inside a model's execution."""
        if QUEUE_START in stamps and COMPUTE_START in stamps:
            self._span("queue", parent, stamps[QUEUE_START][0], stamps[COMPUTE_START][0],
                       _where("broker", at.get("broker")))
        if COMPUTE_START not in stamps or COMPUTE_END not in stamps:
            return
        begin, end = stamps[COMPUTE_START][0], stamps[COMPUTE_END][0]
        if batch is not None and batch.get("links") is not None:
            links = [otel_trace.Link(otel_trace.SpanContext(
                int.from_bytes(context[:16], "big"), int.from_bytes(context[16:], "big"), is_remote=True,
                trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED))) for context in batch["links"]]
            self._span("batch", parent, begin, end, {
                "tritium.batch.id": batch["id"], "tritium.batch.requests": batch["requests"],
                "tritium.batch.size": batch["size"], **_where("broker", at.get("broker"))}, links)
        compute = self.tracer.start_span("compute", context=parent, start_time=begin,
                                         attributes=_where("instance", at.get("instance")))
        for name, (ns, role) in stamps.items():
            if name.startswith("COMPUTE_"):
                compute.add_event(name, timestamp=ns)
        compute.end(end)

    def _span(self, name: str, parent, start: int, end: int, attributes: dict, links=()) -> None:
        self.tracer.start_span(name, context=parent, start_time=start, attributes=attributes, links=links).end(end)

    def close(self) -> None:
        self.provider.shutdown()   # exports what is still queued


def _where(process: str, place: list | None) -> dict:
    """The attributes that say which process, on which host, did a span's work."""
    attributes = {"tritium.process": process}
    if place:
        attributes.update({"host.name": place[0], "process.pid": place[1]})
        if process == "instance" and place[3]:
            attributes["tritium.instance.model"] = place[3]
    return attributes
