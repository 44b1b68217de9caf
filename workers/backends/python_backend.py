"""The Python backend (``backend: "python"``): a Triton ``model.py`` run unchanged.

The instance process imports ``<model>/<version>/model.py`` the way Triton's stub does
(the version and model folders on ``sys.path``, ``import_module("<version>.model")``),
with tritium's ``triton_python_backend_utils`` importable, creates ``TritonPythonModel``,
calls ``initialize(args)`` with Triton's keys, and then ``execute(requests)`` for each
batch (``async def execute`` runs on an event loop of the instance's own, in a thread of its own). A model that
defines ``execute_batch(inputs)`` instead receives every input stacked along the batch
dimension and returns stacked outputs (a tritium extension: docs/backends.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tritium.errors import ErrorCode, InternalError, TritiumError, error_for_code
from tritium.pb_utils import MODULE_DIR
from tritium.pb_utils.model_file import NotAPythonFile, import_model_file
from tritium.pb_utils.python_errors import with_model_frames
from tritium.pb_utils.triton_names.triton_python_backend_utils import TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
from tritium.pb_utils.types import InferenceRequest as PbRequest, InferenceResponse as PbResponse, Tensor, runtime
from tritium.workers.bls import BlsClient
from tritium.workers.backends.base import (
    RESCHEDULED, Backend, InferenceRequest, InferenceResponse, Instance, InstanceContext, Model, ModelContext,
    Rescheduled,
)

log = logging.getLogger(__name__)

# pb_utils.TritonError codes -> tritium's codes (both follow TRITONSERVER_Error_Code's names).
_CODES = {0: ErrorCode.UNKNOWN, 1: ErrorCode.INTERNAL, 2: ErrorCode.NOT_FOUND, 3: ErrorCode.INVALID_ARG,
          4: ErrorCode.UNAVAILABLE, 5: ErrorCode.UNSUPPORTED, 6: ErrorCode.ALREADY_EXISTS,
          7: ErrorCode.CANCELLED}


def pb_utils():
    """The ``triton_python_backend_utils`` module, importable as user code imports it."""
    if MODULE_DIR not in sys.path:
        sys.path.insert(0, MODULE_DIR)
    import triton_python_backend_utils

    return triton_python_backend_utils


class PythonBackend(Backend):
    """``backend: "python"``; or, given ``model_file``, a Python-based backend: that ``model.py``
    (``<backend-directory>/<backend>/model.py``) serves every model whose config names the backend."""

    name = "python"

    def __init__(self, model_file: Path | None = None) -> None:
        self.model_file = model_file

    def create_model(self, context: ModelContext) -> Model:
        return PythonModel(context, self.model_file)


class PythonModel(Model):
    def __init__(self, context: ModelContext, backend_file: Path | None = None) -> None:
        self.context = context
        pb_utils()  # importable before model.py's own "import triton_python_backend_utils"
        sys.argv = [""]   # what Triton's stub gives model code (unittest.main(), argparse read it), not this process's
        runtime.model_name = context.name
        version_dir, model_dir = context.version_dir, context.model_dir
        runtime.model_dir = str(version_dir)
        filename = context.config.default_model_filename or "model.py"
        folders = (str(version_dir), str(model_dir)) if backend_file is None else (str(backend_file.parent),)
        for folder in folders:
            if folder not in sys.path:
                sys.path.append(folder)
        try:
            module = import_model_file(backend_file or version_dir / filename, backend_file is not None)
        except NotAPythonFile as exc:
            raise InternalError(f"Internal: {exc}") from None
        except BaseException as exc:   # as Triton's stub reports a model.py that fails to import
            raise InternalError(f"Internal: {_with_model_frames(exc)}") from exc
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:   # (Triton's stub's words)
            raise InternalError(f"Internal: AttributeError: module '{module.__name__}' has no attribute "
                                "'TritonPythonModel'")
        self.model_class = model_class

    def create_instance(self, context: InstanceContext) -> Instance:
        return PythonInstance(self, context)


class PythonInstance(Instance):
    def __init__(self, model: PythonModel, context: InstanceContext) -> None:
        self.context = context
        self.model = model.model_class()
        self.pb = pb_utils()
        self.output_names = [o.name for o in context.model.config.output]
        self.decoupled = context.model.config.model_transaction_policy.decoupled
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_made = threading.Lock()   # is_ready() asks from a thread of its own
        runtime.instance_name = context.name
        if context.broker and runtime.bls is None:
            runtime.bls = BlsClient(context.broker, f"{context.instance_id}/bls", context.curve)
        args = {
            "model_config": json.dumps(context.model.config_json),
            "model_instance_kind": context.kind,
            "model_instance_name": context.name,
            "model_instance_device_id": str(context.device_id),
            "model_repository": str(context.model.model_dir),
            "model_version": str(context.model.version),
            "model_name": context.model.name,
        }
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            try:
                result = initialize(args)
                if inspect.isawaitable(result):
                    self._run(result)
            except BaseException as exc:   # sys.exit() too: pybind11 reports any Python error alike
                # As Triton's stub reports it: its status's "Internal: ", the exception, the model's frames.
                raise InternalError(f"Internal: {_with_model_frames(exc)}") from exc
        runtime.bls_open = True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The model's event loop, made at its first coroutine. As in Triton's stub it runs in a
        thread of its own for as long as the instance: tasks a coroutine leaves behind
        (``asyncio.create_task``, a response sent after ``execute`` returned) go on running
        between executes, not only while the next one is awaited."""
        with self._loop_made:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                if threading.current_thread() is threading.main_thread():   # as the stub's thread has it
                    asyncio.set_event_loop(loop)
                self._loop_thread = threading.Thread(target=loop.run_forever, name="model-event-loop", daemon=True)
                self._loop_thread.start()
                self._loop = loop
            return self._loop

    def _run(self, awaitable):
        """Await ``awaitable`` on the model's loop and return its result (on this thread once the
        loop was stopped, at finalize)."""
        loop = self.loop
        if self._loop_thread is not None and not self._loop_thread.is_alive():
            return loop.run_until_complete(_awaited(awaitable))
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), loop).result()

    def _run_in_background(self, coroutine, slots: list[_SenderSlot | None]) -> None:
        """A decoupled model's ``async def execute``: not waited for (it answers through its
        response senders), so the instance takes its next requests meanwhile, as Triton's does."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        future.add_done_callback(functools.partial(self._background_done, slots))

    def _background_done(self, slots: list[_SenderSlot | None], future: concurrent.futures.Future) -> None:
        if future.cancelled() or (exc := future.exception()) is None:
            return
        # Triton logs it and leaves the requests it did not finish unanswered; here they are
        # answered with the error (logged once, with the model's frames), as an execute that raised answers its requests.
        error = self._failure(exc)
        for slot in slots:
            if slot is not None:
                slot.fail(error)

    @property
    def stacks_batches(self) -> bool:
        return callable(getattr(self.model, "execute_batch", None))

    # -- Triton's interface: the separate requests ----------------------------------------

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse | Rescheduled | None]:
        """One response per request; None where the model answers through the request's
        response sender instead (Triton 24.06 and later let any model do so), RESCHEDULED where
        it released the request to run again."""
        pb_requests = [self._pb_request(r) for r in requests]
        slots = [pb_request._sender for pb_request in pb_requests]
        try:
            returned = self._checked(self._run_execute(pb_requests, slots), len(requests))
            again = self._rescheduled(pb_requests, returned) if runtime.release_flags_set else ()
        except InternalError:
            for slot in slots:   # as in Triton, the model can send nothing more for these requests
                if slot is not None:
                    slot.close()
            raise
        answers: list[InferenceResponse | Rescheduled | None] = []
        for index, (pb_request, slot, response) in enumerate(zip(pb_requests, slots, returned)):
            if again and index in again:   # it runs again: its sender stays quiet until then
                if slot is not None:
                    slot.close()
                answers.append(RESCHEDULED)
            elif response is None:
                answers.append(None)
                if slot is not None:
                    slot.watch(pb_request)
            else:
                if slot is not None and slot.returned():
                    # Triton logs this; the client keeps the response that was sent, and the request
                    # counts as a failure (the executor sees a response both sent and returned).
                    log.error("Failed to process the request(s) for model '%s', message: Unable to send response. "
                              "Non-decoupled model cannot send more than one response.", self.context.name)
                answers.append(self._response(response))
        return answers

    def _rescheduled(self, pb_requests: list[PbRequest], returned: list) -> set[int]:
        """The places of the requests the model released to run again (``set_release_flags(RESCHEDULE)``),
        whose entries in what execute returned must be None (Triton's error otherwise)."""
        runtime.release_flags_set = False
        again = set()
        for index, (pb_request, response) in enumerate(zip(pb_requests, returned)):
            if pb_request._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                if response is not None:
                    raise self._misuse("Expected a None object in the execute function return list for "
                                       f"reschduled request, found type '{type(response)}'.")   # (Triton's spelling)
                again.add(index)
        return again

    def _run_execute(self, pb_requests: list[PbRequest], slots: list[_SenderSlot | None]):
        try:
            result = self.model.execute(pb_requests)
            if not isinstance(result, list) and inspect.isawaitable(result):
                if self.decoupled and inspect.iscoroutine(result):
                    self._run_in_background(result, slots)
                    return None
                result = self._run(result)
            return result
        except BaseException as exc:   # sys.exit() too: Triton's stub answers it as any error
            raise self._failure(exc) from exc

    def _checked(self, result, count: int) -> list:
        """What ``execute`` returned, one entry per request, or Triton's error for what it must not return."""
        if type(result) is list and len(result) == count and not self.decoupled:   # the usual, checked first
            return result
        if result is None:
            return [None] * count
        if self.decoupled:
            raise self._misuse(f"Python model '{self.context.name}' is using the decoupled mode and the "
                               "execute function must return None.")
        if not isinstance(result, list):
            raise self._misuse(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != count:
            raise self._misuse(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{count}, and InferenceResponse(s) size is:{len(result)}\n")
        return result

    def _misuse(self, message: str) -> InternalError:
        """Triton's message for an execute that returned what it must not (logged, as Triton's stub logs it)."""
        error = InternalError(f"Failed to process the request(s) for model '{self.context.name}', message: {message}")
        log.error("%s", error.message)
        return error

    def _failure(self, exc: BaseException) -> InternalError:
        """Triton's message for an exception out of the model, with the model's frames."""
        return self._misuse(_with_model_frames(exc))

    def _pb_request(self, request: InferenceRequest) -> PbRequest:
        # Triton's inputs are writable (models may change them); a view of a received message is not.
        tensors = [Tensor._of(name, array if array.flags.writeable else array.copy())
                   for name, array in request.inputs.items()]
        model = self.context.model
        pb_request = PbRequest._received(
            request.request_id, request.correlation_id, request.flags, tensors,
            # A set, as in Triton, holding every output when the client named none.
            set(request.requested_outputs if request.requested_outputs is not None else self.output_names),
            model.name, model.version,
            request.parameters,
            request.trace)
        pb_request._timeout = request.timeout_us
        pb_request._origin = request
        if (send := request.response_sender) is not None:
            pb_request._sender = _SenderSlot(self, request, send)
        return pb_request

    def _response(self, response) -> InferenceResponse:
        if not isinstance(response, PbResponse):
            kind = "<class 'c_python_backend_utils.Tensor'>" if isinstance(response, Tensor) else str(type(response))
            return InferenceResponse(error=self._misuse(
                f"Expected an 'InferenceResponse' object in the execute function return list, found type '{kind}'."))
        # (pb_utils' own classes: their fields read directly, on the path of every response)
        text = response._parameters
        parameters = json.loads(text) if text != "{}" and text else {}
        error = response._error
        if error is not None:
            return InferenceResponse(error=error_for_code(_CODES.get(error.code(), ErrorCode.INTERNAL),
                                                          error.message()), parameters=parameters)
        return InferenceResponse(outputs={t._name: t._array for t in response._tensors}, parameters=parameters)

    # -- tritium's batched interface --------------------------------------------------------

    def execute_batch(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        try:
            outputs = self.model.execute_batch(inputs)
            if inspect.isawaitable(outputs):
                outputs = self._run(outputs)
        except TritiumError:
            raise
        except BaseException as exc:
            raise self._failure(exc) from exc
        if not isinstance(outputs, dict):
            raise InternalError(f"execute_batch of model '{self.context.model.name}' must return a "
                                f"dict of output name to numpy array, got {type(outputs).__name__}")
        return {name: np.asarray(outputs[name]) for name in output_names if name in outputs}

    # -- lifecycle --------------------------------------------------------------------------

    def is_ready(self) -> bool:
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True
        result = check()
        if inspect.isawaitable(result):
            result = self._run(result)
        if not isinstance(result, bool):   # Triton's check: "ready" is not True
            raise InternalError("is_ready() must return a boolean value")
        return result

    def finalize(self) -> None:
        """As Triton's stub: the event loop stops first (what still runs on it stops with it),
        then ``finalize`` runs; a coroutine ``finalize`` (tritium runs it) runs on the loop, before it stops."""
        runtime.bls_open = False
        finalize = getattr(self.model, "finalize", None)
        asynchronous = finalize is not None and inspect.iscoroutinefunction(finalize)
        if self._loop is not None and not asynchronous:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(5)
        if finalize is not None:
            result = finalize()
            if inspect.isawaitable(result):
                self._run(result)
        if self._loop is not None and asynchronous:
            self._loop.call_soon_threadsafe(self._loop.stop)


# Where the frames between the instance and an ``async def execute`` come from.
_AWAITING_DIRS = (os.path.dirname(asyncio.__file__), os.path.dirname(concurrent.futures.__file__))


async def _awaited(awaitable):
    return await awaitable


class _SenderSlot:
    """Where a request's response sender comes from: made when the model first asks for it
    (most models never do), closed once the request is answered.

    A request is answered with an error once the model has let go of both it and its sender
    without its final answer, as nothing could answer it any more (Triton leaves such a
    request without an answer).
    """

    __slots__ = ("_instance", "_request", "_send", "_sender", "_answered", "_alive", "_watching", "_lock")

    def __init__(self, instance: PythonInstance, request: InferenceRequest,
                 send: Callable[[InferenceResponse | None, bool], None]) -> None:
        self._instance = instance
        self._request = request
        self._send = send   # the request's response sender (the executor's)
        self._sender: weakref.ref | None = None   # a weak reference to the model's InferenceResponseSender, once made
        self._answered = False     # its final answer went out, or it can have none (its execution failed)
        self._alive = 0            # once watched: how many of the request and its sender the model holds
        self._watching = False
        # The model may ask for the sender on another thread (its event loop's) while execute's
        # thread starts watching. Reentrant: a finalizer may run _let_go inside a section. One per
        # slot: a lock shared by all would let a finalizer's logging, run inside another slot's
        # section, wait on a thread that waits for that section.
        self._lock = threading.RLock()

    def __call__(self):
        """pb_utils.InferenceRequest.get_response_sender's factory."""
        sender = self._instance.pb.InferenceResponseSender(self._forward, self._cancelled,
                                                           decoupled=self._instance.decoupled)
        if self._answered:
            sender._sent, sender._closed = 1, True
        with self._lock:
            self._sender = weakref.ref(sender)
            if self._watching:
                self._alive += 1   # before the finalizer's allocation, which may collect and let go
                weakref.finalize(sender, self._let_go).atexit = False
        return sender

    def _cancelled(self) -> bool:
        return self._request.cancelled

    def _forward(self, response, final: bool) -> None:
        if final or (response is not None and not self._instance.decoupled):
            self._answered = True
        self._send(None if response is None else self._instance._response(response), final)

    def _made(self):
        return None if self._sender is None else self._sender()

    def returned(self) -> bool:
        """The model returned this request's response: it counts as sent with FINAL, as in Triton.
        True when its sender had sent one already."""
        sent, self._answered = self._answered, True
        if self._sender is None:   # never made (most models)
            return sent
        sender = self._sender()
        if sender is not None:
            sender._sent, sender._closed = sender._sent + 1, True
        return sent

    def close(self) -> None:
        self._answered = True
        sender = self._made()
        if sender is not None:
            sender._closed = True

    def fail(self, error: TritiumError) -> None:
        """Answer the request with ``error`` unless its final answer went out: the model can send it nothing more."""
        with self._lock:
            if self._answered:
                return
            self.close()
        self._send(InferenceResponse(error=error), True)

    def watch(self, pb_request: PbRequest) -> None:
        """Answer the request with an error once the model holds neither it nor its sender unanswered."""
        with self._lock:
            if self._answered:   # answered during execute (most decoupled models): nothing to watch
                return
            held = [pb_request] + [sender for sender in (self._made(),) if sender is not None]
            self._watching, self._alive = True, len(held)
            for thing in held:
                weakref.finalize(thing, self._let_go).atexit = False

    def _let_go(self) -> None:
        with self._lock:
            self._alive -= 1
            if self._alive or self._answered:
                return
            self._answered = True
        name = self._instance.context.model.name
        if self._instance.decoupled:
            message = (f"model '{name}' released a request without its final response: its response sender "
                       "was never given the TRITONSERVER_RESPONSE_COMPLETE_FINAL flag")
        else:
            message = (f"model '{name}' released a request without answering it: execute returned None in its "
                       "place and its response sender sent no response")
        log.error("%s", message)
        # Sent from a thread of its own: a finalizer may run inside a garbage collection
        # anywhere, even in the middle of a send or under a lock that sending takes.
        answer = InferenceResponse(error=InternalError(message))
        try:
            threading.Thread(target=self._send, args=(answer, True), name="released-request", daemon=True).start()
        except RuntimeError:   # the interpreter is shutting down: nobody is left to answer
            pass


def _with_model_frames(exc: BaseException) -> str:
    """As pybind11 writes it: tritium's frames and an awaited call's asyncio and futures frames left out."""
    return with_model_frames(exc, (__file__, *_AWAITING_DIRS))
