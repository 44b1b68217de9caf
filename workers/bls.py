"""BLS: a model, while it executes, calling another model through the broker.

Each instance process that needs it gets a DEALER socket of its own to the broker's
backend (identity ``<instance id>/bls``); the broker answers requests on it exactly as
it answers a gateway. ``execute`` blocks until the answer; ``execute_async`` is its
awaitable form for ``async def execute`` models, and several may be in flight at once.
On a local link the DEALER is tritium's own ZMTP socket (tritium/links.py), written and read
by the calling thread: a call's round trip wakes no I/O thread in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import threading
import time
from collections import deque
from typing import NamedTuple

import numpy as np
import zmq

from tritium.errors import ErrorCode, ProtocolError, Unavailable
from tritium.pb_utils import types as pb
from tritium.protocol import (
    RECONNECT_IVL_MAX_MS,
    Cancel,
    Control,
    ControlReply,
    Heartbeat,
    Infer,
    Response,
    pack_tensors,
    read_record,
    tensor_views,
)
from tritium.links import connect_dealer
from tritium.security import CurveKeys
from tritium.shared_pool import PoolUsage, RequestSlots, request_slots
from tritium.tracing.tensors import raw_answer_tensors, raw_tensors
from tritium.workers.tensors import array_to_frame, frame_to_array
from tritium.zmtp import PoolUse, ZmtpDealer

# tritium error codes -> pb_utils.TritonError codes
_PB_CODES = {ErrorCode.UNKNOWN: pb.TritonError.UNKNOWN, ErrorCode.INTERNAL: pb.TritonError.INTERNAL,
             ErrorCode.NOT_FOUND: pb.TritonError.NOT_FOUND, ErrorCode.INVALID_ARG: pb.TritonError.INVALID_ARG,
             ErrorCode.UNAVAILABLE: pb.TritonError.UNAVAILABLE, ErrorCode.UNSUPPORTED: pb.TritonError.UNSUPPORTED,
             ErrorCode.ALREADY_EXISTS: pb.TritonError.ALREADY_EXISTS, ErrorCode.CANCELLED: pb.TritonError.CANCELLED}


_RECHECK_MS = 10
_POOL_BYTES = 64 * 1024 * 1024   # a model's BLS calls' large inputs in flight at once (pages allocated as used)
_POOL_FULL = ("the shared memory for this model's BLS calls ({mib:g} MiB) is full: large inputs cross the local "
              "sockets as bytes until the calls holding it are answered")


class BlsClient:
    def __init__(self, broker: str, identity: str, curve: CurveKeys | None = None) -> None:
        self.broker, self.identity, self.curve = broker, identity, curve
        self.pid = os.getpid()   # the process that owns the socket
        self._inherited: BlsClient | None = None   # the client a forked process got from its parent
        self.sock = connect_dealer(broker, identity, curve, "instance", pools=PoolUse.COPY)
        self._readable = select.poll()   # polled by the one thread watching the socket
        self._readable.register(self.sock.fileno(), select.POLLIN)
        self._next_rid = 1   # rids rise in send order (guarded by _lock): see ``broker_restarted``
        self._replies: dict[int, deque] = {}
        self._abandoned: list[int] = []   # calls whose response iterators were dropped unfinished
        self._called: dict[int, str] = {}   # rid -> the model called, until its final answer
        self._waiters: dict[int, asyncio.Future] = {}
        # The model's threads may call at once. One thread at a time watches the socket and files
        # what arrives, in order (a decoupled call's responses stay in sequence); the others wait
        # to be told that answers were filed.
        self._lock = threading.Lock()       # the socket's
        self._filing = threading.Lock()     # held while reading and filing
        self._arrived = threading.Condition()
        self._watching = False              # a thread is waiting on the socket
        self._reading_loop: asyncio.AbstractEventLoop | None = None
        self._traced: dict[int, _TracedCall] = {}   # rid -> a call made with its caller's trace, until answered
        # Large inputs cross in shared memory on a local link, as a gateway's (tritium/shared_pool.py);
        # the memory is made at the first. Guarded by _lock.
        self._local = isinstance(self.sock, ZmtpDealer)
        self._slots: RequestSlots | None = None
        self._broker_boot: int | None = None   # the broker process last heard of (``broker_restarted``)
        self._asked: _BoundaryAsked | None = None   # told of a new broker process, its answer awaited

    def for_this_process(self) -> BlsClient:
        """A client of its own for a process the model forked: same broker, an identity of its own.
        The parent's client is kept unused (closing its socket here must not disturb the parent's)."""
        client = BlsClient(self.broker, f"{self.identity}/{os.getpid()}", self.curve)
        client._inherited = self
        return client

    # -- sending ----------------------------------------------------------------------------

    def _send(self, request, decoupled: bool) -> int:
        tensors = [(tensor.name(), *array_to_frame(np.asarray(tensor._array), tensor.name()))
                   for tensor in request.inputs()]
        descriptors, inline, external = pack_tensors(tensors)
        # A model calling a stateful model runs a sequence of its own (cid, sf); with
        # trace=request.trace(), its call is a child of the caller's trace.
        trace = request.trace()
        context = None if trace is None else trace.call_context()
        tensors_traced = trace is not None and trace.tensors
        traced_inputs = raw_tensors(descriptors, [t[3] for t in tensors]) if tensors_traced else None
        params = json.loads(request.parameters() or "{}")
        if request.timeout():   # microseconds, as a client's "timeout" parameter: the called model's queue policy
            params["timeout"] = request.timeout()
        with self._lock:
            # The rid is taken where the call is sent, so that rids rise in the order the broker
            # hears them: a new broker process's first is the boundary of what it never got.
            rid = self._next_rid
            self._next_rid += 1
            infer = Infer(rid, request.model_name(), descriptors, version=request.model_version(),
                          request_id=request.request_id() or None,
                          outputs=sorted(request.requested_output_names()) or None,
                          params=params or None,
                          sequence_id=request.correlation_id() or None, sequence_flags=request.flags() or 0,
                          external=len(external), trace=context, trace_tensors=tensors_traced,
                          one_answer=not decoupled)
            if trace is not None:
                self._traced[rid] = _TracedCall(trace, request.model_name(), request.model_version(), context,
                                                traced_inputs)
            self._replies[rid] = deque()
            self._called[rid] = request.model_name()
            record = infer.encode(inline)
            if external and self._local:
                if self._slots is None:
                    self._slots = request_slots(_POOL_BYTES, _POOL_FULL)
                    self._local = self._slots is not None
                if self._slots is not None:
                    external = self._slots.place(rid, external)
            try:
                self.sock.send_parts([record, *external])
            except BaseException:
                if self._slots is not None:
                    self._slots.release(rid)
                raise
        return rid

    def control(self, args):
        """A repository operation (load, unload, the model table) asked of the broker as a gateway
        asks it; its result, or the broker's error raised (a load answers once it is done)."""
        with self._lock:
            rid = self._next_rid   # from the calls' sequence: a new broker process tells them apart alike
            record = Control(rid, args).encode()
            self._next_rid += 1
            self._replies[rid] = deque()
            self._called[rid] = getattr(args, "model", None) or args.op.value
            try:
                self.sock.send_parts([record])
            except BaseException:
                del self._replies[rid], self._called[rid]
                raise
        try:
            _, reply = self._next(rid)
        finally:
            del self._replies[rid]
        if isinstance(reply, ControlReply):
            if reply.error is not None:
                raise reply.error
            return reply.result
        raise Unavailable(reply.error().message())   # lost with a broker process that is gone (``_fail_below``)

    def pool_usage(self) -> PoolUsage | None:
        """The figures of the shared memory the calls' large inputs are placed in; None before the
        first such input (or on a link that is not local)."""
        with self._lock:
            return None if self._slots is None else self._slots.usage()

    def _cancel(self, rid: int, model: str, version: int) -> None:
        """Tell the broker this model gave up on its request ``rid`` (a decoupled one)."""
        with self._lock:
            self.sock.send_parts([Cancel(rid, model, version).encode()])

    # -- receiving ----------------------------------------------------------------------------

    def _pump(self, timeout_ms: int) -> None:
        """Read what the broker sent and file each reply under its request."""
        if timeout_ms and not self._wait(timeout_ms):
            return
        filed = False
        with self._filing:
            while self._abandoned:
                self._replies.pop(self._abandoned.pop(), None)
            while True:
                with self._lock:
                    if not self.sock.has_message():
                        break
                    parts = self.sock.recv_parts()
                # One message holds every answer of one batch to this socket (several requests of
                # an async execute, several responses of a decoupled model), each record followed
                # by its external frames.
                position = 0
                while position < len(parts):
                    response, record, offset = read_record(parts[position])
                    if type(response) is Response:
                        external = parts[position + 1:position + 1 + response.external]
                        position += 1 + response.external
                        self._file(response, record, offset, external)
                    elif type(response) is Heartbeat:   # where a new broker process's calls begin
                        self._boundary_told(response)
                        position += 1
                    elif type(response) is ControlReply:
                        self._file_reply(response)
                        position += 1
                    else:
                        raise ProtocolError(f"unexpected {response.kind.name} on a BLS socket")
                    filed = True
        if filed:
            with self._arrived:
                self._arrived.notify_all()

    def _wait(self, timeout_ms: int) -> bool:
        """Whether a message may have come within ``timeout_ms``. The socket is asked first: a
        libzmq descriptor signals an arrival once, and a ZMTP socket may hold a message read.
        The socket is asked again every few milliseconds when another thread may read it
        meanwhile: a libzmq socket's descriptor signal may be taken by another thread's send, and
        an event loop's reader (``execute_async``) may read this thread's answer."""
        shared = self.sock.edge_triggered or self._reading_loop is not None
        step_ms = _RECHECK_MS if shared else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._lock:
                if self.sock.has_message():
                    return True
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            if self._readable.poll(min(step_ms, left_ms)):
                return True

    def _file(self, response: Response, record, offset: int, external: list) -> None:
        rid = response.rid
        if response.final is not False:   # answered: its inputs were read
            self._called.pop(rid, None)
            if self._slots is not None:
                with self._lock:
                    self._slots.release(rid)
        traced = self._traced.get(rid) if self._traced else None
        if traced is not None:   # (a call the model gave up on too: its entry goes with its final answer)
            traced.answered(response, record, offset, external)
            if response.final is not False:
                del self._traced[rid]
        replies = self._replies.get(rid)
        if replies is None:
            return  # an answer nobody waits for any more
        replies.append(_response(response, record, offset, external))
        self._tell_waiter(rid)

    def _file_reply(self, reply: ControlReply) -> None:
        self._called.pop(reply.rid, None)
        replies = self._replies.get(reply.rid)
        if replies is not None:
            replies.append((True, reply))

    def _tell_waiter(self, rid: int) -> None:
        """Wake the coroutine awaiting ``rid``'s next answer, if one does (``execute_async``)."""
        waiter = self._waiters.get(rid)
        if waiter is not None and not waiter.get_loop().is_closed():
            if _running_loop() is waiter.get_loop():
                _wake(waiter)
            else:   # filed by a thread calling exec beside the loop: the loop is told
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def broker_restarted(self, boot: int | None, wait_s: float = 3.0) -> None:
        """The broker process the calls in flight went to is gone: a new one (``boot``) took its
        place, or the broker told this instance to exit (None). Told by whichever of the instance's
        threads hears the RESET first; the same boot told again changes nothing.

        Exiting: every call still waiting is answered with an error. A new process: it is asked,
        on this socket, which of the calls it got. Rids rise in the order the calls are sent, and
        the broker hears this socket's messages in that order, so the first rid the new process
        heard (a call's, or this question's ``nr`` when no call came before it) divides the calls
        the old process took with it from those the new one answers; the first are answered with
        an error when its answer comes (``_boundary_told``), the others wait for their answers.
        Should no answer come within ``wait_s`` (and the socket's longest reconnect interval), the
        calls sent before the question fail (``tick``): a model waiting on one would otherwise
        never return, nor its instance rejoin."""
        if boot is None:
            with self._filing:
                self._broker_boot = None
                self._asked = None
                self._fail_below(None, "no longer knows this instance")
            self._wake_all()
            return
        with self._filing:
            if boot == self._broker_boot:
                return
            self._broker_boot = boot
            try:
                with self._lock:
                    nr = self._next_rid
                    self.sock.send_parts([Heartbeat(next_rid=nr).encode()])
            except (zmq.ZMQError, OSError) as exc:   # no question, no answer: nothing would end the wait
                self._asked = None
                self._fail_below(None, f"restarted and could not be asked which calls it got ({exc})")
            else:
                # The socket may take up to its longest reconnect interval to reach the new process.
                self._asked = _BoundaryAsked(boot, nr, time.monotonic() + wait_s + RECONNECT_IVL_MAX_MS / 1000)
        self._wake_all()

    def _boundary_told(self, beat: Heartbeat) -> None:
        """The new broker process says where the calls it got begin (``since``): those below went
        to the process that is gone. Called with ``_filing`` held."""
        asked = self._asked
        if asked is None or beat.boot != asked.boot or beat.since is None:
            return   # an answer to an earlier question: a later one is on its way
        self._asked = None
        self._fail_below(beat.since, "restarted")

    def tick(self) -> None:
        """Every heartbeat interval (the instance's heartbeat thread): a question the new broker
        process did not answer in time gives up on the calls sent before it."""
        asked = self._asked
        if asked is None or time.monotonic() < asked.deadline:
            return
        self._pump(0)   # the answer may wait unread: no thread of the model reads the socket now
        with self._filing:
            if self._asked is not asked:
                return
            self._asked = None
            self._fail_below(asked.next_rid, "restarted and did not say which calls it got")
        self._wake_all()

    def _fail_below(self, boundary: int | None, what: str) -> None:
        """Answer every call below ``boundary`` (None: every call) still waiting for its final
        answer with an error, its shared memory freed. Called with ``_filing`` held."""
        lost = []
        for rid, queue in list(self._replies.items()):
            if (boundary is not None and rid >= boundary) or (queue and queue[-1][0]):
                continue   # sent to the new process, or its final answer came and waits to be read
            model = self._called.pop(rid, "?")
            traced = self._traced.pop(rid, None)
            if traced is not None:   # the call stays in its caller's trace, unanswered
                traced.done(None)
            error = pb.TritonError(f"the broker at {self.broker} {what}; the BLS request to model '{model}' "
                                   "was lost", pb.TritonError.UNAVAILABLE)
            queue.append((True, pb.InferenceResponse(error=error)))
            lost.append(rid)
        for rid in [rid for rid in self._traced if boundary is None or rid < boundary]:
            self._traced.pop(rid).done(None)   # a call the model gave up on, lost with the broker
        if self._slots is not None:
            with self._lock:
                for rid in lost:   # the process that read them is gone
                    self._slots.release(rid)
        for rid in lost:
            self._tell_waiter(rid)

    def _wake_all(self) -> None:
        with self._arrived:
            self._arrived.notify_all()

    def _next(self, rid: int):
        """The next response to request ``rid``, waiting for it: on the socket, or for the thread
        that waits on the socket to file it."""
        queue = self._replies[rid]
        while not queue:
            with self._arrived:
                if queue:
                    break
                if self._watching:
                    self._arrived.wait(1.0)
                    continue
                self._watching = True
            try:
                self._pump(1000)
            finally:
                with self._arrived:
                    self._watching = False
                    self._arrived.notify_all()
        return queue.popleft()

    def execute(self, request, decoupled: bool = False):
        rid = self._send(request, decoupled)
        if decoupled:
            return ResponseIterator(self, rid, request)
        last = None
        while True:
            final, response = self._next(rid)
            last = response if response is not None else last
            if final:
                del self._replies[rid]
                return last if last is not None else pb.InferenceResponse()

    async def execute_async(self, request, decoupled: bool = False):
        rid = self._send(request, decoupled)
        loop = asyncio.get_running_loop()
        if self._reading_loop is not loop:
            loop.add_reader(self.sock.fileno(), self._pump, 0)
            self._reading_loop = loop
        if decoupled:   # as Triton's async_exec: back once the first response is here, the loop free meanwhile
            await self._awaiting(loop, rid, request)
            return ResponseIterator(self, rid, request)
        last = None
        while True:
            await self._awaiting(loop, rid, request)
            queue = self._replies[rid]
            while queue:
                final, response = queue.popleft()
                last = response if response is not None else last
                if final:
                    del self._replies[rid]
                    return last if last is not None else pb.InferenceResponse()

    async def _awaiting(self, loop: asyncio.AbstractEventLoop, rid: int, request) -> None:
        """``_first_reply``, with the call given up (cancelled at the called model, its answers
        dropped) when the awaiting coroutine is cancelled (``asyncio.wait_for``)."""
        try:
            await self._first_reply(loop, rid)
        except BaseException:
            self._abandoned.append(rid)
            self._cancel(rid, request.model_name(), request.model_version())
            raise

    async def _first_reply(self, loop: asyncio.AbstractEventLoop, rid: int) -> None:
        """Wait, letting ``loop`` run other coroutines, until request ``rid`` has a response filed."""
        while True:
            self._pump(0)
            if self._replies[rid]:
                return
            future = loop.create_future()
            self._waiters[rid] = future
            try:
                if not self._replies[rid]:
                    # A libzmq descriptor is edge-triggered: another thread's send may take its
                    # signal, so look again every few milliseconds rather than wait for the next.
                    timeout = _RECHECK_MS / 1000 if self.sock.edge_triggered else None
                    await asyncio.wait({future}, timeout=timeout)
            finally:
                self._waiters.pop(rid, None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _BoundaryAsked(NamedTuple):
    """A question to a new broker process (``broker_restarted``): which calls it got."""

    boot: int
    next_rid: int     # the lowest rid not sent when it was asked
    deadline: float   # monotonic: the calls below ``next_rid`` fail if no answer came by then


class ResponseIterator:
    """The responses of a decoupled model to one BLS request, until its final one."""

    def __init__(self, client: BlsClient, rid: int, request) -> None:
        self._client = client
        self._rid = rid
        self._called = (request.model_name(), request.model_version())   # what a cancel names
        self._done = False
        self._cancelled = False
        self._seen: list = []   # every response given: a loop begun after the final one gives them again

    def __iter__(self):
        # As Triton's iterator: once it has had its final response, iterating it again replays them.
        return iter(list(self._seen)) if self._done else self

    def __next__(self):
        if self._done:
            raise StopIteration("Iteration is done for the responses.")   # (Triton's words)
        final, response = self._client._next(self._rid)
        if final:
            self._done = True
            self._client._replies.pop(self._rid, None)
        # A flags-only final response is yielded too, without outputs, as Triton's iterator does
        # (models written for Triton check for it: ``len(response.output_tensors()) > 0``).
        response = response if response is not None else pb.InferenceResponse()
        self._seen.append(response)
        return response

    def cancel(self) -> None:
        """Cancel the called model's request (it sees ``is_cancelled()``). As in Triton, the
        iterator still gives every response that comes, up to the final one: the CANCELLED
        error of a model that stops, or the rest of one that does not look."""
        if not self._done and not self._cancelled:
            self._cancelled = True
            self._client._cancel(self._rid, *self._called)

    def __del__(self) -> None:
        if not self._done:   # given up on before its final response: what still comes is dropped
            self._client._abandoned.append(self._rid)   # (a garbage collection may run this anywhere)


class _TracedCall:
    """A call made with its caller's trace (``trace=request.trace()``): a child of that trace once
    its final answer came. At trace level TENSORS, its inputs and each answer's outputs, raw."""

    __slots__ = ("trace", "model", "version", "context", "inputs", "outputs")

    def __init__(self, trace, model: str, version: int, context: bytes | None, inputs: list | None) -> None:
        self.trace, self.model, self.version, self.context = trace, model, version, context
        self.inputs = inputs
        self.outputs: list = []

    def answered(self, response: Response, record, offset: int, external: list) -> None:
        if self.inputs is not None and response.outputs:
            self.outputs.extend(raw_answer_tensors(response.outputs, record, offset, external))
        if response.final is not False:
            self.done(response.trace)

    def done(self, stamps: dict | None) -> None:
        self.trace.call_done(self.model, self.version, self.context, stamps,
                             None if self.inputs is None else (self.inputs, self.outputs))


def _response(response: Response, record, offset: int, external: list):
    """(final, pb_utils.InferenceResponse or None for an empty final one)."""
    final = response.final is not False
    if response.error is not None:
        code = _PB_CODES.get(response.error.code, pb.TritonError.INTERNAL)
        return final, pb.InferenceResponse(error=pb.TritonError(response.error.message, code))
    descriptors = response.outputs or []
    if not descriptors and response.empty:
        return final, None
    tensors = []
    for descriptor, view in zip(descriptors, tensor_views(descriptors, record, offset, external)):
        array = frame_to_array(view, descriptor[1], descriptor[2], descriptor[0])
        tensors.append(pb.Tensor(descriptor[0], array.copy() if array.dtype != np.object_ else array))
    return final, pb.InferenceResponse(output_tensors=tensors, parameters=response.params)
