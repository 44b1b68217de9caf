"""Runs one BATCH message through an instance and builds the BATCH_DONE reply.

Decoding, reshaping, stacking along the batch dimension, splitting outputs and the
three compute timings of Triton's statistics all live here, so backends only see
numpy arrays. One bad request fails alone; an exception from the model fails the
requests of that execution and nothing else.

Stacking works on bytes: the inputs of all requests are joined once per input name and
viewed as one array, and each output is cut back into per-request byte ranges. No
per-request numpy array is made on that path; it is what keeps a batch of small
requests cheap.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import numpy as np
from tritium.model_config_proto import model_config_pb2

from tritium.repo import ModelConfig
from tritium import datatypes
from tritium.errors import Cancelled, InternalError, InvalidArgument, TritiumError
from tritium.protocol import Batch, BatchDone, Infer, Response, ResponsePart, pack_tensors, read_record, tensor_views
from tritium.tracing.stamps import CallTrace, stamped_responses, stream_stamps
from tritium.workers.backends.base import RESCHEDULED, InferenceRequest, InferenceResponse, Instance
from tritium.workers.records import read_batch, read_infer
from tritium.workers.sequence_state import SequenceInputs
from tritium.workers.tensors import array_to_frame, check_tensor_size, frame_to_array, writable_rows

log = logging.getLogger(__name__)

# Request parameters that are fields of the request in Triton (the scheduler's), not
# parameters a model sees through request.parameters().
_REQUEST_FIELDS = frozenset({"priority", "timeout"})


class _Item(msgspec.Struct):
    """One request of the batch, as it arrived."""

    rid: int                           # its client's number: requests of different clients may share one
    infer: Infer
    key: int                           # its place in the batch (a padding's, below 0): what answers are kept by
    views: list                        # raw bytes of each input, in descriptor order (none if unreadable)
    error: TritiumError | None = None
    slot: int | None = None            # stateful models: the sequence slot it runs in
    padding: bool = False              # a not-ready request filling a slot of a direct batch
    trace: CallTrace | None = None     # traced: what its model's BLS calls add to its trace


class BatchExecutor:
    def __init__(self, instance: Instance, config: ModelConfig, send: Callable[[list], None] | None = None,
                 model_dir: Path | None = None) -> None:
        self.instance = instance
        self.config = config
        self.send = send   # sends a message to the broker now (decoupled responses)
        self.yield_cpu: Callable[[], None] = os.sched_yield
        self.decoupled = config.model_transaction_policy.decoupled
        self.model = config.name
        self.batching = config.max_batch_size > 0
        self.output_names = [o.name for o in config.output]
        self.output_types = {o.name: datatypes.from_config_name(model_config_pb2.DataType.Name(o.data_type))
                             for o in config.output}
        self.input_reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self.output_dims = {o.name: list(o.dims) for o in config.output if o.HasField("reshape")}
        self.stacks = instance.stacks_batches
        self.sequences = SequenceInputs(config, model_dir) if config.HasField("sequence_batching") else None
        # Requests answered through their response senders (a decoupled model's, or one that answers
        # after execute returned) still answering, by (batch, index): their clients may cancel them.
        self._answering: dict[tuple[int, int], InferenceRequest] = {}
        # The per-request execute now running: its batch number, its requests as received and
        # what each was given to the model as; read by the heartbeat thread, which marks a
        # cancelled one while execute runs. (Kept apart from the items: an item holding its
        # InferenceRequest would close a reference cycle through the request's response sender.)
        self._executing: tuple[int, list[_Item], list[tuple[_Item, InferenceRequest]]] | None = None
        # Requests cancelled while their batch waited here behind another (an instance takes a
        # second batch while one runs), by (batch, index); the heartbeat thread adds to it.
        self._cancelled_ahead: set[tuple[int, int]] = set()
        self._ahead_lock = threading.Lock()
        # Guards each batch's _SentAnswers against the model's own threads (one lock for all: a
        # lock made per batch costs more than it would ever be waited for).
        self.answers_lock = threading.Lock()
        self._started = 0   # the number of the batch started last

    def run(self, frames: list) -> list:
        """Execute the batch in ``frames`` (BATCH record first); return the BATCH_DONE parts."""
        t0 = time.monotonic_ns()
        batch_header, _, _ = read_batch(frames[0])
        items = self._decode_all(frames, batch_header.count)
        dropped = self._start(batch_header.number, items)
        ran = not dropped or dropped < len(items)
        batch = items if self.sequences is None else self._with_sequences(self.sequences, batch_header, items)
        if self.decoupled:
            return self._run_decoupled(batch_header, items, t0, ran)
        good = [item for item in batch if item.error is None]
        if self.stacks and self.batching:
            replies, t1, t2 = self._run_stacked(good)
        elif self.stacks:
            replies, t1, t2 = self._run_unbatched(good)
        else:
            replies, t1, t2 = self._run_separately(good, items, batch_header.number)
            if _LATER in replies.values():
                return self._answered_later(batch_header.number, items, replies, (t1 - t0, t2 - t1, 0))
        parts: list[bytes | memoryview]
        parts, external_counts, oks, answered, again = [], [], [], [], []
        for index, item in enumerate(items):
            reply = replies.get(item.key) if item.error is None else (None, False)
            if reply is RESCHEDULED:
                again.append(index)
                continue
            answered.append(item)
            encoded, ok = reply
            if encoded is None:
                encoded = [_error_record(item.rid, item.error or InternalError(
                    f"model '{self.model}' gave no response"))]
            parts.extend(encoded)
            external_counts.append(len(encoded) - 1)
            oks.append(ok)
        t3 = time.monotonic_ns()
        trace = batch_header.trace if not again or batch_header.trace is None else _answered_only(batch_header.trace,
                                                                                                  again, len(items))
        if trace is not None and trace["r"]:   # traced requests: their stamps go back on their RESPONSE headers
            parts = stamped_responses(parts, external_counts, [item.infer for item in answered], trace,
                                      batch_header.number, (t1, t2, t3), self.model,
                                      [item.trace and item.trace.calls for item in answered])
        done = BatchDone(batch_header.number, oks, external_counts, (t1 - t0, t2 - t1, t3 - t2), ran=ran,
                         rescheduled=again or None)
        return [done.encode(), *parts]

    # -- decoding -----------------------------------------------------------------------

    def _decode_all(self, frames: list, count: int) -> list[_Item]:
        items: list[_Item] = []
        position = 1
        for _ in range(count):
            infer, record, offset = read_infer(frames[position])
            external = frames[position + 1:position + 1 + infer.external]
            position += 1 + infer.external
            try:
                views = tensor_views(infer.inputs, record, offset, external)
                for descriptor, view in zip(infer.inputs, views):
                    check_tensor_size(descriptor[0], descriptor[1], descriptor[2], view)
            except TritiumError as exc:
                items.append(_Item(infer.rid, infer, len(items), [], exc))
            else:
                items.append(_Item(infer.rid, infer, len(items), views))
        return items

    def _with_sequences(self, sequences: SequenceInputs, batch_header: Batch, items: list[_Item]) -> list[_Item]:
        """Each request with its control and state inputs; a direct batch with a not-ready request in
        each slot up to the highest one, as Triton pads it, so that a request's batch row is its slot."""
        slots = batch_header.slots or list(range(len(items)))
        for item, slot in zip(items, slots):
            item.slot = slot
            if item.error is None:
                sequences.add_inputs(item.infer, item.views, slot)
        template = next((item for item in items if item.error is None), None)
        if not sequences.pads or self.decoupled or template is None:
            return items
        by_slot = {item.slot: item for item in items if item.error is None}
        batch = []
        for slot in range(max(slots) + 1):
            row = by_slot.get(slot)
            if row is None:
                null_infer, null_views = sequences.null_request(template.infer, template.views)
                row = _Item(-1 - slot, null_infer, -1 - slot, null_views, slot=slot, padding=True)
            batch.append(row)
        return batch

    def _with_states(self, wanted: list[str]) -> list[str]:
        """The outputs to ask of the model: ``wanted`` and the output states it must produce."""
        if self.sequences is None:
            return wanted
        return wanted + [name for name in self.sequences.state_outputs if name not in wanted]

    def _arrays(self, item: _Item, batch_size: int) -> dict[str, np.ndarray]:
        arrays = {}
        for descriptor, view in zip(item.infer.inputs, item.views):
            name = descriptor[0]
            array = frame_to_array(view, descriptor[1], descriptor[2], name)
            reshape = self.input_reshape.get(name)
            if reshape is not None:
                array = array.reshape(([batch_size] if self.batching else []) + reshape)
            arrays[name] = array
        return arrays

    def _rows(self, items: list[_Item]) -> Sequence[dict[str, np.ndarray] | None]:
        """Each request's input arrays, as rows of one writable array per input when all requests line
        up (batching models, fixed-size inputs of the same shapes past the batch dimension); else None."""
        if not self.batching or len(items) < 2:
            return [None] * len(items)
        descriptors = [item.infer.inputs for item in items]
        first = [(d[0], d[1], d[2][1:]) for d in descriptors[0]]
        if any(d[1] == "BYTES" for d in descriptors[0]) or any(
                inputs != descriptors[0] and [(d[0], d[1], d[2][1:]) for d in inputs] != first
                for inputs in descriptors[1:]):   # equal descriptors (the usual case) line up
            return [None] * len(items)
        arrays: list[dict[str, np.ndarray]] = [{} for _ in items]
        for index, (name, datatype, _) in enumerate(first):
            shapes = [inputs[index][2] for inputs in descriptors]
            reshape = self.input_reshape.get(name)
            try:
                rows = writable_rows([item.views[index] for item in items], datatype, shapes, name)
                for request_arrays, row in zip(arrays, rows):
                    request_arrays[name] = row if reshape is None else row.reshape([row.shape[0], *reshape])
            except (ValueError, TritiumError):   # then each request is checked alone, and fails alone
                return [None] * len(items)
        return arrays

    def _request(self, item: _Item, arrays: dict[str, np.ndarray] | None = None) -> InferenceRequest:
        infer = item.infer
        batch_size = infer.batch_size or 1
        parameters = infer.params or {}
        timeout_us = 0
        if parameters and not _REQUEST_FIELDS.isdisjoint(parameters):
            timeout = parameters.get("timeout", 0)
            timeout_us = timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else 0
            parameters = {k: v for k, v in parameters.items() if k not in _REQUEST_FIELDS}
        if infer.trace is not None:
            item.trace = CallTrace(infer.trace, infer.trace_tensors)
        if arrays is None:
            arrays = self._arrays(item, batch_size)
        return InferenceRequest(request_id=infer.request_id or "", inputs=arrays,
                                requested_outputs=infer.outputs,
                                parameters=parameters, batch_size=batch_size,
                                correlation_id=infer.sequence_id or 0, flags=infer.sequence_flags,
                                timeout_us=timeout_us, trace=item.trace)

    # -- one request at a time (the model gets the list of requests) ---------------------

    def _run_separately(self, items: list[_Item], received: list[_Item], number: int):
        """``replies`` by key: (the encoded response, ok), or _LATER for a request the model
        answers through its response sender after its execute returned."""
        t1 = time.monotonic_ns()
        replies: dict = {}
        requests = []
        sent = _SentAnswers(self, received, number)
        for item, arrays in zip(items, self._rows(items)):
            try:
                request = self._request(item, arrays)
            except Exception as exc:  # a request that cannot be decoded fails alone
                replies[item.key] = ([_error_record(item.rid, self._execution_error(exc))], False)
                continue
            request.response_sender = functools.partial(sent.send, item.key)
            requests.append((item, request))
        if not requests:
            now = time.monotonic_ns()
            return replies, now, now
        t1 = time.monotonic_ns()
        self._executing = number, received, requests
        try:
            responses = self.instance.execute([request for _, request in requests])
            if not isinstance(responses, list) or len(responses) != len(requests):
                got = len(responses) if isinstance(responses, list) else type(responses).__name__
                raise InternalError(f"model '{self.model}' returned {got} responses for "
                                    f"{len(requests)} requests")
            failed = False
        except Exception as exc:
            error = self._execution_error(exc)
            responses, failed = [InferenceResponse(error=error)] * len(requests), True
        self._executing = None
        t2 = time.monotonic_ns()
        responses, overruled = sent.merged([item.key for item, _ in requests], responses, failed)
        for (item, request), response in zip(requests, responses):
            if response is RESCHEDULED:   # no reply: the request runs again in a later batch
                replies[item.key] = RESCHEDULED
                continue
            if response is _LATER:   # its client may cancel it until it is answered
                replies[item.key] = _LATER
                self._answering[number, item.key] = request   # (its key is its place in the batch)
                continue
            if self.sequences is not None and isinstance(response, InferenceResponse) and response.error is None:
                _keep_state(self.sequences, item, response.outputs)
            encoded, ok = self._encode_response(item.rid, request.requested_outputs, response)
            replies[item.key] = encoded, ok and not failed and item.key not in overruled
        return replies, t1, t2

    def _answered_later(self, number: int, items: list[_Item], replies: dict, timings: tuple[int, int, int]) -> list:
        """A batch some of whose requests the model answers later, through their response
        senders: the others are answered now, and the batch ends as a decoupled one does."""
        later, again = [], []
        for index, item in enumerate(items):
            reply = replies.get(item.key) if item.error is None else None
            if reply is _LATER:
                later.append(index)
                continue
            if reply is RESCHEDULED:
                again.append(index)
                continue
            encoded = reply[0] if reply is not None else [_error_record(item.rid, item.error or InternalError(
                f"model '{self.model}' gave no response"))]
            self._send_part(number, index, encoded)
        return [BatchDone(number, [], [], timings, later, rescheduled=again or None).encode()]

    def _encode_response(self, rid: int, requested: list[str] | None, response,
                         final: bool | None = None) -> tuple[list, bool]:
        if response is None or not isinstance(response, InferenceResponse):
            response = InferenceResponse(error=InternalError(f"model '{self.model}' gave no response"))
        if response.error is not None:
            return [_error_record(rid, response.error, final)], False
        # In the order the model gave them, whatever the request's; an output not asked for (when the
        # request names none: not declared in the config) or not produced left out, as Triton does.
        wanted = self.output_types if requested is None else requested
        names = [name for name in response.outputs if name in wanted]
        tensors = []
        try:
            for name in names:
                array = np.asarray(response.outputs[name])
                dims = self.output_dims.get(name)
                if dims is not None:
                    array = array.reshape(([array.shape[0]] if self.batching else []) + dims)
                tensors.append((name, *array_to_frame(array, name)))
        except TritiumError as exc:
            return [_error_record(rid, exc, final)], False
        return _response_record(rid, tensors, response.parameters, final), True

    # -- decoupled models: each request answered 0..N times, as the model sends -----------

    def _run_decoupled(self, header: Batch, items: list[_Item], t0: int, ran: bool) -> list:
        batch = header.number
        still_open: set[int] = set()
        first = [header.lone]   # the batch's first response is still to come, and should leave at once
        if header.trace:
            trace = header.trace   # read by the stamps below, made only for the requests in ``traced``
            traced = {int(index): stamps for index, stamps in trace["r"].items()}
        else:
            traced = {}
        inputs_ready = [t0]     # when the model got its inputs: a traced request's COMPUTE_INPUT_END

        def stamps_of(index: int) -> Callable[[], dict] | None:
            """What a traced request's final response carries (its stamps, made when it leaves)."""
            if index not in traced:
                return None
            return lambda: stream_stamps(trace["at"], traced[index], batch, len(items), inputs_ready[0], self.model)

        def fail(index: int, item: _Item, error: TritiumError) -> None:
            stamps = stamps_of(index)   # a traced request's stamps ride its final response, an error too
            self._send_part(batch, index, [_error_record(item.rid, error, True, stamps and stamps())])

        requests = []
        for index, item in enumerate(items):
            try:
                if item.error is not None:
                    raise item.error
                request = self._request(item)
            except Exception as exc:
                fail(index, item, self._execution_error(exc))
                continue
            request.response_sender = self._sender(batch, index, item, still_open, first, stamps_of(index))
            still_open.add(index)
            self._answering[batch, index] = request
            requests.append((index, item, request))
        t1 = inputs_ready[0] = time.monotonic_ns()
        returned: list = []
        raised = False
        try:
            if requests:
                returned = self.instance.execute([request for _, _, request in requests]) or []
        except Exception as exc:
            raised = True
            error = self._execution_error(exc)
            if not still_open and error is exc:   # no client gets it, and it was not logged yet
                log.error("%s", error.message)
            for index, item, _ in requests:
                if index in still_open:
                    still_open.discard(index)
                    self._answering.pop((batch, index), None)
                    fail(index, item, error)
        again = [index for (index, _, _), response in zip(requests, returned)
                 if response is RESCHEDULED and index in still_open] if RESCHEDULED in returned else []
        for index in again:   # it runs again in a later batch, which its next responses belong to
            still_open.discard(index)
            self._answering.pop((batch, index), None)
        t2 = time.monotonic_ns()
        return [BatchDone(batch, [], [], (t1 - t0, t2 - t1, 0), sorted(still_open), ran=ran,
                          rescheduled=again or None, raised=raised).encode()]

    def _sender(self, batch: int, index: int, item: _Item, still_open: set[int], first: list[bool],
                stamps: Callable[[], dict] | None = None):
        """The response sender of request ``index`` of a decoupled batch; ``stamps``: a traced
        request's, for its final response."""
        requested = item.infer.outputs

        def send(response: InferenceResponse | None, final: bool) -> None:
            if response is None:
                parts = [Response(item.rid, final=final, empty=True).encode()]
            else:
                parts, _ = self._encode_response(item.rid, requested, response, final)
            if final and stamps is not None:
                record, view, offset = read_record(parts[0])
                parts[0] = msgspec.structs.replace(record, trace=stamps()).encode((view[offset:],))
            if final:
                still_open.discard(index)
                self._answering.pop((batch, index), None)
            self._send_part(batch, index, parts)
            if first[0]:
                # Requests come one at a time (the broker's word): the processes that forward this
                # response may wait for the CPU this one holds while the model makes the next ones
                # (at low load the kernel runs them all on one CPU), and it would leave with the last.
                first[0] = False
                self.yield_cpu()

        return send

    def cancel(self, batch: int, index: int) -> None:
        """The client of request ``index`` of ``batch`` gave up on it: its model may see it and stop.

        Called by the main loop between executions and by the heartbeat thread while one runs
        (the broker tells both): setting a flag is all it does, safe from either thread.
        """
        request = self._answering.get((batch, index))
        executing = self._executing
        if request is None and executing is not None and executing[0] == batch and index < len(executing[1]):
            item = executing[1][index]
            request = next((given for received, given in executing[2] if received is item), None)
        if request is not None:
            request.cancelled = True
        elif self.sequences is None:   # (a sequence's request runs: the broker ends its sequence with it)
            with self._ahead_lock:   # against _start: a batch starting now takes this cancel, or it is not kept
                if batch > self._started:   # not started yet: it is dropped when its batch comes up
                    self._cancelled_ahead.add((batch, index))

    def numbered_anew(self) -> None:
        """A new broker process numbers its batches from 1 again."""
        with self._ahead_lock:
            self._started = 0
            self._cancelled_ahead.clear()

    def _start(self, number: int, items: list[_Item]) -> int:
        """Batch ``number`` starts: its requests whose clients gave up while it waited here are
        answered CANCELLED without running, as Triton's scheduler drops a cancelled request it
        still holds. Returns how many."""
        with self._ahead_lock:
            self._started = number
            if not self._cancelled_ahead:
                return 0
            ahead = self._cancelled_ahead
            self._cancelled_ahead = {key for key in ahead if key[0] > number}   # batches numbered after this one
        dropped = 0
        for batch, index in ahead:
            if batch == number and index < len(items) and items[index].error is None:
                items[index].error = Cancelled.by_client()
                dropped += 1
        return dropped

    def _send_part(self, batch: int, index: int, parts: list) -> None:
        # send is None only in an executor made without a broker link (a test's, a benchmark's), whose
        # models answer by returning: narrowing it here would cost a check on every response sent.
        self.send([ResponsePart(batch, index).encode(), *parts])  # type: ignore[misc]

    # -- models without batching: one execute_batch per request -------------------------

    def _run_unbatched(self, items: list[_Item]):
        replies, t1, infer_ns = {}, time.monotonic_ns(), 0
        for item in items:
            try:
                request = self._request(item)
                wanted = self._with_states(request.requested_outputs or list(self.output_names))
                started = time.monotonic_ns()
                outputs = self.instance.execute_batch(request.inputs, wanted)
                infer_ns += time.monotonic_ns() - started
                if self.sequences is not None:
                    _keep_state(self.sequences, item, outputs)
                response = InferenceResponse(outputs=outputs)
            except Exception as exc:
                response = InferenceResponse(error=self._execution_error(exc))
            replies[item.key] = self._encode_response(item.rid, item.infer.outputs, response)
        return replies, t1, t1 + infer_ns

    # -- stacked along the batch dimension (the model gets one tensor per input) ---------

    def _run_stacked(self, items: list[_Item]):
        replies: dict = {}
        items = self._same_layout(items, replies)
        if not items:
            now = time.monotonic_ns()
            return replies, now, now
        sizes = [(item.infer.batch_size or 1) for item in items]
        wanted = self._with_states(self._union_outputs(items))
        try:
            inputs = self._stack(items, sum(sizes))
            t1 = time.monotonic_ns()
            outputs = self.instance.execute_batch(inputs, wanted)
            t2 = time.monotonic_ns()
            if self.sequences is not None:
                self.sequences.keep_rows([(item.slot, item.infer.sequence_flags)
                                          if item.slot is not None and not item.padding else None
                                          for item in items], outputs)
            replies.update(self._split(items, sizes, outputs))
        except Exception as exc:
            t1 = t2 = time.monotonic_ns()
            error = self._execution_error(exc)
            for item in items:
                replies[item.key] = ([_error_record(item.rid, error)], False)
        return replies, t1, t2

    def _same_layout(self, items: list[_Item], replies: dict) -> list[_Item]:
        """Requests whose inputs line up with the first one's; the others fail alone."""
        first = [(d[0], d[1], d[2][1:]) for d in items[0].infer.inputs] if items else None
        kept = []
        for item in items:
            layout = [(d[0], d[1], d[2][1:]) for d in item.infer.inputs]
            if layout == first:
                kept.append(item)
            else:
                replies[item.key] = ([_error_record(item.rid, InvalidArgument(
                    f"request for model '{self.model}' does not match the shapes of the batch it "
                    "was put in"))], False)
        return kept

    def _stack(self, items: list[_Item], total: int) -> dict[str, np.ndarray]:
        inputs = {}
        for index, descriptor in enumerate(items[0].infer.inputs):
            name, datatype, shape = descriptor[0], descriptor[1], descriptor[2]
            views = [item.views[index] for item in items]
            blob = views[0] if len(views) == 1 else b"".join(views)
            array = frame_to_array(blob, datatype, [total] + list(shape[1:]), name)
            reshape = self.input_reshape.get(name)
            if reshape is not None:
                array = array.reshape([total] + reshape)
            inputs[name] = array
        return inputs

    def _union_outputs(self, items: list[_Item]) -> list[str]:
        wanted: set[str] = set()
        for item in items:
            if item.infer.outputs is None:   # a request asking for every output
                return list(self.output_names)
            wanted.update(item.infer.outputs)
        return [name for name in self.output_names if name in wanted]

    def _split(self, items: list[_Item], sizes: list[int], outputs: dict[str, np.ndarray]) -> dict:
        total = sum(sizes)
        cut = {}
        for name, array in outputs.items():
            array = np.asarray(array)
            dims = self.output_dims.get(name)
            if dims is not None:
                array = array.reshape([array.shape[0]] + dims)
            self._check_output(name, array, total)
            datatype, shape, buffer = array_to_frame(array, name)
            cut[name] = (datatype, shape[1:], buffer, array)
        replies, start = {}, 0
        for item, size in zip(items, sizes):
            names = item.infer.outputs or self.output_names
            tensors = []
            for name in names:
                datatype, inner, buffer, array = cut[name]
                if datatype == "BYTES":  # variable-size elements: cut by rows, then serialize
                    _, _, piece = array_to_frame(array[start:start + size], name)
                else:
                    row = len(buffer) // total if total else 0
                    piece = buffer[start * row:(start + size) * row]
                tensors.append((name, datatype, [size, *inner], piece))
            replies[item.key] = (_response_record(item.rid, tensors, None), True)
            start += size
        return replies

    def _check_output(self, name: str, array: np.ndarray, total: int) -> None:
        expected = self.output_types.get(name)
        actual = datatypes.from_numpy(array.dtype)
        if expected is not None and actual is not None and actual.name != expected.name:
            raise InternalError(
                f"output '{name}' of model '{self.model}' is {actual.name}, but the model "
                f"configuration declares {expected.config_name}")
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(
                f"output '{name}' of model '{self.model}' has shape {list(array.shape)}, which does "
                f"not start with the batch size {total}")

    def _execution_error(self, exc: Exception) -> TritiumError:
        if isinstance(exc, TritiumError):
            return exc
        log.warning("model %s failed to execute: %r", self.model, exc)
        return InternalError(f"model '{self.model}' failed to execute: {type(exc).__name__}: {exc}")


