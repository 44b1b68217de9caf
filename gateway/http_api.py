"""The KServe v2 HTTP front end: routes over the data plane, served by gateway/http_server.py.

Routes are Triton's own regular expressions, so paths match or miss exactly as they
do on Triton; each error maps to its status once, through ``TritiumError.code``.
Inference is answered through callbacks (no task per request); every other route is a
coroutine, run as a task.
"""

from __future__ import annotations

import asyncio
import logging
import re
import zlib
from collections.abc import Callable

import orjson

from tritium.gateway.compression import OFF_LOOP_BYTES, WBITS, compress_then, response_encoding
from tritium.gateway.dataplane import DataPlane
from tritium.gateway.header_forwarding import forwarded_http_headers
from tritium.gateway.http_codec import (
    decode_infer_request,
    decode_raw_request,
    encode_infer_response,
    inference_header_length,
    parse_json_object,
)
from tritium.gateway.http_server import Answer, HttpRequest, HttpResponse, Streaming
from tritium.gateway.inference import InferRequest, InferResult
from tritium.gateway.model_table import ModelSpec
from tritium.gateway.offload import DECODE_OFF_LOOP_BYTES, decode_threads, zlib_threads
from tritium.gateway.restricted import RestrictedApis
from tritium.gateway.shared_memory import CUDA_SHM_UNSUPPORTED, unknown_cuda_region
from tritium.gateway.tracing import answer_if_sampled, traced_answer
from tritium.errors import InvalidArgument, NotFound, TritiumError, Unsupported
from tritium.tracing.settings import changes_from_http

log = logging.getLogger(__name__)

_SERVER = re.compile(r"/v2(?:/health/(?P<action>live|ready))?")
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(?P<action>infer|generate|generate_stream|ready|config|stats|trace/setting))?")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_SHARED_MEMORY = re.compile(r"/v2/(systemsharedmemory|cudasharedmemory)(?:/region/([^/]+))?/(status|register|unregister)")
_MODELS_STATS = re.compile(r"/v2/models/stats")
_LOGGING = re.compile(r"/v2/logging")
_TRACE = re.compile(r"/v2/trace/setting")

# The API category of each route, as --http-restricted-api names them: the first pattern
# that matches the path decides; a dict is keyed by the pattern's "action" group.
_CATEGORIES = (
    (_MODELS_STATS, "statistics"),
    (_MODEL, {None: "metadata", "ready": "health", "infer": "inference", "generate": "inference",
              "generate_stream": "inference", "config": "model-config", "stats": "statistics",
              "trace/setting": "trace"}),
    (_REPOSITORY, "model-repository"),
    (_SHARED_MEMORY, "shared-memory"),
    (_LOGGING, "logging"),
    (_TRACE, "trace"),
    (_SERVER, {None: "metadata", "live": "health", "ready": "health"}),
)
_JSON = [(b"content-type", b"application/json")]
_TEXT = [(b"content-type", b"text/plain")]


def json_response(document: object, status: int = 200) -> HttpResponse:
    return HttpResponse(status, _JSON, orjson.dumps(document))


def error_response(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, _JSON, orjson.dumps({"error": message}))


_EMPTY_OK = HttpResponse(200, _TEXT, b"")
_EMPTY_OK_JSON = HttpResponse(200, _JSON, b"")
_EMPTY_BAD = HttpResponse(400, _TEXT, b"")
_NOT_FOUND = error_response(404, "Not Found")
_NOT_ALLOWED = error_response(405, "Method Not Allowed")
_EVENT_STREAM = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


