"""Triton's gRPC service, ``inference.GRPCInferenceService``, over the data plane; served by
gateway/grpc_server.py (the default) or by grpc.aio (``--grpc-server=grpcio``, bound here).

The generated classes are the ones tritonclient ships (``tritonclient.grpc.service_pb2``),
so messages are exactly Triton's. Errors become the gRPC status Triton gives them
(``ErrorCode.grpc_code_name``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from tritium.gateway.dataplane import GRPC_DECOUPLED, DataPlane
from tritium.gateway.grpc_codec import (FINAL_RESPONSE, InferRequestReader, InferResponseWriter, ReadAhead,
                                       costly_to_read, decode_infer_request, encode_infer_response, stream_answer)
from tritium.gateway.grpc_health import SERVICE_NAME as HEALTH_SERVICE
from tritium.gateway.grpc_health import HealthCheckRequest, HealthCheckResponse
from tritium.gateway.grpc_keepalive import GrpcKeepalive
from tritium.gateway.grpc_tls import GrpcTls
from tritium.gateway.header_forwarding import forwarded_grpc_metadata
from tritium.gateway.inference import InferRequest, InferResult
from tritium.gateway.model_table import parse_version
from tritium.gateway.restricted import RestrictedApis
from tritium.gateway.shared_memory import CUDA_SHM_UNSUPPORTED, unknown_cuda_region
from tritium.errors import InternalError, InvalidArgument, NotFound, TritiumError, Unsupported
from tritium.tracing.settings import changes_from_grpc
from tritium.ports import PortInUse, check_free

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 2**31 - 1   # Triton's default: INT32_MAX both ways

# The API category of each RPC, as --grpc-restricted-protocol names them.
RPC_CATEGORIES = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
    "Check": "health",   # grpc.health.v1.Health
}


# What a request's bytes become when they are no protobuf message of its type: answered
# with Triton's INTERNAL "Unable to parse request" by the method, not by grpc's own handler
# (which would log a traceback and answer UNKNOWN). Inference requests stay bytes, and the
# service's reader fails them the same way.
UNPARSABLE = object()


class StreamError(NamedTuple):
    """An error answering one request of a stream, with the response shell Triton sends it in:
    the request's id, and for a failure after the request started its model, name, version
    and final flag as well, so that the client knows which request failed."""

    error: TritiumError
    response: service_pb2.ModelInferResponse

    @classmethod
    def before_start(cls, error: TritiumError, request_id: str) -> "StreamError":
        return cls(error, service_pb2.ModelInferResponse(id=request_id))

    @classmethod
    def answered(cls, error: TritiumError, request: InferRequest, final: bool) -> "StreamError":
        response = service_pb2.ModelInferResponse(id=request.id, model_name=request.model,
                                                  model_version=request.version or "")
        response.parameters[FINAL_RESPONSE].bool_param = final
        return cls(error, response)

    def encode(self) -> bytes:
        """The ModelStreamInferResponse that carries it."""
        return service_pb2.ModelStreamInferResponse(error_message=self.error.message,
                                                    infer_response=self.response).SerializeToString()


class _Unparsable(InternalError):
    """Bytes that are no protobuf message of the RPC's type (INTERNAL, as Triton's gRPC library answers)."""


def _unparsable() -> InternalError:
    """A new error each time: raising one shared exception object would grow its traceback
    (and the frames it holds) with every bad message."""
    return _Unparsable("Unable to parse request")


def _lenient(parse):
    def parse_or_mark(data: bytes | memoryview):
        try:
            return parse(data)
        except DecodeError:
            return UNPARSABLE
    return parse_or_mark


async def _abort(context, error: TritiumError):
    await context.abort(getattr(grpc.StatusCode, error.code.grpc_code_name), error.message)


def _rpc(method):
    """Every RPC: a TritiumError becomes its gRPC status; a bug becomes INTERNAL, never a crash."""
    # A request that does not parse is refused before the restriction is checked: Triton's gRPC
    # library parses it before Triton's handler runs. ModelInfer reads its own bytes, then checks.
    category = None if method.__name__ == "ModelInfer" else RPC_CATEGORIES[method.__name__]

    async def wrapper(self, request, context):
        try:
            if request is UNPARSABLE:
                raise _unparsable()
            if self.restricted and category is not None:
                self.restricted.check(category, context.invocation_metadata() or ())
            return await method(self, request, context)
        except TritiumError as exc:
            await _abort(context, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("internal error in %s", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
    wrapper.__name__ = method.__name__
    return wrapper


class HealthService:
    """gRPC's health checking protocol, as Triton serves it: ``Check`` answers SERVING while the
    server is ready (``/v2/health/ready``), else NOT_SERVING, whatever service the request names;
    it is a ``health`` RPC for ``--grpc-restricted-protocol``. ``Watch`` is not served
    (UNIMPLEMENTED), as in Triton."""

    def __init__(self, dataplane: DataPlane, restricted: RestrictedApis) -> None:
        self.dataplane = dataplane
        self.restricted = restricted

    @_rpc
    async def Check(self, request, context):
        ready = self.dataplane.ready()
        return HealthCheckResponse(status=HealthCheckResponse.SERVING if ready else HealthCheckResponse.NOT_SERVING)


class GrpcInferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane, restricted: RestrictedApis = RestrictedApis(),
                 header_forward: re.Pattern[str] | None = None) -> None:
        self.dataplane = dataplane
        self.restricted = restricted
        self.header_forward = header_forward   # --grpc-header-forward-pattern
        self.health = HealthService(dataplane, restricted)
        self._reader = InferRequestReader()
        self._writer = InferResponseWriter()

    def _read_infer(self, message: Any, metadata: Sequence[tuple[bytes | str, bytes | str]]) -> InferRequest:
        """ModelInfer's request, refused in Triton's order: bytes that are no ModelInferRequest
        (INTERNAL, from Triton's gRPC library, which parses before Triton looks), then a call the
        restriction refuses, then what the request asks that cannot be."""
        try:
            request = self._decode(message)
        except Exception as exc:
            if self.restricted and not isinstance(exc, _Unparsable):
                self.restricted.check(RPC_CATEGORIES["ModelInfer"], metadata)
            raise
        if self.restricted:
            self.restricted.check(RPC_CATEGORIES["ModelInfer"], metadata)
        return self._forwarded(request, metadata)

    def _forwarded(self, request: InferRequest, metadata: Sequence[tuple[bytes | str, bytes | str]]) -> InferRequest:
        """``request`` with the call's forwarded headers (--grpc-header-forward-pattern) among its parameters."""
        if self.header_forward is not None:
            request.parameters = {**request.parameters, **forwarded_grpc_metadata(self.header_forward, metadata)}
        return request

    def _decode(self, message: Any) -> InferRequest:
        """The InferRequest ``message`` asks for (ModelInfer's bytes, the same read on a thread
        already, or a ModelInferRequest); a request refused for its inputs is refused for its
        model first when the model or version is unknown."""
        try:
            if isinstance(message, bytes):
                return self._reader.read(message)
            if isinstance(message, ReadAhead):
                return message.result()
            return decode_infer_request(message)
        except DecodeError:
            raise _unparsable() from None
        except InvalidArgument:   # Triton looks for the model before it reads the inputs
            self.dataplane.check_model(*self._named_model(message))
            raise

    def _named_model(self, message: Any) -> tuple[str, str | None]:
        """The model and version (None: the latest) of a ModelInferRequest ``_decode`` refused."""
        if isinstance(message, ReadAhead):
            return message.model, message.version or None
        if isinstance(message, service_pb2.ModelInferRequest):
            return message.model_name, message.model_version or None
        return self._reader.named

    # -- health and metadata ------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=self.dataplane.live())

    @_rpc
    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.dataplane.ready())

    @_rpc
    async def ModelReady(self, request, context):
        if request.version:
            parse_version(request.version)   # a version that is no number is an error, as on Triton
        self.dataplane.require_started()   # (an error, not ready=false: Triton's UNAVAILABLE)
        try:
            self.dataplane.model_ready(request.name, request.version or None)
        except TritiumError:  # unknown or not ready: Triton answers ready=false, never an error
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @_rpc
    async def ServerMetadata(self, request, context):
        metadata = self.dataplane.server_metadata()
        return service_pb2.ServerMetadataResponse(name=metadata["name"], version=metadata["version"],
                                                  extensions=metadata["extensions"])

    @_rpc
    async def ModelMetadata(self, request, context):
        metadata = self.dataplane.model_metadata(request.name, request.version or None)
        response = service_pb2.ModelMetadataResponse(name=metadata["name"], versions=metadata["versions"],
                                                     platform=metadata["platform"])
        for kind in ("inputs", "outputs"):
            for tensor in metadata[kind]:
                getattr(response, kind).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    @_rpc
    async def ModelConfig(self, request, context):
        config = model_config_pb2.ModelConfig()
        json_format.ParseDict(orjson.loads(self.dataplane.model_config(request.name, request.version or None)),
                              config, ignore_unknown_fields=True)
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc
    async def ModelStatistics(self, request, context):
        statistics = await self.dataplane.statistics(request.name or None, request.version or None)
        response = service_pb2.ModelStatisticsResponse()
        json_format.ParseDict(statistics, response, ignore_unknown_fields=True)
        return response

    # -- the model repository extension ----------------------------------------------------

    @_rpc
    async def RepositoryIndex(self, request, context):
        _no_repository_name(request.repository_name)
        response = service_pb2.RepositoryIndexResponse()
        for entry in await self.dataplane.repository_index(request.ready):
            response.models.add(**entry)
        return response

    @_rpc
    async def RepositoryModelLoad(self, request, context):
        _no_repository_name(request.repository_name)
        await self.dataplane.load_model(request.model_name, _load_parameters(request.parameters))
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request, context):
        _no_repository_name(request.repository_name)
        dependents = request.parameters.get("unload_dependents")
        if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidArgument("invalid value type for 'unload_dependents' parameter, expected bool_param.")
        await self.dataplane.unload_model(request.model_name, dependents is not None and dependents.bool_param)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- system shared memory ---------------------------------------------------------------

    @_rpc
    async def SystemSharedMemoryStatus(self, request, context):
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in self.dataplane.shared_memory_status(request.name or None):
            response.regions[region["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def SystemSharedMemoryRegister(self, request, context):
        await self.dataplane.register_shared_memory(request.name, request.key, request.offset, request.byte_size)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request, context):
        await self.dataplane.unregister_shared_memory(request.name or None)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory: nothing can be registered (the gateway has no CUDA), so status is
    # empty and unregistering succeeds, which clients such as perf_analyzer do on exit.

    @_rpc
    async def CudaSharedMemoryStatus(self, request, context):
        if request.name:
            raise NotFound(unknown_cuda_region(request.name))
        return service_pb2.CudaSharedMemoryStatusResponse()

    @_rpc
    async def CudaSharedMemoryRegister(self, request, context):
        raise Unsupported(CUDA_SHM_UNSUPPORTED)

    @_rpc
    async def CudaSharedMemoryUnregister(self, request, context):
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    @_rpc
    async def LogSettings(self, request, context):
        response = service_pb2.LogSettingsResponse()
        try:
            settings = await self.dataplane.log_settings(_log_changes(request.settings))
        except InvalidArgument as exc:   # Triton's gRPC text names the setting without the flag's dashes
            raise InvalidArgument(exc.message.replace("--log_format", "log_format")) from None
        for key, value in settings.items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response

    @_rpc
    async def TraceSetting(self, request, context):
        self.dataplane.check_trace_model(request.model_name or None)
        changes = changes_from_grpc({key: list(setting.value) for key, setting in request.settings.items()})
        settings = await self.dataplane.trace_settings(request.model_name or None, changes)
        response = service_pb2.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    # -- inference ----------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request, context):
        wanted = self.header_forward is not None or self.dataplane.tracer.on or bool(self.restricted)
        metadata = (context.invocation_metadata() or ()) if wanted else ()   # reading it costs: only when used
        infer_request = self._read_infer(request, metadata)
        if self.dataplane.tracer.on:   # W3C trace context in the call's metadata continues the client's trace
            infer_request.traceparent = dict(metadata).get("traceparent")
        result = await self.dataplane.infer(infer_request, GRPC_DECOUPLED)
        return encode_infer_response(result)

    def infer_then(self, request: Any, metadata: Sequence[tuple[bytes, bytes]],
                   done: Callable[[tuple[bytes | memoryview, ...] | TritiumError], None]) -> Callable[[], None]:
        """ModelInfer without a coroutine (gateway/grpc_server.py's hot path): ``done`` gets the
        ModelInferResponse's bytes (as pieces: InferResponseWriter.pieces) or a TritiumError once; a
        request refused before it is sent raises here. Returns what to call when the client gives
        up on the call."""
        infer_request = self._read_infer(request, metadata)

        def answered(result: InferResult | TritiumError) -> None:
            answer: tuple[bytes | memoryview, ...] | TritiumError
            if isinstance(result, TritiumError):
                answer = result
            else:
                try:
                    answer = self._writer.pieces(result)
                except TritiumError as exc:
                    answer = exc
            trace = infer_request.trace
            if trace is None:
                done(answer)
                return
            trace.stamp("GRPC_SEND_START")
            done(answer)
            trace.stamp("GRPC_SEND_END")
            trace.finish()

        if self.dataplane.tracer.on:   # W3C trace context in the call's metadata continues the client's trace
            infer_request.traceparent = _traceparent(metadata)
        return self.dataplane.infer_then(infer_request, answered, GRPC_DECOUPLED)

    def open_stream(self, metadata: Sequence[tuple[str, str | bytes]], send: Callable[[Any], None],
                    fail: Callable[[TritiumError], None], finish: Callable[[], None]) -> InferStream:
        """A ModelStreamInfer call (see InferStream); a call refused before its first request is
        read (the restricted APIs, as on Triton) raises here."""
        if self.restricted:
            self.restricted.check(RPC_CATEGORIES["ModelStreamInfer"], metadata)
        return InferStream(self, metadata, send, fail, finish)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        """grpc.aio's shape of ``open_stream``: answers leave as they come, whatever the order of
        the requests that asked."""
        outgoing: asyncio.Queue = asyncio.Queue()
        try:
            stream = self.open_stream(context.invocation_metadata() or (), outgoing.put_nowait, outgoing.put_nowait,
                                      lambda: outgoing.put_nowait(None))
        except TritiumError as exc:
            await _abort(context, exc)

        async def read() -> None:
            async for message in request_iterator:
                stream.request(message)
            stream.client_done()

        reader = asyncio.ensure_future(read())
        try:
            while (item := await outgoing.get()) is not None:
                if isinstance(item, TritiumError):
                    await _abort(context, item)
                yield item
        finally:
            reader.cancel()
            stream.over = True

    def stream_one(self, message: Any, metadata: Sequence[tuple[str, str | bytes]],
                   deliver: Callable[[bytes | StreamError | TritiumError | None, bool], None]) -> Callable[[], None] | None:
        """One request of a stream (ModelInferRequest bytes, or the parsed message): ``deliver``
        gets each of its answers as it comes (ModelInferResponse bytes; None for a flags-only
        final response nobody asked to see) and whether it is the request's last. Returns what
        cancels the request, once sent."""
        try:
            request = self._forwarded(self._decode(message), metadata)
        except TritiumError as exc:
            deliver(StreamError.before_start(exc, _request_id(message)), True)
            return None
        empty_final = bool(request.parameters.pop("triton_enable_empty_final_response", False))
        writer = self._writer

        def answered(answer: InferResult | TritiumError | None, final: bool) -> None:
            encoded: bytes | StreamError | None
            try:
                if answer is None:   # a decoupled model's flags-only final response
                    encoded = _empty_final(request) if empty_final else None
                elif isinstance(answer, TritiumError):
                    encoded = StreamError.answered(answer, request, final)
                else:
                    encoded = writer.write(answer, final)
            except TritiumError as exc:
                encoded = StreamError.answered(exc, request, final)
            except Exception as exc:
                log.exception("internal error answering a stream request")
                encoded = StreamError.answered(TritiumError(f"internal error: {type(exc).__name__}: {exc}"),
                                               request, final)
            trace = request.trace
            if trace is None:
                deliver(encoded, final)   # once per answer: the stream counts the last ones
                return
            if encoded is not None:   # as Triton: each response sent is stamped
                trace.stamp("GRPC_SEND_START")
            deliver(encoded, final)
            if encoded is not None:
                trace.stamp("GRPC_SEND_END")
            if final:
                trace.finish()

        if self.dataplane.tracer.on:   # W3C trace context in the call's metadata continues the client's trace
            request.traceparent = _traceparent(metadata)
        try:
            return self.dataplane.infer_stream_then(request, answered, traced=True)
        except TritiumError as exc:
            deliver(StreamError.before_start(exc, request.id), True)
            return None


class InferStream:
    """One ModelStreamInfer call, whichever server carries it.

    Each request is sent as it is read; each answer leaves through ``send`` as a
    ModelStreamInferResponse's bytes as soon as it comes, whatever the order of the requests. An
    error is sent as the response's ``error_message``, unless the client asked with
    ``triton_grpc_error: true`` for errors as gRPC statuses: then the first one ends the call
    through ``fail``. ``finish`` ends the call once the client has sent all its requests and
    each has had its last answer. Answers after the end (``over``) are dropped.
    """

    __slots__ = ("service", "metadata", "send", "fail", "finish", "strict", "unanswered", "reading", "over", "open",
                 "_numbers")

    def __init__(self, service: GrpcInferenceService, metadata: Sequence[tuple[str, str | bytes]],
                 send: Callable[[bytes], None],
                 fail: Callable[[TritiumError], None], finish: Callable[[], None]) -> None:
        self.service, self.metadata = service, metadata
        self.send, self.fail, self.finish = send, fail, finish
        self.strict = any(key == "triton_grpc_error" and value == "true" for key, value in metadata)
        self.unanswered = 0     # requests read whose last answer has not come
        self.reading = True     # the client may send more requests
        self.over = False
        self.open: dict[int, Callable[[], None] | None] = {}   # what cancels each request still answering
        self._numbers = itertools.count()

    def request(self, message: Any) -> None:
        if self.over:
            return
        self.unanswered += 1   # first: an answer may come before stream_one returns
        number = next(self._numbers)
        answered = self._answered

        def deliver(answer, last: bool) -> None:
            if last:
                self.open.pop(number, None)
            answered(answer, last)

        self.open[number] = None   # until stream_one returns; its last answer may come before
        try:
            give_up = self.service.stream_one(message, self.metadata, deliver)
        except Exception as exc:
            log.exception("internal error in a stream request")
            deliver(TritiumError(f"internal error: {type(exc).__name__}: {exc}"), True)
            return
        if number in self.open:   # still answering
            self.open[number] = give_up

    def abandon(self) -> None:
        """The client left the stream: its requests still answering are cancelled."""
        open_requests, self.open = self.open, {}
        for give_up in open_requests.values():
            if give_up is not None:
                give_up()

    def client_done(self) -> None:
        self.reading = False
        self._end_if_answered()

    def _answered(self, answer: bytes | StreamError | TritiumError | None, last: bool) -> None:
        if self.over:
            return
        if last:
            self.unanswered -= 1
        try:   # the server's failure to send is its own: this answer is still counted once
            if isinstance(answer, TritiumError):   # a message that could not be read: no request to name
                answer = StreamError(answer, service_pb2.ModelInferResponse())
            if isinstance(answer, StreamError):
                if self.strict:   # the client asked for errors as gRPC statuses, ending the stream
                    self.over = True
                    self.fail(answer.error)
                    return
                self.send(answer.encode())
            elif answer is not None:
                self.send(stream_answer(answer))
        except Exception:
            log.exception("internal error sending a stream answer")
        if last:
            self._end_if_answered()

    def _end_if_answered(self) -> None:
        if not self.reading and not self.unanswered and not self.over:
            self.over = True
            self.finish()


def _empty_final(request: InferRequest) -> bytes:
    """The flags-only final response a client asked to see (triton_enable_empty_final_response)."""
    response = service_pb2.ModelInferResponse(model_name=request.model, model_version=request.version or "",
                                              id=request.id)
    response.parameters[FINAL_RESPONSE].bool_param = True
    return response.SerializeToString()


def _request_id(message: Any) -> str:
    """The id of a stream request that could not be read into an InferRequest ("" if even
    protobuf cannot read it), for the error answering it."""
    if not isinstance(message, bytes):
        return message.id   # a ModelInferRequest's, or a ReadAhead's
    try:
        return service_pb2.ModelInferRequest.FromString(message).id
    except DecodeError:
        return ""


def _no_repository_name(name: str) -> None:
    if name:
        raise Unsupported("'repository_name' specification is not supported")


# Each log setting's one-of field and the word Triton's gRPC refusal uses for it, in the
# order Triton checks them (a setting with no value set is refused as a wrong one).
_LOG_SETTING_FIELDS = {"log_info": ("bool_param", "boolean"), "log_warning": ("bool_param", "boolean"),
                       "log_error": ("bool_param", "boolean"), "log_verbose_level": ("uint32_param", "int32"),
                       "log_format": ("string_param", "string")}


def _log_changes(settings) -> dict:
    if "log_file" in settings:
        raise Unsupported("log file location can not be updated through network protocol")
    changes = {}
    for key, (field, kind) in _LOG_SETTING_FIELDS.items():
        if key in settings:
            if settings[key].WhichOneof("parameter_choice") != field:
                raise InvalidArgument(f"expect {kind} for '{key}'")
            changes[key] = getattr(settings[key], field)
    return changes


def _load_parameters(parameters) -> dict:
    """The load's parameters as plain values, each of the type Triton's gRPC takes (``config`` a
    string, a file's contents bytes: HTTP's base64 text is not taken here), refused with its words."""
    values: dict[str, str | bytes] = {}
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if key == "config":
            if kind != "string_param":
                raise InvalidArgument("invalid value type for load parameter 'config', expected string_param.")
            values[key] = parameter.string_param
        elif key.startswith("file:"):
            if kind != "bytes_param":
                raise InvalidArgument(f"invalid value type for load parameter '{key}', expected bytes_param.")
            values[key] = parameter.bytes_param
        else:
            raise InvalidArgument(f"unrecognized load parameter '{key}'.")
    return values


def bind_grpc(service: GrpcInferenceService, address: str, port: int, max_message_bytes: int = MAX_MESSAGE_BYTES,
              reuse_port: bool = False, keepalive: GrpcKeepalive = GrpcKeepalive(),
              tls: GrpcTls | None = None) -> tuple[grpc.aio.Server, int]:
    """A server bound to ``address:port``, to be started; PortInUse if the port is taken (checked
    first, so that grpc's own bind failure, a multi-line log, is never reached)."""
    check_free("GRPC", address, port, reuse_port)
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.keepalive_time_ms", keepalive.time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", keepalive.min_recv_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
    ]
    if keepalive.max_age_ms:   # as Triton: set only when given
        options.append(("grpc.max_connection_age_ms", keepalive.max_age_ms))
    if keepalive.max_age_grace_ms:
        options.append(("grpc.max_connection_age_grace_ms", keepalive.max_age_grace_ms))
    credentials = tls.grpcio_credentials() if tls is not None else None
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(_handlers(service))
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{address}:{port}")
        else:
            bound = server.add_secure_port(f"{address}:{port}", credentials)
    except RuntimeError:   # taken between the check and here, or (TLS) credentials grpc cannot use
        check_free("GRPC", address, port, reuse_port)
        if tls is None:
            raise PortInUse("GRPC", address, port) from None
        raise PortInUse("GRPC", address, port, f"cannot serve TLS: grpc refused --grpc-server-cert "
                                               f"'{tls.cert_file}' or --grpc-server-key '{tls.key_file}'") from None
    return server, bound


SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def never_costly(message: bytes | memoryview) -> bool:
    return False


class RpcMethod(NamedTuple):
    name: str
    streaming: bool
    parse: Callable[[bytes | memoryview], Any]   # bytes -> request message, or UNPARSABLE
    serialize: Callable[[Any], bytes]             # response message -> bytes
    # a request message whose reading would hold the event loop for long (``costly``) is read
    # on a thread first (``read_ahead``), and what that gives is passed to the servicer instead
    costly: Callable[[bytes | memoryview], bool] = never_costly
    read_ahead: Callable[[bytes | memoryview], Any] = bytes


def rpc_methods() -> Iterator[RpcMethod]:
    """Every RPC of Triton's service."""
    for method in SERVICE.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        response_type = getattr(service_pb2, method.output_type.name)
        # Inference requests' bytes are read by the service (InferRequestReader), which knows
        # the metadata it has seen, and its stream answers are bytes already; every other
        # request is parsed here.
        if request_type is service_pb2.ModelInferRequest:
            yield RpcMethod(method.name, method.client_streaming, bytes, _as_bytes, costly_to_read, ReadAhead.of)
        else:
            yield RpcMethod(method.name, method.client_streaming, _lenient(request_type.FromString),
                            response_type.SerializeToString)


def _as_bytes(answer: Any) -> bytes:
    """An inference answer as the wire takes it: bytes pass as they are (ModelStreamInfer's),
    a message is serialized (grpc.aio's ModelInfer returns one)."""
    return answer if isinstance(answer, bytes) else answer.SerializeToString()


def health_check_method() -> tuple[str, Callable, Callable]:
    """``grpc.health.v1.Health/Check``: (path, lenient request parser, response serializer)."""
    return f"/{HEALTH_SERVICE}/Check", _lenient(HealthCheckRequest.FromString), HealthCheckResponse.SerializeToString


def _handlers(servicer: GrpcInferenceService) -> tuple[grpc.GenericRpcHandler, ...]:
    handlers = {}
    for method in rpc_methods():
        make = grpc.stream_stream_rpc_method_handler if method.streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=method.parse,
                                     response_serializer=method.serialize)
    _, parse, serialize = health_check_method()
    health = {"Check": grpc.unary_unary_rpc_method_handler(servicer.health.Check, request_deserializer=parse,
                                                            response_serializer=serialize)}
    return (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, health))


def _traceparent(metadata: Sequence[tuple[bytes | str, bytes | str]]) -> str | None:
    """The W3C traceparent among a call's metadata (name, value pairs, bytes as HTTP/2 gives them or str)."""
    for name, value in metadata:
        if name in (b"traceparent", "traceparent"):
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None
