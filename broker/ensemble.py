"""Ensembles, run by the broker as a dependency graph of internal requests.

An ensemble version has no instances. A request for it becomes one INFER per step,
submitted to the step model's normal queue (so steps batch with that model's other
traffic) as soon as every tensor the step reads exists. The steps' answers come back
here instead of going to a socket: their client is ``STEP_CLIENT``, which the scheduler
recognizes by identity (``is``), so no peer can pose as it.

No tensor frame is copied: an external frame travels on to the next step, and to the
client, as the same ZeroMQ frame object. Inline tensors (each under ``INLINE_LIMIT``)
are copied into the next record, as every hop does with bytes that small.

Only the steps that lead to the outputs the client asked for run, and only those
outputs are returned. The first failing step answers the request with Triton's text,
``in ensemble 'E', <the step's message>``, and the results of its other steps are
dropped: every request gets exactly one answer.

An ensemble with a decoupled step is decoupled (repo/ensembles.py). Each response of a
decoupled step is an iteration of its own: the steps that read it run once for it, and
the ensemble answers each time the requested outputs of one iteration are complete; its
final response (flags only, unless the last answer can carry it) follows once no step is
running. Tensors are kept per (name, iteration); the ensemble's inputs are iteration 0.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tritium.broker.registry import ModelVersion, Registry
from tritium.errors import Cancelled, InternalError, InvalidArgument, TritiumError
from tritium.input_checks import check_input_names, unexpected_output
from tritium.protocol import Infer, ProtocolError, Response, read_record, split_record, tensor_views
from tritium.tracing.stamps import ensemble_record, step_context, step_record
from tritium.tracing.tensors import raw_answer_tensors, raw_tensors

log = logging.getLogger(__name__)

# The client identity of step requests. ZeroMQ identities are bytes too, so the
# scheduler compares with ``is``: only this object routes an answer back here.
STEP_CLIENT = b"\0ensemble-step"
NO_TIMINGS = (0, 0, 0)
_MEMO_LIMIT = 64   # requested-output combinations remembered per ensemble

Submit = Callable[[bytes, object, Infer, list | None, bool], None]
Reply = Callable[[bool, list, tuple], None]
Remember = Callable[[ModelVersion, bytes, list], None]


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model: str
    version: int                           # -1: the latest ready version
    reads: tuple[tuple[str, str], ...]     # (model input, ensemble tensor)
    writes: dict[str, str]                 # model output -> ensemble tensor
    sources: tuple[str, ...]               # the ensemble tensors it reads (those of ``reads``, kept for speed)

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model}')"


class Plan:
    """One ensemble config as a graph: its steps, who produces and who reads each tensor."""

    def __init__(self, config) -> None:
        self.name = config.name
        self.batching = config.max_batch_size > 0
        self._policy = config.model_transaction_policy
        # Config order: the order of the outputs when the client names none.
        self.outputs = {t.name: list(t.reshape.shape if t.HasField("reshape") else t.dims) for t in config.output}
        self.optional = tuple(t.name for t in config.input if t.optional)
        self.steps = tuple(
            Step(index, s.model_name, s.model_version, reads := tuple(sorted(s.input_map.items())),
                 dict(s.output_map), tuple(tensor for _, tensor in reads))
            for index, s in enumerate(config.ensemble_scheduling.step))
        self.producer = {tensor: step for step in self.steps for tensor in step.writes.values()}
        self.max_inflight = config.ensemble_scheduling.max_inflight_requests   # per step; 0: no limit
        readers: dict[str, set[int]] = {}
        for step in self.steps:
            for tensor in step.sources:
                readers.setdefault(tensor, set()).add(step.index)
        # Per step, in step order, the steps that read what it writes: those its answer may start.
        self.downstream = {step.index: tuple(self.steps[i] for i in sorted(
            {i for tensor in step.writes.values() for i in readers.get(tensor, ())})) for step in self.steps}
        self._needed: dict[frozenset, Needs] = {}

    @property
    def decoupled(self) -> bool:
        """Set at load when a step is decoupled, and again when a step's model is reloaded (read
        live: a reload keeps this plan)."""
        return self._policy.decoupled

    def needed(self, requested: Sequence[str]) -> "Needs":
        """The steps that lead to ``requested``, and per step the outputs to ask of it."""
        key = frozenset(requested)
        memo = self._needed.get(key)
        if memo is not None:
            return memo
        tensors, pending, steps = set(key), list(key), set()
        while pending:
            step = self.producer.get(pending.pop())
            if step is None or step.index in steps:
                continue
            steps.add(step.index)
            for _, tensor in step.reads:
                if tensor not in tensors:
                    tensors.add(tensor)
                    pending.append(tensor)
        wants = {i: [out for out, tensor in self.steps[i].writes.items() if tensor in tensors] for i in steps}
        known = all(name in self.outputs for name in key)
        memo = Needs(frozenset(steps), tuple(self.steps[i] for i in sorted(steps)), wants, known)
        if len(self._needed) < _MEMO_LIMIT:
            self._needed[key] = memo
        return memo


@dataclass(frozen=True, slots=True)
class Needs:
    """What a request for some of an ensemble's outputs runs (``Plan.needed``)."""

    steps: frozenset[int]          # the steps that lead to the outputs
    ordered: tuple[Step, ...]      # those steps, in step order
    wants: dict[int, list[str]]    # per step: the outputs to ask of it
    known: bool                    # every requested output is one of the ensemble's