_LATER = object()   # a reply the model will send through the request's response sender


class _SentAnswers:
    """The answers a model that is not decoupled sends through its requests' response senders
    (Triton 24.06 and later): kept while its execute runs; a request it has not answered when
    execute returns is answered when the model sends (from a thread of its own), each answer
    sent on at once, as a decoupled model's."""

    __slots__ = ("_executor", "_received", "_number", "_lock", "_running", "_sent", "_later")

    def __init__(self, executor: BatchExecutor, received: list[_Item], number: int) -> None:
        self._executor = executor
        self._received = received    # the batch's requests as they came: a request's index is its place
        self._number = number
        self._lock = executor.answers_lock
        self._running = True
        self._sent: dict[int, InferenceResponse] = {}   # a request's key -> sent while execute ran
        self._later: dict[int, int] = {}                # key -> its index: requests to answer when the model sends

    def send(self, key: int, response: InferenceResponse | None, final: bool) -> None:
        if response is None:
            return   # the FINAL flag after the one response: nothing more goes out
        with self._lock:
            if self._running:
                self._sent.setdefault(key, response)
                return
            index = self._later.pop(key, None)
        if index is not None:   # else its request was answered already, or is a sequence batch's padding
            executor = self._executor
            executor._answering.pop((self._number, index), None)
            item = self._received[index]
            executor._send_part(self._number, index, executor._encode_response(item.rid, item.infer.outputs,
                                                                                response)[0])

    def merged(self, keys: list[int], returned: list, failed: bool) -> tuple[list, set[int] | frozenset[int]]:
        """Each request's answer: sent, else returned, else _LATER (a model answering from a
        thread); and the requests whose sent answer stands though their execution failed or
        returned one too: in Triton the sent answer reached the client first, and the request
        counts as a failure."""
        if not self._sent and (failed or _none_missing(returned)):
            # Every request answered by its return (the usual): a send racing this check came after
            # the returns, and is dropped, as a later one is.
            return returned, frozenset()
        with self._lock:   # (sends only add to _sent: what the check above let through still needs merging)
            self._running = False
            sent = self._sent
            if failed:
                log.error("model %s failed after answering through a response sender: %s",
                          self._executor.model, returned[0].error.message)
            places = {item.key: index for index, item in enumerate(self._received)}
            merged = [sent[key] if key in sent else response if response is not None else self._unanswered(places, key)
                      for key, response in zip(keys, returned)]
            self._later = {key: places[key] for key, response in zip(keys, merged) if response is _LATER}
        return merged, {key for key, response in zip(keys, returned) if response is not None and key in sent}

    def _unanswered(self, places: dict[int, int], key: int):
        """_LATER, or the error of a request that cannot be answered later."""
        executor = self._executor
        if key not in places:   # a sequence batch's padding: nobody waits for its answer
            return None
        if executor.send is None:
            return None
        if executor.sequences is not None and executor.sequences.states:
            return InferenceResponse(error=InternalError(
                f"model '{executor.model}' keeps implicit sequence state, so it must answer each request "
                "before its execute returns, by returning or sending its response"))
        return _LATER