async def event_stream(events, generating: InferRequest | None = None) -> Streaming:
    """``/generate_stream``'s server-sent events: ``data: <json>\n\n`` per response.

    The first response is awaited before the status is sent: a request refused before it
    runs gets an ordinary JSON error with its status; one whose first answer is an error
    (the model's) gets 400 with that error as its only event, as from Triton; a later
    error is one more event, ``data: {"error": ...}``. ``generating``: the request, whose
    trace (once sampled) gets an HTTP_SEND_START/END pair around each event written, as Triton's.
    """
    first = None
    async for first in events:
        break

    def stamp(name: str) -> None:
        if generating is not None and generating.trace is not None:
            generating.trace.stamp(name)

    async def chunks():
        try:
            if first is not None:
                stamp("HTTP_SEND_START")
                yield _event(first)
                stamp("HTTP_SEND_END")   # resumed: the event was written (a stream cut short is not resumed)
            if not isinstance(first, TritiumError):
                async for event in events:
                    stamp("HTTP_SEND_START")
                    yield _event(event)
                    stamp("HTTP_SEND_END")
        finally:
            await events.aclose()   # the request's own ending (its trace's) comes now, not when collected

    return Streaming(400 if isinstance(first, TritiumError) else 200, _EVENT_STREAM, chunks())


async def _finishing_trace(events, generating: InferRequest, request: HttpRequest):
    """A ``/generate_stream`` request's events; if it was sampled, its trace ends with them, the
    front end's receiving stamps added."""
    try:
        async for event in events:
            yield event
    finally:
        try:
            await events.aclose()   # a stream cut short gives its request up now (DataPlane.infer_stream)
        finally:
            trace = generating.trace
            if trace is not None:
                trace.stamp("HTTP_RECV_START", request.began_ns)
                trace.stamp("HTTP_RECV_END", request.received_ns)
                trace.finish()


def _event(event: bytes | TritiumError) -> bytes:
    if isinstance(event, TritiumError):
        event = orjson.dumps({"error": event.message})
    return b"data: " + event + b"\n\n"


