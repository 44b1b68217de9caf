"""``--trace-config mode=opentelemetry``: a real server exports its spans over OTLP/HTTP to a
collector of this module's own (a small HTTP server decoding ExportTraceServiceRequest)."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.servers import TritiumServer, free_port

trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

MODELS = Path(__file__).parent / "ensemble_repo"
USED = ("pre", "double", "triple", "combine", "pipeline", "batch_probe")
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
GRPC_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Collector:
    """Spans received, as dicts: name, ids, parent, attributes, events, links, resource."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.receive(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, body: bytes) -> None:
        message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in message.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    with self.lock:
                        self.spans.append({
                            "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(), "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano, "resource": resource,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [e.name for e in span.events],
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links]})

    def trace(self, trace_id: str | set, count: int, timeout_s: float = 15) -> list[dict]:
        """The spans of one trace (or of a set of traces), once ``count`` of them arrived."""
        wanted = trace_id if isinstance(trace_id, set) else {trace_id}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                spans = [span for span in self.spans if span["trace"] in wanted]
            if len(spans) >= count:
                return spans
            time.sleep(0.05)
        raise AssertionError(f"{len(spans)} spans of trace {trace_id}, expected {count}: {spans}")

    def request_traces(self, model: str, count: int, timeout_s: float = 15) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                found = sorted({span["trace"] for span in self.spans if span["name"] == model})
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{len(found)} traces of {model}, expected {count}")


def _value(value):
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture(scope="module")
def collector():
    running = Collector()
    yield running
    running.server.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory, collector):
    repo = tmp_path_factory.mktemp("otel_repo")
    for name in USED:
        shutil.copytree(MODELS / name, repo / name)
    with TritiumServer(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                       "--trace-config", "rate=1", "--trace-config",
                       f"opentelemetry,url=127.0.0.1:{collector.port}/v1/traces",
                       "--trace-config", "opentelemetry,resource=service.name=tritium-test",
                       "--trace-config", "opentelemetry,bsp_schedule_delay=50", http_workers=1) as running:
        yield running


def by_name(spans: list[dict]) -> dict[str, list[dict]]:
    named: dict[str, list[dict]] = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    return named


def test_settings_in_opentelemetry_mode(server, collector):
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": f"127.0.0.1:{collector.port}/v1/traces", "resource": "service.name=tritium-test",
        "bsp_max_export_batch_size": "512", "bsp_schedule_delay": "50", "bsp_max_queue_size": "2048"}


def test_ensemble_continues_the_clients_trace(server, collector):
    tensor = httpclient.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    httpclient.InferenceServerClient(server.url).infer(
        "pipeline", [tensor], headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    # InferRequest, pipeline, and per step: the model, queue, batch, compute
    spans = by_name(collector.trace(CLIENT_TRACE, 2 + 4 * 4))
    request, = spans["InferRequest"]
    assert request["parent"] == CLIENT_SPAN
    assert request["attributes"]["tritium.process"] == "gateway"
    assert request["events"][:2] == ["HTTP_RECV_START", "HTTP_RECV_END"]
    assert request["events"][-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]
    assert request["resource"]["service.name"] == "tritium-test"
    ensemble, = spans["pipeline"]
    assert ensemble["parent"] == request["id"]
    assert ensemble["attributes"]["tritium.process"] == "broker"
    assert ensemble["attributes"]["triton.model_name"] == "pipeline"
    for step in ("pre", "double", "triple", "combine"):
        model, = spans[step]
        assert model["parent"] == ensemble["id"]
        assert model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        children = {span["name"]: span for span in collector.trace(CLIENT_TRACE, 18) if span["parent"] == model["id"]}
        assert set(children) == {"queue", "batch", "compute"}
        compute = children["compute"]
        assert compute["attributes"]["tritium.process"] == "instance"
        assert compute["attributes"]["tritium.instance.model"] == step
        assert compute["attributes"]["host.name"] and compute["attributes"]["process.pid"] > 0
        assert compute["events"] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
        assert model["start"] <= children["queue"]["start"] <= compute["start"] <= compute["end"] <= model["end"]
        assert children["batch"]["links"] == [(CLIENT_TRACE, model["id"])]
    assert request["start"] <= ensemble["start"] <= ensemble["end"] <= request["end"]


def test_a_batch_links_every_request_in_it(server, collector):
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    with ThreadPoolExecutor(2) as pool:   # batch_probe waits for a batch of 2 (preferred size)
        results = list(pool.map(lambda _: client.infer("batch_probe", [tensor]), range(2)))
    assert [result.as_numpy("ROWS").tolist() for result in results] == [[[2]], [[2]]]
    traces = collector.request_traces("batch_probe", 2)
    spans = collector.trace(set(traces), 9)   # per request: InferRequest, model, queue, compute; one batch
    models = {span["trace"]: span for span in spans if span["name"] == "batch_probe"}
    batches = [span for span in spans if span["name"] == "batch"]
    assert len(models) == 2 and len(batches) == 1   # one batch span, in the first request's trace
    batch, = batches
    assert sorted(batch["links"]) == sorted((trace, model["id"]) for trace, model in models.items())
    assert batch["attributes"]["tritium.batch.requests"] == 2
    assert batch["attributes"]["tritium.batch.size"] == 2
    assert batch["parent"] in {model["id"] for model in models.values()}


def test_grpc_request_is_traced(server, collector):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("X", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    client.infer("triple", [tensor], headers={"traceparent": f"00-{GRPC_TRACE}-{CLIENT_SPAN}-01"})
    spans = by_name(collector.trace(GRPC_TRACE, 5))
    assert sorted(spans) == ["InferRequest", "batch", "compute", "queue", "triple"]
    assert spans["InferRequest"][0]["parent"] == CLIENT_SPAN
    assert spans["triple"][0]["parent"] == spans["InferRequest"][0]["id"]
