"""Runs one BATCH message through an instance and builds the BATCH_DONE reply.

Decoding, reshaping, stacking along the batch dimension, splitting outputs and the
three compute timings of Triton's statistics all live here, so backends only see
numpy arrays. One bad request fails alone; an exception from the model fails the
requests of that execution and nothing else.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from repo import ModelConfig
from tritium import datatypes
from tritium.errors import InternalError, InvalidArgument, TritiumError
from tritium.protocol import Kind, pack, unpack
from workers.backends.base import InferenceRequest, InferenceResponse, Instance
from workers.tensors import array_to_frame, frame_to_array

log = logging.getLogger(__name__)


class BatchExecutor:
    def __init__(self, instance: Instance, config: ModelConfig) -> None:
        self.instance = instance
        self.model = config.name
        self.batching = config.max_batch_size > 0
        self.output_names = [o.name for o in config.output]
        self.output_types = {o.name: datatypes.from_config_name(
            _type_name(o.data_type)) for o in config.output}
        self.input_reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self.output_dims = {o.name: list(o.dims) for o in config.output if o.HasField("reshape")}
        self.stacks = instance.stacks_batches

    def run(self, frames: list) -> list:
        """Execute the batch in ``frames`` (header first); return the BATCH_DONE parts."""
        t0 = time.monotonic_ns()
        header = unpack(frames[0].buffer if hasattr(frames[0], "buffer") else frames[0])
        rids, requests, errors = self._decode_all(frames, header["n"])
        if self.stacks:
            responses, (t1, t2) = self._run_stacked(requests)
        else:
            t1 = time.monotonic_ns()
            responses = self._run_separately(requests)
            t2 = time.monotonic_ns()
        parts, frame_counts, oks = [], [], []
        for index, rid in enumerate(rids):
            response = errors.get(index) or responses.get(index)
            request = requests.get(index)
            encoded = self._encode(rid, request, response)
            parts.extend(encoded)
            frame_counts.append(len(encoded) - 1)
            oks.append(response.error is None)
        t3 = time.monotonic_ns()
        done = {"k": Kind.BATCH_DONE, "b": header["b"], "frames": frame_counts, "ok": oks,
                "t": [t1 - t0, t2 - t1, t3 - t2]}
        return [pack(done), *parts]

    # -- decoding -----------------------------------------------------------------------

    def _decode_all(self, frames: list, count: int):
        rids, requests, errors = [], {}, {}
        position = 1
        for index in range(count):
            request_header = unpack(_buffer(frames[position]))
            position += 1
            inputs = request_header.get("inputs", [])
            tensor_frames = frames[position:position + len(inputs)]
            position += len(inputs)
            rids.append(request_header["rid"])
            try:
                requests[index] = self._decode(request_header, inputs, tensor_frames)
            except TritiumError as exc:
                errors[index] = InferenceResponse(error=exc)
        return rids, requests, errors

    def _decode(self, header: dict, inputs: list, frames: list) -> InferenceRequest:
        arrays = {}
        for (name, datatype, shape), frame in zip(inputs, frames):
            array = frame_to_array(_buffer(frame), datatype, shape, name)
            reshape = self.input_reshape.get(name)
            if reshape is not None:
                array = array.reshape(([shape[0]] if self.batching else []) + reshape)
            arrays[name] = array
        return InferenceRequest(
            request_id=header.get("id", ""), inputs=arrays, requested_outputs=header.get("outputs"),
            parameters=header.get("params") or {}, batch_size=header.get("bs", 1))

    # -- execution ----------------------------------------------------------------------

    def _run_separately(self, requests: dict[int, InferenceRequest]) -> dict[int, InferenceResponse]:
        if not requests:
            return {}
        indexes = list(requests)
        try:
            responses = self.instance.execute([requests[i] for i in indexes])
        except Exception as exc:
            return self._fail_all(indexes, exc)
        if not isinstance(responses, list) or len(responses) != len(indexes):
            error = InternalError(
                f"model '{self.model}' returned {len(responses) if isinstance(responses, list) else type(responses).__name__} "
                f"responses for {len(indexes)} requests")
            return {i: InferenceResponse(error=error) for i in indexes}
        return dict(zip(indexes, responses))

    def _run_stacked(self, requests: dict[int, InferenceRequest]):
        if not requests:
            now = time.monotonic_ns()
            return {}, (now, now)
        indexes = list(requests)
        batch = [requests[i] for i in indexes]
        wanted = self._union_outputs(batch)
        try:
            inputs = self._stack(batch)
            t1 = time.monotonic_ns()
            outputs = self.instance.execute_batch(inputs, wanted)
            t2 = time.monotonic_ns()
            responses = self._split(batch, outputs)
        except Exception as exc:
            now = time.monotonic_ns()
            return self._fail_all(indexes, exc), (now, now)
        return dict(zip(indexes, responses)), (t1, t2)

    def _fail_all(self, indexes: list[int], exc: Exception) -> dict[int, InferenceResponse]:
        if isinstance(exc, TritiumError):
            error = exc
        else:
            log.warning("model %s failed to execute: %r", self.model, exc)
            error = InternalError(f"model '{self.model}' failed to execute: {type(exc).__name__}: {exc}")
        return {i: InferenceResponse(error=error) for i in indexes}

    def _union_outputs(self, batch: list[InferenceRequest]) -> list[str]:
        if any(r.requested_outputs is None for r in batch):
            return list(self.output_names)
        wanted = {name for r in batch for name in r.requested_outputs}
        return [name for name in self.output_names if name in wanted]

    def _stack(self, batch: list[InferenceRequest]) -> dict[str, np.ndarray]:
        if len(batch) == 1:
            return batch[0].inputs
        names = batch[0].inputs.keys()
        return {name: np.concatenate([r.inputs[name] for r in batch], axis=0) for name in names}

    def _split(self, batch: list[InferenceRequest], outputs: dict[str, np.ndarray]) -> list[InferenceResponse]:
        for name, array in outputs.items():
            self._check_output(name, array)
        if len(batch) == 1:
            return [InferenceResponse(outputs=outputs)]
        bounds = np.cumsum([r.batch_size for r in batch])[:-1]
        pieces = {name: np.split(array, bounds, axis=0) for name, array in outputs.items()}
        return [InferenceResponse(outputs={name: pieces[name][i] for name in outputs})
                for i in range(len(batch))]

    def _check_output(self, name: str, array: np.ndarray) -> None:
        expected = self.output_types.get(name)
        actual = datatypes.from_numpy(array.dtype)
        if expected is not None and actual is not None and actual.name != expected.name:
            raise InternalError(
                f"output '{name}' of model '{self.model}' is {actual.name}, but the model "
                f"configuration declares {expected.config_name}")

    # -- encoding -----------------------------------------------------------------------

    def _encode(self, rid: int, request: InferenceRequest | None, response: InferenceResponse | None) -> list:
        if response is None:
            response = InferenceResponse(error=InternalError(f"model '{self.model}' gave no response"))
        if response.error is not None:
            return [pack({"k": Kind.RESPONSE, "rid": rid, "err": _wire_error(response.error)})]
        names = request.requested_outputs if request and request.requested_outputs is not None \
            else [n for n in self.output_names if n in response.outputs] + \
                 [n for n in response.outputs if n not in self.output_names]
        descriptors, frames = [], []
        try:
            for name in names:
                if name not in response.outputs:
                    raise InternalError(f"model '{self.model}' did not produce output '{name}'")
                array = response.outputs[name]
                if not isinstance(array, np.ndarray):
                    array = np.asarray(array)
                dims = self.output_dims.get(name)
                if dims is not None:
                    array = array.reshape(([array.shape[0]] if self.batching else []) + dims)
                datatype, shape, frame = array_to_frame(array, name)
                descriptors.append([name, datatype, shape])
                frames.append(frame)
        except TritiumError as exc:
            return [pack({"k": Kind.RESPONSE, "rid": rid, "err": exc.to_wire()})]
        header = {"k": Kind.RESPONSE, "rid": rid, "outputs": descriptors}
        if response.parameters:
            header["params"] = response.parameters
        return [pack(header), *frames]


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(data_type)


def _wire_error(error) -> dict:
    if isinstance(error, TritiumError):
        return error.to_wire()
    return InvalidArgument(str(error)).to_wire()