class HttpApp:
    def __init__(self, dataplane: DataPlane, max_body_bytes: int = 64 * 1024 * 1024,
                 restricted: RestrictedApis = RestrictedApis(), header_forward: re.Pattern[str] | None = None) -> None:
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes
        self.restricted = restricted
        self.header_forward = header_forward   # --http-header-forward-pattern (the server keeps header lines then)

    def handle(self, request: HttpRequest, answer: Answer) -> Callable[[], None] | None:
        """Answer ``request`` through ``answer``, exactly once, whatever happens; return what cancels
        an inference request should its client leave before the answer."""
        try:
            if self.restricted:  # before anything else, as Triton checks it first in every handler
                self.restricted.check(route_category(request.path), request.headers.items())
            if request.too_large:
                raise self._too_large(request)
            match = _MODEL.fullmatch(request.path)
            if match is not None and request.method == "POST":
                if match["action"] == "infer":
                    return self._infer(request, match.group(1), match.group(2), answer)
                if match["action"] in ("generate", "generate_stream"):
                    generating = asyncio.get_running_loop().create_task(
                        self._generate(request, match.group(1), match.group(2), match["action"], answer))

                    def give_up() -> None:   # its client left before the answer (or the first event)
                        generating.cancel()
                    return give_up
        except TritiumError as exc:
            answer(error_response(exc.http_status, exc.message))
            return None
        except Exception as exc:  # a bug must cost one request, never the process
            answer(_internal_error(request, exc))
            return None
        asyncio.get_running_loop().create_task(self._answer_slowly(request, answer))
        return None

    async def _answer_slowly(self, request: HttpRequest, answer: Answer) -> None:
        try:
            response = await self._route(request)
        except TritiumError as exc:
            response = error_response(exc.http_status, exc.message)
        except Exception as exc:
            response = _internal_error(request, exc)
        answer(response)

    # -- inference: callbacks, no task ------------------------------------------------------

    def _infer(self, request: HttpRequest, model: str, version: str | None, answer: Answer) -> Callable[[], None]:
        spec = self.dataplane.check_model(model, version)   # Triton looks the model up before the body
        encoding = request.headers.get(b"content-encoding")
        if encoding is not None and len(request.body) >= OFF_LOOP_BYTES and encoding.lower() in WBITS:
            inflating = zlib_threads.run(self._decode_inflated, request, model, version, spec, encoding)
            return self._infer_off_loop(request, answer, inflating)
        body = self._decompress(request.body, encoding)
        header_length = _header_length(request)
        if (len(body) if header_length is None else header_length) >= DECODE_OFF_LOOP_BYTES:   # that much JSON
            decoding = decode_threads.run(self._decode, request, model, version, spec, body, header_length)
            return self._infer_off_loop(request, answer, decoding)
        return self._send(request, *self._decode(request, model, version, spec, body, header_length), answer)

    def _infer_off_loop(self, request: HttpRequest, answer: Answer,
                        decoding: asyncio.Future[tuple[InferRequest, bool]]) -> Callable[[], None]:
        """A request read on a thread (gateway/offload.py); it goes on from the loop once read."""
        gave_up: list[Callable[[], None]] = []
        client_left = False

        def decoded(done: asyncio.Future[tuple[InferRequest, bool]]) -> None:
            if client_left:
                return
            try:
                gave_up.append(self._send(request, *done.result(), answer))
            except Exception as exc:
                answer(_failure(request, exc))

        def give_up() -> None:
            nonlocal client_left
            client_left = True
            decoding.cancel()
            for cancel in gave_up:
                cancel()

        decoding.add_done_callback(decoded)
        return give_up

    def _decode_inflated(self, request: HttpRequest, model: str, version: str | None, spec: ModelSpec,
                         encoding: bytes) -> tuple[InferRequest, bool]:
        body = self._decompress(request.body, encoding)
        return self._decode(request, model, version, spec, body, _header_length(request))

    def _decode(self, request: HttpRequest, model: str, version: str | None, spec: ModelSpec, body: bytes,
                header_length: int | None) -> tuple[InferRequest, bool]:
        """The request the body asks (its JSON the first ``header_length`` bytes, or all of it),
        and whether its outputs are binary unless it says otherwise."""
        if header_length == 0 or (header_length is None and not body):   # Triton's default: the body's length
            infer_request, binary_default = decode_raw_request(spec, version, body), True
        else:
            infer_request, binary_default = decode_infer_request(model, version, body, header_length)
        if self.header_forward is not None and request.header_lines:
            infer_request.parameters = {**infer_request.parameters,
                                        **forwarded_http_headers(self.header_forward, request.header_lines)}
        return infer_request, binary_default

    def _send(self, request: HttpRequest, infer_request: InferRequest, binary_default: bool,
              answer: Answer) -> Callable[[], None]:
        headers = request.headers
        accept_encoding = headers.get(b"accept-encoding")
        encoding = None if accept_encoding is None else response_encoding(accept_encoding)

        def done(result: InferResult | TritiumError) -> None:
            try:
                if isinstance(result, TritiumError):
                    raise result
                response_headers, response_body = encode_infer_response(result, infer_request.outputs, binary_default)
                if encoding is None:
                    answer(HttpResponse(200, response_headers, response_body))
                    return
                # Inference-Header-Content-Length keeps the uncompressed header's length, as Triton sends it
                response_headers = [*response_headers, (b"content-encoding", encoding)]
                compress_then(response_body, encoding, lambda packed: answer(HttpResponse(200, response_headers, packed)),
                              lambda exc: answer(_failure(request, exc)))
            except Exception as exc:
                answer(_failure(request, exc))

        if self.dataplane.tracer.on:
            infer_request.traceparent = headers.get(b"traceparent")
            answer = answer_if_sampled(infer_request, request, answer)
        return self.dataplane.infer_then(infer_request, done)

    # -- generate ------------------------------------------------------------------------------

    async def _generate(self, request: HttpRequest, model: str, version: str | None, action: str,
                        answer: Answer) -> None:
        """``/generate`` and ``/generate_stream``; a sampled request is traced as ``infer`` is (a
        stream's trace ends with its last event)."""
        generating = None
        try:
            body = self._body(request)
            generating = self.dataplane.generate_request(model, version, parse_json_object(body), body)
            if self.dataplane.tracer.on:
                generating.traceparent = request.headers.get(b"traceparent")
            if action == "generate":
                response: HttpResponse | Streaming = HttpResponse(200, _JSON, await self.dataplane.generate(generating))
            else:
                response = await event_stream(_finishing_trace(self.dataplane.generate_stream(generating),
                                                               generating, request), generating)
        except TritiumError as exc:
            response = error_response(exc.http_status, exc.message)
        except asyncio.CancelledError:   # its client left (HttpConnection gave it up): nothing is written
            trace = None if generating is None else generating.trace
            if trace is not None and action == "generate":   # (a stream's ends with its events)
                trace.stamp("HTTP_RECV_START", request.began_ns)
                trace.stamp("HTTP_RECV_END", request.received_ns)
                trace.finish()
            raise
        except Exception as exc:
            response = _internal_error(request, exc)
        trace = None if generating is None else generating.trace
        if trace is not None and action == "generate":
            answer = traced_answer(trace, request, answer)
        answer(response)

    # -- everything else --------------------------------------------------------------------

    async def _route(self, request: HttpRequest) -> HttpResponse | Streaming:
        path, method = request.path, request.method
        match = _MODEL.fullmatch(path)
        if match is not None and path != "/v2/models/stats":
            return await self._model_route(request, method, *match.groups())
        if path == "/v2/models/stats":
            if method != "GET":
                return _NOT_ALLOWED
            return json_response(await self.dataplane.statistics(None, None))
        match = _REPOSITORY.fullmatch(path)
        if match is not None:
            if method != "POST":
                return _NOT_ALLOWED
            return await self._repository_route(request, *match.groups())
        if path == "/v2/logging":
            if method == "GET":
                return json_response(await self.dataplane.log_settings())
            if method != "POST":
                return _NOT_ALLOWED
            return json_response(await self.dataplane.log_settings(parse_json_object(self._body(request))))
        if path == "/v2/trace/setting":
            return await self._trace_route(request, method, None)
        match = _SHARED_MEMORY.fullmatch(path)
        if match is not None:
            return await self._shared_memory_route(request, method, *match.groups())
        match = _SERVER.fullmatch(path)
        if match is not None:
            if method != "GET":
                return _NOT_ALLOWED
            probe = match.group(1)
            if probe == "live":
                return _EMPTY_OK if self.dataplane.live() else _EMPTY_BAD
            if probe == "ready":
                return _EMPTY_OK if self.dataplane.ready() else _EMPTY_BAD
            return json_response(self.dataplane.server_metadata())
        return _NOT_FOUND

    async def _model_route(self, request: HttpRequest, method, model, version, action) -> HttpResponse | Streaming:
        if action in ("infer", "generate", "generate_stream"):   # a POST went its own way (``handle``)
            return _NOT_ALLOWED
        if action == "trace/setting":
            return await self._trace_route(request, method, model) if version is None else _NOT_FOUND
        if method != "GET":
            return _NOT_ALLOWED
        if action is None:
            return json_response(self.dataplane.model_metadata(model, version))
        if action == "ready":
            self.dataplane.model_ready(model, version)
            return _EMPTY_OK
        if action == "config":
            return HttpResponse(200, _JSON, self.dataplane.model_config(model, version))
        return json_response(await self.dataplane.statistics(model, version))

    async def _trace_route(self, request: HttpRequest, method: str, model: str | None) -> HttpResponse:
        if method == "GET":
            return json_response(await self.dataplane.trace_settings(model))
        if method != "POST":
            return _NOT_ALLOWED
        self.dataplane.check_trace_model(model)
        changes = changes_from_http(parse_json_object(self._body(request)))   # an empty body too is not JSON, as in Triton
        return json_response(await self.dataplane.trace_settings(model, changes))

    async def _repository_route(self, request: HttpRequest, repository, _action, model, operation) -> HttpResponse:
        if repository is not None and model is not None:   # Triton's index ignores the name; gRPC's refuses it
            raise Unsupported("'repository_name' specification is not supported")
        document = self._optional_json_body(request)
        if model is None:  # index
            ready = document.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument("Unable to parse 'ready', expect bool")
            return json_response(await self.dataplane.repository_index(ready))
        parameters = document.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidArgument("Unable to parse 'parameters', expect object")
        if operation == "load":
            await self.dataplane.load_model(model, parameters)
        else:
            dependents = parameters.get("unload_dependents", False)
            if not isinstance(dependents, bool):
                raise InvalidArgument("Unable to parse 'unload_dependents', expect bool")
            await self.dataplane.unload_model(model, dependents)
        return _EMPTY_OK_JSON

    async def _shared_memory_route(self, request: HttpRequest, method, kind, region, action) -> HttpResponse:
        if method != ("GET" if action == "status" else "POST"):
            return _NOT_ALLOWED
        if kind == "cudasharedmemory":  # no CUDA in the gateway: nothing is ever registered
            if action == "register":
                raise Unsupported(CUDA_SHM_UNSUPPORTED)
            if action == "status" and region is not None:
                raise NotFound(unknown_cuda_region(region))
            return json_response([]) if action == "status" else _EMPTY_OK_JSON
        if action == "status":
            return json_response(self.dataplane.shared_memory_status(region))
        if action == "unregister":
            await self.dataplane.unregister_shared_memory(region)
            return _EMPTY_OK_JSON
        if region is None:   # (Triton's words)
            raise InvalidArgument("'region name' is necessary to register system shared memory region")
        document = self._optional_json_body(request)
        await self.dataplane.register_shared_memory(region, document.get("key"), document.get("offset", 0),
                                                    document.get("byte_size"))
        return _EMPTY_OK_JSON

    def _optional_json_body(self, request: HttpRequest) -> dict:
        """The JSON object body of a control request; an empty body is an empty object."""
        body = self._body(request)
        return parse_json_object(body) if body.strip() else {}

    def _body(self, request: HttpRequest) -> bytes:
        return self._decompress(request.body, request.headers.get(b"content-encoding"))

    def _too_large(self, request: HttpRequest) -> InvalidArgument:
        """Triton's words: its limit is on the JSON (all of a body without binary data), or on a raw body."""
        if request.headers.get(b"inference-header-content-length") == b"0":
            return InvalidArgument(f"Raw input has a byte_size ({request.too_large} bytes) that exceeds the maximum "
                                   f"allowed value of {self.max_body_bytes} bytes. Use --http-max-input-size to "
                                   "increase the limit.")
        return InvalidArgument(f"request JSON size of {request.too_large} bytes exceeds the maximum allowed input "
                               f"size of {self.max_body_bytes} bytes. Use --http-max-input-size to increase the limit.")

    def _decompress(self, body: bytes, encoding: bytes | None) -> bytes:
        """The body inflated, binary tensor data included, up to --http-max-input-size, as later
        Tritons limit it (2.51 has no bound): a small body must not inflate to gigabytes."""
        if encoding is None or encoding.lower() == b"identity":
            return body
        kind = encoding.lower()
        if kind not in WBITS:
            raise Unsupported("Unsupported compression type")
        decompressor = zlib.decompressobj(WBITS[kind])
        try:
            data = decompressor.decompress(body, self.max_body_bytes + 1)
        except zlib.error as exc:
            raise InvalidArgument(f"cannot decompress the {kind.decode()} request body: {exc}") from exc
        if len(data) > self.max_body_bytes:
            raise InvalidArgument(
                f"Decompressed data size exceeds the maximum allowed value of "
                f"{self.max_body_bytes} bytes. Use --http-max-input-size to increase the limit.")
        if body and not decompressor.eof:
            raise InvalidArgument(f"cannot decompress the {kind.decode()} request body: it ends before its "
                                  f"compressed stream does")
        if decompressor.unused_data:   # (a second gzip member too: one stream is what a client sends)
            raise InvalidArgument(f"cannot decompress the {kind.decode()} request body: "
                                  f"{len(decompressor.unused_data)} bytes follow its compressed stream")
        return data


def _header_length(request: HttpRequest) -> int | None:
    text = request.headers.get(b"inference-header-content-length")
    return None if text is None else inference_header_length(text)


def _failure(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The answer to an inference request that failed with ``exc``."""
    if isinstance(exc, TritiumError):
        return error_response(exc.http_status, exc.message)
    return _internal_error(request, exc)


def _internal_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.error("internal error serving %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def route_category(path: str) -> str | None:
    """The API category of a path (None: no such route)."""
    for pattern, category in _CATEGORIES:
        match = pattern.fullmatch(path)
        if match is not None:
            return category if isinstance(category, str) else category.get(match["action"])
    return None
