"""``model_warmup``: requests an instance runs before it says hello, so no client pays for them.

As in Triton, each warmup sample is ``count`` executions (at least one) of one batch of
``batch_size`` requests, each a request of batch 1 with the inputs the sample describes: zeros,
random values, or the bytes of a file in the model's ``warmup/`` folder (each request's own
data). The requests are checked as a client's are and go through the same executor as real
batches; an execution is over once every request has its final response (a decoupled model's
may come from its own threads after execute returns). A sample that cannot be built, or a
response that is an error, makes the instance fail to initialize, with Triton's words (the model
is not ready until its warmup succeeds).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
from tritium.model_config_proto import model_config_pb2

from tritium.repo import ModelConfig
from tritium.datatypes import DataType, from_config_name, pack_bytes
from tritium.errors import InvalidArgument
from tritium.input_checks import check_inputs, declared_inputs
from tritium.protocol import Batch, BatchDone, Infer, Response, pack_tensors, read_record
from tritium.workers.records import read_batch_done, read_response, read_response_part

log = logging.getLogger(__name__)


class WarmupFailed(Exception):
    """The load error of a warmup that failed, as Triton words it (its status's words first)."""


def warm_up(executor, config: ModelConfig, model_dir: Path) -> list[list[int]]:
    """Run every warmup sample of ``config``; WarmupFailed if one fails. The executions that ran, each
    [requests, compute_input_ns, compute_infer_ns, compute_output_ns], which the statistics count as
    Triton's do."""
    executions: list[list[int]] = []
    instance = os.environ.get("TRITIUM_INSTANCE_NAME", config.name)
    # Every sample's data is built before any runs, as in Triton, which skips a sample of batch 0.
    samples = [(sample, _sample_frames(config, model_dir, sample, instance))
               for sample in config.model_warmup if sample.batch_size > 0]
    # A sequence model's warmup requests belong to no sequence: as in Triton, the model gets them
    # without control inputs or state, with correlation ID 0.
    sequences, executor.sequences = executor.sequences, None
    try:
        for sample, frames in samples:
            _run_sample(executor, sample, frames, instance, executions)
    finally:
        executor.sequences = sequences
    return executions


def _run_sample(executor, sample, frames: list, instance: str, executions: list[list[int]]) -> None:
    for iteration in range(1, max(1, sample.count) + 1):
        log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d", executor.model,
                  instance, sample.name, iteration)
        done, errors = _run(executor, frames, sample.batch_size)
        if errors:   # every request's error, each followed by "; ", as Triton joins them
            raise WarmupFailed(f"Invalid argument: failed to run warmup sample '{sample.name}': "
                               + "".join(f"{error}; " for error in errors))
        executions.append([sample.batch_size, *done.timings])


def _run(executor, frames: list, count: int) -> tuple[BatchDone, list[str]]:
    """One execution of a sample's batch of ``count`` requests, once each has its final response;
    the errors among its responses. Responses sent through the requests' response senders (a
    decoupled model's) are kept here: a warmup's answers go to no client."""
    sent = _SentResponses()
    send, executor.send = executor.send, sent.take
    try:
        parts = executor.run(list(frames))
        done, _, _ = read_batch_done(parts[0])
        if done.still_open is not None:   # answered through the response senders: each request's final
            # (every request's, not only those still open: a model's thread may send a final as
            # execute returns, the batch's record no longer naming it, its response not yet here)
            rescheduled = set(done.rescheduled or ())
            sent.wait_for([index for index in range(count) if index not in rescheduled])
    finally:
        executor.send = send
    return done, ([] if all(done.ok) else _errors(parts[1:], done.response_frames)) + sent.taken_errors()


