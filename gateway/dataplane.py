"""The transport-free core of the gateway: what every front end (HTTP now, gRPC later) calls.

It answers health, metadata and config from the model table pushed by the broker,
validates inference requests against the model's config, and forwards them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial

from tritium.gateway.broker_link import BrokerLink
from tritium.gateway.classification import classify
from tritium.gateway.generate import SINGLE_RESPONSE_ONLY, generate_request, generate_response
from tritium.gateway.inference import InferRequest, InferResult, OutputTensor
from tritium.gateway.model_table import ModelSpec, parse_version, server_not_ready
from tritium.gateway.shared_memory import SHM_DISABLED, open_region
from tritium.gateway.tracing import NO_TRACING
from tritium.gateway.validation import check_requested_outputs, check_single_response, validate_inputs
from tritium.repo.names import check_load_parameters
from tritium import __version__
from tritium.errors import InternalError, InvalidArgument, NotFound, TritiumError, Unavailable, Unsupported
from tritium.logs import known_changes
from tritium.protocol import (ChangeLogSettings, Control, ControlArgsUnion, IndexQuery, Infer, LoadModel,
                              RegisterRegion, StatsQuery, TraceSettingsQuery, UnloadModel, UnregisterRegion,
                              pack_tensors, tensor_views)

log = logging.getLogger(__name__)

HTTP_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"
GRPC_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"

# Triton's extension names, in Triton's order, limited to what tritium implements.
EXTENSIONS = ("classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "model_configuration", "system_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace",
              "logging")


@dataclass(frozen=True)
class ServerIdentity:
    name: str = "triton"       # Triton's --id default; clients may look for it
    version: str = __version__


class DataPlane:
    def __init__(self, link: BrokerLink, identity: ServerIdentity = ServerIdentity(),
                 strict_readiness: bool = True, allow_client_shm: bool = False,
                 max_inflight_requests: int = 0) -> None:
        self.link = link
        self.max_inflight_requests = max_inflight_requests   # 0: unbounded
        self._controls_waiting = 0
        self.allow_client_shm = allow_client_shm
        self.identity = identity
        self.strict_readiness = strict_readiness
        self.shutting_down = False
        self.tracer = NO_TRACING   # gateway/server.py sets the GatewayTracer

    # -- health and metadata ------------------------------------------------------------

    def live(self) -> bool:
        return self.link.models.failed is None   # (a server that could not start is not live, as in Triton)

    def require_started(self) -> None:
        """Unavailable ('Server not ready', Triton's words) when the server could not start."""
        if self.link.models.failed is not None:
            raise server_not_ready()

    def ready(self) -> bool:
        """Strict: every model version is READY; otherwise: the models loaded at startup have
        settled (Triton opens its endpoints only then)."""
        table = self.link.models
        if self.shutting_down or not table.received or self.link.broker_lost or table.failed is not None:
            return False
        return table.server_ready or (not self.strict_readiness and table.started)

    def model_ready(self, name: str, version: str | None) -> None:
        """Return if ready, else InvalidArgument (400), as Triton 2.51 answers every model or
        version that is not ready, one it never had or a name it does not know included."""
        self.require_started()
        try:
            _, number = self.link.models.resolve(name, version)
        except (Unavailable, NotFound):
            raise InvalidArgument("Model version not ready") from None
        if number in self.link.models.get(name).unhealthy or self.link.broker_lost:
            raise InvalidArgument("Model version not ready")

    def server_metadata(self) -> dict:
        return {"name": self.identity.name, "version": self.identity.version,
                "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str | None) -> dict:
        spec, number = self.link.models.resolve(name, version)
        versions = [str(number)] if version else [str(v) for v in self.link.models.get(name).ready_versions]
        return {
            "name": spec.name,
            "versions": versions,
            "platform": spec.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype.name, "shape": spec.metadata_shape(t)}
                       for t in spec.inputs.values()],
            "outputs": [{"name": t.name, "datatype": t.datatype.name, "shape": spec.metadata_shape(t)}
                        for t in spec.outputs.values()],
        }

    def model_config(self, name: str, version: str | None) -> bytes:
        spec, _ = self.link.models.resolve(name, version)
        return spec.config_json

    async def statistics(self, name: str | None, version: str | None) -> dict:
        self.require_started()
        query = StatsQuery(name, parse_version(version) if version else None)
        return {"model_stats": await self._control(query)}

    # -- the model repository extension ----------------------------------------------------

    async def repository_index(self, ready_only: bool) -> list[dict]:
        self.require_started()
        return await self._control(IndexQuery(ready_only))

    async def load_model(self, name: str, parameters: dict) -> None:
        """Returns once the model is loaded (its table already here), or raises why it is not."""
        self.require_started()
        # The parameters before it is sent, as Triton reads them before it looks at its mode (the
        # broker checks a model's own loads too); the name after the mode, in the broker.
        check_load_parameters(name, parameters)
        await self._control(LoadModel(name, parameters))

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.require_started()
        await self._control(UnloadModel(name, unload_dependents))

    async def _control(self, args: ControlArgsUnion):
        model = getattr(args, "model", None)
        log.debug("control request %s%s", args.op.value, f" for model {model}" if model else "")
        self._controls_waiting += 1   # not inference: the in-flight limit does not count them
        try:
            reply = (await self.link.request(Control(self.link.next_rid(), args))).message
        finally:
            self._controls_waiting -= 1
        if reply.error is not None:
            raise reply.error
        return reply.result

    # -- inference ----------------------------------------------------------------------

    async def infer(self, request: InferRequest, single_response_only: str = HTTP_DECOUPLED) -> InferResult:
        """One request, one response; a decoupled model is refused with ``single_response_only``."""
        spec, version, header, inline, external = self._prepare(request, single_response_only)
        reply = await self.link.request(header, inline, external)
        result = self._result(spec, version, request, reply)
        if request.trace is not None:
            request.trace.finish()
        if isinstance(result, TritiumError):
            raise result
        return result

    def infer_then(self, request: InferRequest, done: Callable[[InferResult | TritiumError], None],
                   single_response_only: str = HTTP_DECOUPLED) -> Callable[[], None]:
        """``infer`` without a coroutine: ``done`` gets the result or the error once. Returns what
        to call when the client gives up on the request (a queued one is then cancelled).

        A request refused before it is sent raises here, in the caller's frame.
        """
        spec, version, header, inline, external = self._prepare(request, single_response_only)

        def answered(reply) -> None:
            done(reply if isinstance(reply, TritiumError) else self._result(spec, version, request, reply))

        self.link.request_then(header, inline, external, answered)
        return partial(self.link.cancel, header.rid, spec.name, version)

    def check_model(self, name: str, version: str | None) -> ModelSpec:
        """The model's spec, or why a request for it is refused (ModelTable.resolve): Triton looks
        for the model before it reads the inputs."""
        return self.link.models.resolve(name, version)[0]

    def infer_stream_then(self, request: InferRequest,
                          deliver: Callable[[InferResult | TritiumError | None, bool], None],
                          traced: bool = False, every_response_completes: bool = False) -> Callable[[], None]:
        """Every answer to one request as it comes, to ``deliver``: (result, error, or None for an
        empty one; whether it is the last). A request refused before it is sent raises here.
        Returns what to call when the client gives up on the request. ``traced``: the request may
        be sampled for tracing (the caller stamps its sends and finishes its trace), each of its
        responses an INFER_RESPONSE_COMPLETE with ``every_response_completes``."""
        spec, version, header, inline, external = self._prepare(request, None, traced)
        if request.trace is not None:
            request.trace.every_response = every_response_completes

        def answered(reply) -> None:
            if isinstance(reply, TritiumError):
                deliver(reply, True)
                return
            answer = reply.message
            if answer.empty:
                if request.trace is not None:   # (a flags-only final response carries a traced request's stamps)
                    request.trace.answered(answer)
                deliver(None, answer.final is not False)
                return
            deliver(self._result(spec, version, request, reply), answer.final is not False)

        self.link.request_stream_then(header, inline, external, answered)
        return partial(self.link.cancel, header.rid, spec.name, version)

    async def infer_stream(self, request: InferRequest, traced: bool = False, every_response_completes: bool = False
                           ) -> AsyncGenerator[tuple[InferResult | TritiumError | None, bool], None]:
        """``infer_stream_then`` as an async iterator; closed before the last answer (its client
        left), it gives the request up."""
        answers: asyncio.Queue = asyncio.Queue()
        give_up = self.infer_stream_then(request, lambda answer, final: answers.put_nowait((answer, final)), traced,
                                         every_response_completes)
        final = False
        try:
            while not final:
                answer, final = await answers.get()
                yield answer, final
        finally:
            if not final:
                give_up()

    def _prepare(self, request: InferRequest, single_response_only: str | None, traced: bool = True):
        if self.max_inflight_requests:
            waiting = self.link.waiting - self._controls_waiting
            if waiting >= self.max_inflight_requests:
                raise Unavailable(f"the server is overloaded: {waiting} requests are in flight on this "
                                  f"gateway, its limit (--max-inflight-requests); try again later")
        spec, version = self.link.models.resolve(request.model, request.version)
        self._read_shared_memory(request)
        if single_response_only is not None:   # the front end's refusal, not the core's: no request id
            check_single_response(spec, single_response_only)
        check_requested_outputs(spec, request)   # before the inputs, as Triton's core checks them
        try:
            batch_size = validate_inputs(spec, request)
        except TritiumError as exc:   # Triton's core finds these, and names even a request without an id
            raise _with_request_id(exc, request.id or "<id_unknown>") from None
        descriptors, inline, external = pack_tensors((t.name, t.datatype, t.shape, t.data) for t in request.inputs)
        if self.tracer.on and traced:
            request.trace = self.tracer.sample(spec.name, version, request.traceparent)
            if request.trace is not None:
                request.trace.request_id = request.id
                if request.trace.tensors:
                    request.trace.record_tensors(True, request.inputs)
        message = Infer(self.link.next_rid(), spec.name, descriptors, version=version, batch_size=batch_size,
                        request_id=request.id or None,
                        outputs=None if request.outputs is None else [o.name for o in request.outputs],
                        params=request.parameters or None, sequence_id=request.sequence_id or None,
                        sequence_flags=request.sequence_flags, external=len(external),
                        trace=None if request.trace is None else request.trace.context,
                        trace_tensors=request.trace is not None and request.trace.tensors)
        return spec, version, message, inline, external

    def _result(self, spec: ModelSpec, version: int, request: InferRequest, reply) -> InferResult | TritiumError:
        """The request's result or error; never raises, since it runs in the broker link's callback,
        where an exception would leave the request without an answer."""
        try:
            return self._read_answer(spec, version, request, reply)
        except TritiumError as exc:
            return exc
        except Exception as exc:
            log.exception("reading an answer of model %s", spec.name)
            return InternalError(f"internal error reading the answer of model '{spec.name}': "
                                 f"{type(exc).__name__}: {exc}")

    def _read_answer(self, spec: ModelSpec, version: int, request: InferRequest, reply) -> InferResult | TritiumError:
        answer = reply.message
        if request.trace is not None:
            request.trace.answered(answer)
        if answer.error is not None:
            return answer.error   # the scheduler's and the model's errors: Triton adds no request id to them
        descriptors = answer.outputs or []
        views = tensor_views(descriptors, reply.record, reply.offset, reply.external)
        outputs = [OutputTensor(d[0], d[1], d[2], view) for d, view in zip(descriptors, views)]
        if request.trace is not None and request.trace.tensors:
            request.trace.record_tensors(False, outputs)
        if request.outputs and any(o.classification or o.shared_memory for o in request.outputs):
            try:
                outputs = _classified(spec, request.outputs, outputs)
                self._write_shared_memory(request.outputs, outputs)
            except TritiumError as exc:
                return exc
        return InferResult(spec.name, version, request.id, outputs, answer.params or {})

    # -- generate ---------------------------------------------------------------------------

    def generate_request(self, name: str, version: str | None, document: dict, body: bytes = b"") -> InferRequest:
        """The inference request a ``/generate`` or ``/generate_stream`` body (``document``, parsed) asks for."""
        spec, _ = self.link.models.resolve(name, version)
        return generate_request(spec, version, document, body)

    async def generate(self, request: InferRequest) -> bytes:
        """``/generate``: the model's one response as flat JSON (decoupled models too). A sampled
        request's trace is the caller's to finish."""
        results = [result async for result in self._generated(request, False)]
        if len(results) != 1:   # an error after a response counts as a second response, as in Triton
            raise InvalidArgument(SINGLE_RESPONSE_ONLY)
        if isinstance(results[0], TritiumError):   # 400 whatever its code, as from Triton (and /generate_stream)
            raise InvalidArgument(results[0].message)
        return results[0]

    def generate_stream(self, request: InferRequest) -> AsyncGenerator[bytes | TritiumError, None]:
        """``/generate_stream``: each response as flat JSON, an error ending the stream. The
        request may be sampled for tracing (``request.trace``; the caller finishes it)."""
        return self._generated(request, True)

    async def _generated(self, request: InferRequest, stream: bool) -> AsyncGenerator[bytes | TritiumError, None]:
        async with aclosing(self.infer_stream(request, traced=True, every_response_completes=stream)) as answers:
            async for result, _final in answers:
                if isinstance(result, TritiumError):
                    yield result
                    return
                if result is None:  # an empty final response only closes the stream
                    continue
                try:
                    event = generate_response(result)
                except TritiumError as exc:  # an output JSON cannot carry
                    yield exc
                    return
                yield event

    # -- logging --------------------------------------------------------------------------

    async def log_settings(self, changes: dict | None = None) -> dict:
        """Triton's logging settings, after applying ``changes`` to every process."""
        return await self._control(ChangeLogSettings(known_changes(changes) if changes else {}))

    # -- trace ----------------------------------------------------------------------------

    def check_trace_model(self, model: str | None) -> None:
        """A model's trace settings need the model ready; Triton checks before it reads the body."""
        if model is not None:
            try:
                self.link.models.resolve(model, None)
            except TritiumError:
                raise InvalidArgument(f"Request for unknown model : {model}") from None

    async def trace_settings(self, model: str | None, changes: dict | None = None) -> dict:
        """Triton's trace settings (global, or ``model``'s), after applying ``changes``."""
        self.check_trace_model(model)
        return await self._control(TraceSettingsQuery(model, changes or {}, self.tracer.startup.as_wire()))

    # -- system shared memory ---------------------------------------------------------------

    def _read_shared_memory(self, request: InferRequest) -> None:
        """Inputs named by region get their bytes; output regions are checked before inference."""
        regions = self.link.shared_memory
        for tensor in request.inputs:
            if tensor.shared_memory is not None:
                tensor.data = regions.read(tensor.shared_memory)
        for output in request.outputs or ():
            if output.shared_memory is not None:
                output.region = regions.check(output.shared_memory)

    def _write_shared_memory(self, requested: list, outputs: list[OutputTensor]) -> None:
        targets = {o.name: o for o in requested if o.shared_memory is not None}
        for output in outputs:
            target = targets.get(output.name)
            if target is not None:
                self.link.shared_memory.write(target.shared_memory, output.name, output.data, target.region)
                output.in_shared_memory = True

    def shared_memory_status(self, name: str | None) -> list[dict]:
        return self.link.shared_memory.status(name)

    async def register_shared_memory(self, name: str, key, offset, byte_size) -> None:
        if not self.allow_client_shm:
            raise Unsupported(SHM_DISABLED)
        if not isinstance(key, str):
            raise InvalidArgument("Shared memory register request has no 'key' field")
        if byte_size is None:
            raise InvalidArgument("Shared memory register request has no 'byte_size' field")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"Unable to parse '{field}': expected an unsigned integer")
        os.close(open_region(key, offset, byte_size, name))  # fails here, for this client, if it cannot be opened
        await self._control(RegisterRegion(name, key, offset, byte_size))

    async def unregister_shared_memory(self, name: str | None) -> None:
        if not self.allow_client_shm:
            raise Unsupported(SHM_DISABLED)
        await self._control(UnregisterRegion(name))


def _classified(spec: ModelSpec, requested: list, outputs: list[OutputTensor]) -> list[OutputTensor]:
    counts = {o.name: o.classification for o in requested if o.classification}
    if not counts:
        return outputs
    return [classify(o, counts[o.name], spec.labels.get(o.name, ()), spec.max_batch_size > 0)
            if o.name in counts else o for o in outputs]


# Found by Triton's model object rather than its request checks: said without the request.
_WITHOUT_REQUEST_ID = ("unexpected inference input '", "incomplete string data for inference input '")


def _with_request_id(error: TritiumError, request_id: str) -> TritiumError:
    """Triton prefixes the errors its core finds in a request with the request's id (not the
    model's own errors, which come back as the model words them)."""
    if not request_id or error.message.startswith(("[request id: ", *_WITHOUT_REQUEST_ID)):
        return error
    return type(error)(f"[request id: {request_id}] {error.message}")