@dataclass(frozen=True, slots=True)
class StepModel:
    """What building a step's request needs to know of the model it goes to."""

    batching: bool
    dims: dict[str, list[int]]   # input name -> configured dims
    decoupled: bool
    ensemble: bool               # run here, not in an instance's batch

    @classmethod
    def of(cls, version: ModelVersion) -> "StepModel":
        config = version.definition.config
        return cls(config.max_batch_size > 0, {t.name: list(t.dims) for t in config.input},
                   config.model_transaction_policy.decoupled, version.ensemble)


# Tensor and StepCall are made per request and never changed; not frozen, since a frozen
# dataclass takes four times as long to make.
@dataclass(slots=True)
class Tensor:
    datatype: str
    shape: list
    nbytes: int
    data: object        # inline: a view of the record it came in; external: its ZeroMQ frame
    external: bool
    batch_size: int     # 0: made by a model that does not batch (Triton's rule for reshaping)


@dataclass(eq=False, slots=True)
class EnsembleRequest:
    client: bytes
    rid: int
    from_backend: bool
    version: ModelVersion
    plan: Plan
    requested: list[str]
    steps: frozenset[int]              # the steps the requested outputs need
    wants: dict[int, list[str]]        # per step: the outputs to ask of it
    batch_size: int                    # the client's, for statistics
    arrival_ns: int
    request_id: str | None
    params: dict | None
    correlation_id: int | str = 0      # the request's sequence, passed to every step as Triton does
    flags: int = 0                     # sequence START (1) / END (2)
    # (name, iteration) -> the tensor; None: an optional input left out
    tensors: dict[tuple[str, int], Tensor | None] = field(default_factory=dict)
    started: set[tuple[int, int]] = field(default_factory=set)   # (step index, iteration)
    iterations: dict[int, int] = field(default_factory=dict)     # decoupled step -> its responses with outputs
    answered: set[int] = field(default_factory=set)              # iterations answered (decoupled ensembles)
    calls: set[int] = field(default_factory=set)    # step requests not answered yet
    # Decoupled step requests whose batch has not reported its compute times: they answer
    # while they execute, so the times come after the answers, and the ensemble's
    # statistics wait for them (Triton counts an ensemble request once every step request
    # is released).
    unexecuted: set[int] = field(default_factory=set)
    compute: list[int] = field(default_factory=lambda: [0, 0, 0])
    queue_ns: int = 0
    finished: bool = False
    starting: bool = False             # inside _start_ready: a step answered at once must not end it
    waiting: int = 0                   # its step starts waiting for room (max_inflight_requests)
    stats_due: bool = False            # answered; its statistics wait for ``unexecuted``
    trace: bytes | None = None         # its trace context, when traced
    trace_tensors: bool = False        # traced at level TENSORS: its steps' tensors too
    traced_steps: list = field(default_factory=list)   # the finished steps' trace records
    cache_key: bytes | None = None     # response_cache: the key its answer is kept under