def _keep_state(sequences: SequenceInputs, item: _Item, outputs: dict[str, np.ndarray]) -> None:
    """A stateful model's output states, for the next request in the request's slot (none from a padding)."""
    if item.slot is not None and not item.padding:
        sequences.keep(item.slot, item.infer.sequence_flags, outputs)


def _none_missing(returned: list) -> bool:
    """Whether every request's response was returned (not ``None in returned``, which compares
    each response with None through its dataclass ``__eq__``)."""
    for response in returned:
        if response is None:
            return False
    return True


def _answered_only(trace: dict, rescheduled: list[int], count: int) -> dict:
    """A batch's trace stamps without its rescheduled requests (no response of theirs follows),
    the others' keyed by their places among the responses."""
    places = {index: place for place, index in enumerate(i for i in range(count) if i not in rescheduled)}
    return {**trace, "r": {places[int(index)]: stamps for index, stamps in trace["r"].items() if int(index) in places}}


def _response_record(rid: int, tensors: list, parameters, final: bool | None = None) -> list:
    descriptors, inline, external = pack_tensors(tensors)
    response = Response(rid, descriptors, params=parameters or None, final=final, external=len(external))
    return [response.encode(inline), *external]


def _error_record(rid: int, error, final: bool | None = None, trace: dict | None = None) -> bytes:
    error = error if isinstance(error, TritiumError) else InvalidArgument(str(error))
    return Response(rid, error=error, final=final, trace=trace).encode()