class _SentResponses:
    """What a warmup batch's response senders send, perhaps from the model's own threads."""

    def __init__(self) -> None:
        self._error_messages: list[str] = []
        self._finished: set[int] = set()
        self._changed = threading.Condition()

    def take(self, parts: list) -> None:
        """A RESPONSE_PART and its RESPONSE (``BatchExecutor.send``)."""
        part, _, _ = read_response_part(parts[0])
        response, _, _ = read_response(parts[1])
        with self._changed:
            if response.error is not None:
                self._error_messages.append(response.error.message)
            if response.final is not False:   # (a model that is not decoupled answers once)
                self._finished.add(part.index)
                self._changed.notify_all()

    def taken_errors(self) -> list[str]:
        with self._changed:
            return list(self._error_messages)

    def wait_for(self, indexes: list[int]) -> None:
        """Until each of these requests has its final response; as in Triton, however long that takes."""
        with self._changed:
            self._changed.wait_for(lambda: self._finished.issuperset(indexes))


def _sample_frames(config: ModelConfig, model_dir: Path, sample, instance: str) -> list:
    """The BATCH of the sample's ``batch_size`` requests of batch 1, checked as Triton checks them."""
    batch = sample.batch_size
    batching = config.max_batch_size > 0
    tensors = []
    for name, spec in sample.inputs.items():
        if any(d < 0 for d in spec.dims):
            raise WarmupFailed("Invalid argument: warmup setting expects all variable-size dimensions are specified "
                               f"for input '{name}'")
        datatype = from_config_name(model_config_pb2.DataType.Name(spec.data_type))
        shape = ([1] if batching else []) + list(spec.dims)
        if datatype is None:   # no data_type: no data, and the check below refuses it in Triton's words
            tensors.append((name, "<invalid>", shape, b""))
        else:
            tensors.append((name, datatype.name, shape, _input_bytes(spec, datatype, shape, model_dir / "warmup")))
    try:
        check_inputs(config.name, declared_inputs(config), config.max_batch_size, [(n, d, s) for n, d, s, _ in tensors])
    except InvalidArgument as exc:
        raise WarmupFailed(f"Invalid argument: [request id: <id_unknown>] {exc.message}") from None
    if batch != 1 and batch > config.max_batch_size:   # each request of the batch refused by the backend
        refusal = f"batch size {batch} for '{instance}', max allowed is {config.max_batch_size}; "
        raise WarmupFailed(f"Invalid argument: failed to run warmup sample '{sample.name}': {refusal * batch}")
    descriptors, inline, external = pack_tensors(tensors)
    frames = [Batch(0, batch).encode()]
    for rid in range(batch):
        frames += [Infer(rid, config.name, descriptors, batch_size=1, external=len(external)).encode(inline), *external]
    return frames


def _input_bytes(spec, datatype: DataType, shape: list[int], folder: Path) -> bytes:
    count = int(np.prod(shape)) if shape else 1
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        path = folder / spec.input_data_file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise WarmupFailed(f"Internal: failed to open text file for read {path}: {exc.strerror}") from None
        if datatype.is_bytes:
            return data
        expected = count * datatype.itemsize   # (a larger file: its first bytes)
        if len(data) < expected:
            raise WarmupFailed(f"Invalid argument: [request id: <id_unknown>] warmup setting expects {expected} bytes, "
                               f"but the data provided from {spec.input_data_file} has {len(data)} bytes")
        return data[:expected]
    if datatype.is_bytes:   # length-prefixed elements: empty ones, or short made-up ones
        return pack_bytes([b"" if source == "zero_data" else b"warmup"] * count)
    dtype = datatype.numpy or np.dtype("<u2")   # BF16: its bits
    if source == "random_data":
        values = np.random.default_rng(0).random(count) * 2 - 1 if dtype.kind == "f" else \
            np.random.default_rng(0).integers(0, 2, count)
        return values.astype(dtype).tobytes()
    return np.zeros(count, dtype=dtype).tobytes()


def _errors(responses: list, external_counts: list[int]) -> list[str]:
    """The messages of the failed responses among a batch's RESPONSE parts (each record followed
    by its external frames)."""
    errors, position = [], 0
    for count in external_counts:
        record, _, _ = read_record(responses[position])
        if isinstance(record, Response) and record.error is not None:
            errors.append(record.error.message)
        position += 1 + count
    return errors or ["the model failed"]