@dataclass(eq=False, slots=True)
class StepLimit:
    """``max_inflight_requests`` of one ensemble version: the step requests each of its steps has
    out, across all its requests, and the starts that wait for one of them to end."""

    most: int
    out: dict[int, int] = field(default_factory=dict)   # step index -> step requests not finally answered
    waiting: dict[int, deque[tuple[EnsembleRequest, Step, int]]] = field(default_factory=dict)

    def take(self, index: int) -> bool:
        """Whether a request of step ``index`` may go out now (it then counts)."""
        out = self.out.get(index, 0)
        if out >= self.most:
            return False
        self.out[index] = out + 1
        return True


@dataclass(slots=True)
class StepCall:
    request: EnsembleRequest
    step: Step
    batch_size: int   # of the step request; 0 when its model does not batch
    iteration: int    # of the tensors it reads
    decoupled: bool   # its model answers 0..N times
    version: int      # of its model, as its INFER names it
    trace: tuple | None = None   # the step request's (trace context, model version), when traced
    # Traced at level TENSORS: its inputs, and the outputs of its responses so far (raw_tensors).
    traced_inputs: list | None = None
    traced_outputs: list | None = None


class EnsembleRunner:
    """Every ensemble request in flight, and the step requests it waits for."""

    def __init__(self, registry: Registry, submit: Submit, reply: Reply, clock: Callable[[], int],
                 remember: Remember) -> None:
        self.registry = registry
        self._submit = submit   # Scheduler.submit: a step joins its model's queue
        self._reply = reply     # Scheduler._reply: an answer to a gateway, an instance or an outer ensemble
        self._clock = clock
        self._remember = remember   # Scheduler.remember: an answer into the response cache
        self._rids = itertools.count(1)
        self._calls: dict[int, StepCall] = {}
        # Step requests of ensembles with max_inflight_requests, until their final answer (their
        # ensemble request may have been answered before it): rid -> (its limit, step index).
        self._limited: dict[int, tuple[StepLimit, int]] = {}
        self._limits: weakref.WeakKeyDictionary[ModelVersion, StepLimit] = weakref.WeakKeyDictionary()
        self._ended: deque[int] = deque()   # limited step requests just ended, their room to hand on
        self._releasing = False
        self._executing: dict[int, EnsembleRequest] = {}   # decoupled step rid -> its request, until executed
        self._plans: weakref.WeakKeyDictionary[ModelVersion, Plan] = weakref.WeakKeyDictionary()
        self._models: weakref.WeakKeyDictionary[ModelVersion, StepModel] = weakref.WeakKeyDictionary()

    @property
    def busy(self) -> bool:
        return bool(self._calls or self._limited)   # a start waiting for room waits for a step request out

    # -- a request arrives -------------------------------------------------------------------

    def submit(self, client: bytes, record, header: Infer, external: list | None, from_backend: bool,
               version: ModelVersion, cache_key: bytes | None = None) -> None:
        """``cache_key``: the ensemble caches its answers (``response_cache``) and this one is not kept yet."""
        now = self._clock()
        plan = self._plan(version)
        requested = list(header.outputs or plan.outputs)   # none named (or []): all, as Triton
        needs = plan.needed(requested)
        batch_size = header.batch_size or 1
        request = EnsembleRequest(client, header.rid, from_backend, version, plan, requested, needs.steps,
                                  needs.wants, batch_size, now, header.request_id, header.params,
                                  header.sequence_id or 0, header.sequence_flags, trace=header.trace,
                                  trace_tensors=header.trace is not None and header.trace_tensors,
                                  cache_key=cache_key)
        if not needs.known:
            unknown = next(name for name in requested if name not in plan.outputs)   # the first the client named
            self._fail(request, unexpected_output(plan.name, unknown))
            return
        try:
            descriptors = header.inputs
            view, offset = split_record(record)
            datas = _tensor_data(descriptors, view, offset, [_owned(frame) for frame in external or ()])
        except ProtocolError as exc:
            self._fail(request, InvalidArgument(f"malformed inference request: {exc}"))
            return
        tensor_batch = batch_size if plan.batching else 0
        tensors = request.tensors
        for descriptor, data in zip(descriptors, datas):   # shapes are shared, never changed (nothing writes to one)
            tensors[descriptor[0], 0] = Tensor(descriptor[1], descriptor[2], descriptor[3], data, descriptor[4],
                                               tensor_batch)
        for name in plan.optional:
            tensors.setdefault((name, 0), None)
        request.queue_ns = self._clock() - now
        self._start_ready(request, needs.ordered, 0)
        self._end_if_done(request)

    # -- steps out ---------------------------------------------------------------------------

    def _start_ready(self, request: EnsembleRequest, candidates: Sequence[Step], iteration: int) -> None:
        """Start the candidates whose inputs all exist. A step may answer inside its start (from
        the response cache): the request then has no step running for a moment, but its later
        candidates are still to start, so it is not over (``_end_if_done`` waits for the end)."""
        started, needed, tensors = request.started, request.steps, request.tensors
        outer, request.starting = request.starting, True
        try:
            for step in candidates:
                if request.finished:
                    return  # a step failed at once (its model is not ready, say)
                if step.index not in needed or (step.index, iteration) in started:
                    continue
                for tensor in step.sources:
                    if (tensor, iteration) not in tensors:
                        break
                else:
                    self._start(request, step, iteration)
        finally:
            request.starting = outer

    def _end_if_done(self, request: EnsembleRequest) -> None:
        """With no step running and none to start, the request is over: a decoupled ensemble sends
        its final flag; any other has not answered, so its outputs can never be complete."""
        if request.finished or request.calls or request.starting or request.waiting:
            return
        if request.plan.decoupled:
            self._send(request, [], [], [], final=True, empty=True)
        else:
            self._fail(request, InvalidArgument(
                f"in ensemble '{request.plan.name}', unexpected deadlock, at least one output is not set "
                "while no more ensemble steps can be made"))

    def _start(self, request: EnsembleRequest, step: Step, iteration: int) -> None:
        request.started.add((step.index, iteration))
        limit = self._limit(request)
        if limit is not None and not limit.take(step.index):   # it goes when one of the step's requests ends
            limit.waiting.setdefault(step.index, deque()).append((request, step, iteration))
            request.waiting += 1
            return
        self._send_step(request, step, iteration, limit)

    def _limit(self, request: EnsembleRequest) -> StepLimit | None:
        if not request.plan.max_inflight:
            return None
        limit = self._limits.get(request.version)
        if limit is None:
            limit = self._limits[request.version] = StepLimit(request.plan.max_inflight)
        return limit

    def _step_ended(self, rid: int) -> None:
        """A limited step request has its final answer: the oldest start waiting for its step goes.
        A start answered inside its submit (a cache hit, a refusal) ends in turn: those are released
        here in a loop, not in nested calls, however many wait."""
        self._ended.append(rid)
        if self._releasing:
            return
        self._releasing = True
        try:
            while self._ended:
                limit, index = self._limited.pop(self._ended.popleft())
                limit.out[index] -= 1
                self._start_waiting(limit, index)
        finally:
            self._releasing = False

    def _start_waiting(self, limit: StepLimit, index: int) -> None:
        waiting = limit.waiting.get(index)
        while waiting:
            request, step, iteration = waiting.popleft()
            request.waiting -= 1
            if not request.finished:   # (one that failed meanwhile needs it no more)
                limit.out[index] += 1
                self._send_step(request, step, iteration, limit)
                return

    def _send_step(self, request: EnsembleRequest, step: Step, iteration: int, limit: StepLimit | None) -> None:
        member = self.registry.resolve_step(step.model, step.version)
        model = self._step_model(member) if member is not None else None
        inputs: list[list] = []
        inline: list[object] = []
        frames: list[object] = []
        left_out = False
        for model_input, name in step.reads:
            tensor = request.tensors[name, iteration]
            if tensor is None:   # an optional ensemble input the client left out, or an output a step left out
                left_out = True
                continue
            shape = tensor.shape
            if model is not None:
                shape = _reshaped(shape, tensor.batch_size, model.batching, model.dims.get(model_input))
            inputs.append([model_input, tensor.datatype, shape, tensor.nbytes, tensor.external])
            (frames if tensor.external else inline).append(tensor.data)
        if left_out and member is not None:   # a required input missing: Triton's core refuses the step
            declared = member.declared_inputs
            try:
                check_input_names(step.model, declared, [n for n, spec in declared.items() if not spec.optional],
                                  [descriptor[0] for descriptor in inputs])
            except InvalidArgument as exc:
                self._fail(request, InvalidArgument(f"in ensemble '{request.plan.name}', {exc.message}"))
                if limit is not None:   # the room it took at its step goes to the next start waiting there
                    limit.out[step.index] -= 1
                    self._start_waiting(limit, step.index)
                return
        batching = model is not None and model.batching
        batch_size = inputs[0][2][0] if batching and inputs and inputs[0][2] else 1
        rid = next(self._rids)
        sequence = bool(request.correlation_id)
        # Triton passes the ensemble's parameters on.
        number = member.version if member is not None else step.version
        header = Infer(rid, step.model, inputs, version=number,
                       batch_size=batch_size, request_id=request.request_id or None,
                       outputs=request.wants[step.index], params=request.params or None,
                       sequence_id=request.correlation_id if sequence else None,
                       sequence_flags=request.flags if sequence else 0, external=len(frames),
                       trace=None if request.trace is None else step_context(request.trace),
                       trace_tensors=request.trace_tensors)
        decoupled = model is not None and model.decoupled
        in_a_batch = model is not None and not model.ensemble   # a nested ensemble reports no execution
        call = self._calls[rid] = StepCall(request, step, batch_size if batching else 0, iteration, decoupled,
                                          number, None if header.trace is None else (header.trace, header.version))
        if request.trace_tensors:
            given = (request.tensors[name, iteration] for _, name in step.reads)
            call.traced_inputs = raw_tensors(inputs, [tensor.data for tensor in given if tensor is not None])
            call.traced_outputs = []
        request.calls.add(rid)
        if decoupled and in_a_batch:
            request.unexecuted.add(rid)
            self._executing[rid] = request
        if limit is not None:
            self._limited[rid] = (limit, step.index)
        self._submit(STEP_CLIENT, header.encode(inline), header, frames or None, False)

    # -- answers in --------------------------------------------------------------------------

    def answered(self, parts: list, timings: tuple = NO_TIMINGS) -> None:
        """RESPONSE records (each with its external frames) for step requests; ``parts[0]`` is STEP_CLIENT.

        ``timings`` are the compute times of the batch they ran in; the ensemble's own
        statistics add them up, as Triton's do.
        """
        position = 1
        while position < len(parts):
            try:
                # A record of 64 KiB or more (inline tensors adding up) may lie in an answer pool
                # too, and its inline tensors are slices of it: copied as the frames are.
                header, view, offset = read_record(_owned(parts[position]))
            except ProtocolError as exc:
                log.error("undecodable answer to an ensemble step dropped: %s", exc)
                return
            if not isinstance(header, Response):
                log.error("a %s record instead of a RESPONSE answering an ensemble step dropped", header.kind.name)
                return
            frames = parts[position + 1:position + 1 + header.external]
            position += 1 + header.external
            call = self._calls.get(header.rid)
            ended = header.final is not False and header.rid in self._limited
            if call is not None:   # (None: its request was answered already, another step failed)
                if header.final is not False:   # a decoupled step's call stays open until its final response
                    del self._calls[header.rid]
                    call.request.calls.discard(header.rid)
                self._step_done(call, header, view, offset, frames, timings)
            if ended:
                self._step_ended(header.rid)

    def step_executed(self, rid: int, timings: tuple) -> None:
        """A decoupled step request's batch is done executing: its compute times join its
        ensemble request's, whose statistics may have been waiting for them."""
        request = self._executing.pop(rid, None)
        if request is None:
            return   # its ensemble request failed
        request.unexecuted.discard(rid)
        for index, value in enumerate(timings):
            request.compute[index] += value
        if request.stats_due and not request.unexecuted:
            self._record_success(request, self._clock())

    def _step_done(self, call: StepCall, header: Response, view, offset: int, frames: list, timings: tuple) -> None:
        request, step = call.request, call.step
        if call.trace is not None:
            self._trace_step(call, header, view, offset, frames)
        if header.error is not None:
            error = header.error
            log.info("ensemble %s: %s failed: %s", request.plan.name, step.label, error.message)
            self._fail(request, type(error)(f"in ensemble '{request.plan.name}', {error.message}"))
            return
        if header.final is False and not call.decoupled:
            self._fail(request, InternalError(f"in ensemble '{request.plan.name}', {step.label} answered with "
                                              "several responses, but its model is not decoupled"))
            return
        descriptors = header.outputs or []
        try:
            datas = _tensor_data(descriptors, view, offset, [_owned(frame) for frame in frames])
        except ProtocolError as exc:
            self._fail(request, InternalError(f"in ensemble '{request.plan.name}', {step.label} answered "
                                              f"with a malformed response: {exc}"))
            return
        compute = request.compute
        compute[0] += timings[0]
        compute[1] += timings[1]
        compute[2] += timings[2]
        iteration = call.iteration
        if call.decoupled and descriptors:   # each response with outputs is an iteration of its own
            iteration = request.iterations.get(step.index, 0)
            request.iterations[step.index] = iteration + 1
        produced = False   # a requested output arrived
        tensors, writes, requested = request.tensors, step.writes, request.requested
        for descriptor, data in zip(descriptors, datas):   # shapes are shared, never changed (nothing writes to one)
            name = writes.get(descriptor[0])
            if name is not None and (name, iteration) not in tensors:
                tensors[name, iteration] = Tensor(descriptor[1], descriptor[2], descriptor[3], data, descriptor[4],
                                                  call.batch_size)
                produced = produced or name in requested
        if descriptors or not call.decoupled:
            # An output the model left out is none, as in Triton: the answer goes without it, and a
            # step reading it runs without it (as an optional input).
            for name in writes.values():
                if (name, iteration) not in tensors:
                    tensors[name, iteration] = None
                    produced = produced or name in requested
            # Readers of a tensor that was not produced now are not ready, or were started already.
            self._start_ready(request, request.plan.downstream[step.index], iteration)
        # Only a requested output's arrival completes an iteration (each is produced once per
        # iteration): another tensor of a complete iteration must not answer it again. (A step
        # started above may have answered already, from the response cache, and with it this
        # iteration.)
        if produced and not request.finished and iteration not in request.answered and \
                _complete(tensors, requested, iteration):
            self._answer(request, iteration)
        self._end_if_done(request)

    def _trace_step(self, call: StepCall, header: Response, view, offset: int, frames: list) -> None:
        """A traced step's record, made at its final response, as its instance's stamps come with
        it; a decoupled step's responses add their outputs to it (trace level TENSORS)."""
        if call.traced_outputs is not None and header.outputs:
            call.traced_outputs.extend(raw_answer_tensors(header.outputs, view, offset, frames))
        if header.final is not False:
            call.request.traced_steps.append(self._step_record(call, header.trace))

    def _step_record(self, call: StepCall, stamps: dict | None) -> dict:
        assert call.trace is not None
        tensors = None if call.traced_inputs is None else (call.traced_inputs, call.traced_outputs or [])
        return step_record(call.step.model, call.trace, stamps, self._clock(), tensors=tensors)

    # -- the one answer ----------------------------------------------------------------------

    def _answer(self, request: EnsembleRequest, iteration: int) -> None:
        """The requested outputs of one iteration: the one answer, or one of a decoupled
        ensemble's, final when no step is left running."""
        plan = request.plan
        descriptors: list[list] = []
        inline: list[object] = []
        frames: list[object] = []
        for name in request.requested:
            tensor = request.tensors[name, iteration]
            if tensor is None:
                log.debug("Composing models did not output tensor %s", name)
                continue
            shape = _reshaped(tensor.shape, tensor.batch_size, plan.batching, plan.outputs[name])
            descriptors.append([name, tensor.datatype, shape, tensor.nbytes, tensor.external])
            (frames if tensor.external else inline).append(tensor.data)
        if not request.answered:
            request.version.stats.observe_first_response(self._clock() - request.arrival_ns)
        request.answered.add(iteration)
        if plan.decoupled and (request.calls or request.waiting):   # more may come: not the last response
            header = Response(request.rid, descriptors, params=_sequence_parameters(request), final=False,
                              external=len(frames))
            self._reply(request.from_backend, [request.client, header.encode(inline), *frames], NO_TIMINGS)
        else:
            self._send(request, descriptors, inline, frames, final=True if plan.decoupled else None)

    def _send(self, request: EnsembleRequest, descriptors: list, inline: list, frames: list,
              final: bool | None, empty: bool = False) -> None:
        """The request's last response: it is over, and counted in the ensemble's statistics."""
        now = self._clock()
        trace = self._trace_of(request, now)
        self._finish(request)
        header = Response(request.rid, descriptors or None, params=None if empty else _sequence_parameters(request),
                          final=final, empty=empty, external=len(frames), trace=trace)
        compute = tuple(request.compute)
        if request.unexecuted:
            request.stats_due = True
        else:
            self._record_success(request, now)
        parts = [request.client, header.encode(inline), *frames]
        if request.cache_key is not None:   # (never a decoupled ensemble's: Triton refuses to cache those)
            self._remember(request.version, request.cache_key, parts[1:])
        self._reply(request.from_backend, parts, compute)

    def _trace_of(self, request: EnsembleRequest, now: int) -> dict | None:
        """A traced request's stamps and steps, as it ends (a step still answering is in it as it stands)."""
        if request.trace is None:
            return None
        still_out = [self._step_record(call, None) for rid in request.calls
                     if (call := self._calls.get(rid)) is not None and call.trace is not None]
        return ensemble_record(request.arrival_ns, now, request.traced_steps + still_out)

    def _record_success(self, request: EnsembleRequest, now: int) -> None:
        stats = request.version.stats
        queue_ns, compute_ns, output_ns = request.compute
        compute = (queue_ns, compute_ns, output_ns)
        stats.record_success(now - request.arrival_ns, request.queue_ns, request.batch_size, compute)
        stats.record_execution(request.batch_size, compute)   # Triton counts an ensemble request as one execution

    # -- a client gives up ---------------------------------------------------------------------

    def cancel(self, client: bytes, rid: int) -> list[tuple[int, str, int]]:
        """The client of ensemble request ``rid`` gave up on it: it is answered CANCELLED now, and
        its step requests still out are returned, (rid, model, version) each, for the scheduler
        to cancel as it does any request (their answers, when they come, are dropped). None
        when the request is not in flight."""
        request = next((call.request for call in self._calls.values()
                        if call.request.rid == rid and call.request.client == client), None)
        if request is None:
            request = self._waiting_request(client, rid)
        if request is None:
            return []
        steps = [(step_rid, call.step.model, call.version) for step_rid in request.calls
                 if (call := self._calls.get(step_rid)) is not None]
        self._fail(request, Cancelled.by_client())
        return steps

    def _waiting_request(self, client: bytes, rid: int) -> EnsembleRequest | None:
        """A request none of whose steps is out, one waiting for room (max_inflight_requests)."""
        for limit in self._limits.values():
            for waiting in limit.waiting.values():
                for request, _, _ in waiting:
                    if request.rid == rid and request.client == client and not request.finished:
                        return request
        return None

    def _fail(self, request: EnsembleRequest, error: TritiumError) -> None:
        """Answer the ensemble's request with ``error`` (and, traced, the steps that ran); Triton
        counts every failure of an ensemble, a cancellation too, with reason OTHER."""
        now = self._clock()
        trace = self._trace_of(request, now)
        self._finish(request)
        for rid in request.unexecuted:   # a failure is counted without compute times
            self._executing.pop(rid, None)
        request.unexecuted.clear()
        request.version.stats.record_failure(now - request.arrival_ns, "OTHER")
        self._reply(request.from_backend, [request.client, Response(request.rid, error=error, trace=trace).encode()],
                    NO_TIMINGS)

    def _finish(self, request: EnsembleRequest) -> None:
        request.finished = True
        for rid in request.calls:   # their answers, when they come, find no request
            self._calls.pop(rid, None)
        request.calls.clear()
        if request.waiting:   # (its tensors are let go now, not when room comes)
            for waiting in self._limits[request.version].waiting.values():
                kept = [entry for entry in waiting if entry[0] is not request]
                waiting.clear()
                waiting.extend(kept)
            request.waiting = 0

    def fail_waiting(self, error: TritiumError) -> None:
        """The broker is exiting: the requests with a step start waiting for room are answered now
        (their steps out are failed by the scheduler, and would hand their room on)."""
        for limit in list(self._limits.values()):
            for request in {entry[0] for waiting in limit.waiting.values() for entry in waiting}:
                if not request.finished:
                    self._fail(request, error)

    # -- caches ------------------------------------------------------------------------------

    def _plan(self, version: ModelVersion) -> Plan:
        plan = self._plans.get(version)
        if plan is None:
            plan = self._plans[version] = Plan(version.definition.config)
        return plan

    def _step_model(self, version: ModelVersion) -> StepModel:
        model = self._models.get(version)
        if model is None:
            model = self._models[version] = StepModel.of(version)
        return model


def _owned(frame):
    """A frame in a shared pool (the only memory the broker maps), copied out. A gateway's slot is
    reused once the ensemble is answered, and a failed or cancelled ensemble is answered while
    steps still queued may read its tensors; an instance's answer slot may be handed on once only,
    and a step's output may feed several steps and the answer (tritium/shared_pool.py). Views of
    a pool whose sender has gone are copied too."""
    return bytes(frame) if type(frame) is memoryview and isinstance(frame.obj, mmap.mmap) else frame


def _complete(tensors: dict, requested: list[str], iteration: int) -> bool:
    for name in requested:
        if (name, iteration) not in tensors:
            return False
    return True


def _tensor_data(descriptors: Sequence, view: memoryview, offset: int, frames: Sequence) -> list:
    """Per described tensor: its inline bytes (a view), or its external frame itself."""
    views = tensor_views(descriptors, view, offset, frames)   # checks bounds and frame counts
    if not frames:
        return views
    external = iter(frames)
    return [next(external) if descriptor[4] else data for descriptor, data in zip(descriptors, views)]


def _reshaped(shape: list, batch_size: int, batching: bool, dims: list[int] | None) -> list:
    """Triton's rule for a tensor passed between a model that batches and one that does not.

    A batching consumer given a tensor of exactly its configured dims gets a batch of
    one; a non-batching consumer given a batch of one that does not fit its dims gets
    the batch dimension stripped. Anything else passes as it is.
    """
    if dims is None or batching == (batch_size != 0):
        return shape
    if batching:
        return [1, *shape] if _fits(dims, shape) else shape
    return shape[1:] if batch_size == 1 and not _fits(dims, shape) else shape


def _fits(dims: list[int], shape: list) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))


def _sequence_parameters(request: EnsembleRequest) -> dict:
    """Triton's ensemble responses carry the request's sequence parameters (zero and false without one)."""
    return {"sequence_id": request.correlation_id or 0, "sequence_start": bool(request.flags & 1),
            "sequence_end": bool(request.flags & 2)}
