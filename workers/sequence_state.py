"""Inside the instance: what the sequence batcher adds to a stateful model's requests.

The broker tells the instance each request's sequence slot (``sl`` in the BATCH record)
and passes the request's correlation id and START/END flags in its INFER record; from
those and the model config this module makes, per request:

* the control tensors ``sequence_batching.control_input`` declares: START, END and READY
  with their declared false/true values and data type, CORRID with the correlation id in
  the declared type (32-bit types keep the low 32 bits, as Triton's do). Each is shaped
  ``[1]``, or ``[1, 1]`` when the model batches, as Triton gives them;
* the implicit state (``sequence_batching.state``): the input state of a request is the
  output state of the previous request in the same slot; a START begins from the
  ``initial_state`` (zeros or ``<model>/initial_state/<data_file>``), or from zeros when
  there is none (Triton leaves that memory uninitialized); the state of a slot is dropped
  when its sequence's END request has run. An output state not declared as a model
  output never reaches the client;
* for ``direct``, the not-ready requests Triton puts in the slots between those that have
  a request: every input zero, READY false, START and END false, CORRID 0.

State lives per slot, as in Triton: at most one sequence holds a slot at a time, and
every sequence begins in its slot with a START, which resets the state, so a slot the
broker freed for an idle sequence needs no message to the instance. Memory is bounded by
the slot count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from tritium.model_config_proto import model_config_pb2

from tritium.repo import ModelConfig
from tritium import datatypes
from tritium.errors import InvalidArgument
from tritium.protocol import Infer
from tritium.workers.tensors import array_to_frame, deserialize_bytes, frame_to_array

log = logging.getLogger(__name__)

START = 1
END = 2
_Kind = model_config_pb2.ModelSequenceBatching.Control
_UNSIGNED = {"UINT64": np.uint64, "INT64": np.uint64, "UINT32": np.uint32, "INT32": np.uint32}
_INITIAL_STATE_FOLDER = "initial_state"


@dataclass(frozen=True, slots=True)
class _Control:
    name: str
    kind: int
    datatype: str
    values: tuple = ()   # (false, true); empty for CORRID


@dataclass(frozen=True, slots=True)
class _State:
    input_name: str
    output_name: str
    datatype: datatypes.DataType
    initial: np.ndarray   # without the batch dimension
    declared_output: bool  # also a model output, which a client may ask for


def _datatype(config_type: int) -> datatypes.DataType:
    # (a validated config's: TYPE_INVALID, the one type without an entry, is refused)
    return datatypes.BY_CONFIG_NAME[model_config_pb2.DataType.Name(config_type)]


def _controls(config: ModelConfig) -> list[_Control]:
    controls = []
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                controls.append(_Control(control_input.name, control.kind, _datatype(control.data_type).name))
            elif len(control.int32_false_true):
                controls.append(_Control(control_input.name, control.kind, "INT32",
                                         tuple(control.int32_false_true)))
            elif len(control.fp32_false_true):
                controls.append(_Control(control_input.name, control.kind, "FP32", tuple(control.fp32_false_true)))
            else:
                controls.append(_Control(control_input.name, control.kind, "BOOL", tuple(control.bool_false_true)))
    return controls


def _initial_state(state, model_dir: Path | None) -> np.ndarray:
    datatype = _datatype(state.data_type)
    if not len(state.initial_state):
        return _zeros(datatype, [1 if d < 0 else d for d in state.dims])
    initial = state.initial_state[0]
    dims = list(initial.dims)
    if initial.WhichOneof("state_data") != "data_file":
        return _zeros(datatype, dims)
    if model_dir is None:
        raise ValueError(f"state '{state.input_name}': initial_state data_file needs the model folder")
    path = model_dir / _INITIAL_STATE_FOLDER / initial.data_file
    try:
        data = path.read_bytes()
    except OSError as exc:   # Triton's words
        raise InvalidArgument(f"failed to open text file for read {path}: {exc.strerror}") from None
    if datatype.is_bytes:
        return deserialize_bytes(data, dims, state.input_name)
    count = int(np.prod(dims, dtype=np.int64))
    expected = count * datatype.itemsize
    if len(data) < expected:   # Triton's words, its missing space included
        raise InvalidArgument(f"initial_state setting expects {expected} bytes, but the data provided from "
                              f"{initial.data_file}only has {len(data)} bytes.")
    return np.frombuffer(data, dtype=datatypes.numpy_dtype(datatype), count=count).reshape(dims).copy()


def _zeros(datatype: datatypes.DataType, dims: list[int]) -> np.ndarray:
    if datatype.is_bytes:
        array = np.empty(dims, dtype=np.object_)
        array.fill(b"")
        return array
    return np.zeros(dims, dtype=datatypes.numpy_dtype(datatype))


class SequenceInputs:
    """A stateful model's control tensors, implicit state per slot, and padding requests."""

    def __init__(self, config: ModelConfig, model_dir: Path | None = None) -> None:
        batching = config.sequence_batching
        self.batched = config.max_batch_size > 0
        self.pads = batching.WhichOneof("strategy_choice") != "oldest"   # direct pads the gaps between slots
        self.controls = _controls(config)
        outputs = {o.name for o in config.output}
        self.states = [_State(s.input_name, s.output_name, _datatype(s.data_type), _initial_state(s, model_dir),
                              s.output_name in outputs) for s in batching.state]
        self.state_outputs = [s.output_name for s in self.states]
        self._slots: dict[int, dict[str, np.ndarray]] = {}   # slot -> state input name -> array
        self._shape = [1, 1] if self.batched else [1]

    @property
    def added(self) -> int:
        """How many inputs ``add_inputs`` appends to each request."""
        return len(self.controls) + len(self.states)

    # -- inputs ---------------------------------------------------------------------------

    def add_inputs(self, request: Infer, views: list, slot: int) -> None:
        """Append the control tensors and the slot's input states to one request's inputs."""
        flags = request.sequence_flags
        if flags & START:
            self._slots.pop(slot, None)
        for name, datatype, shape, data in [*self._control_tensors(flags, request.sequence_id or 0, True),
                                            *self._state_tensors(self._slots.get(slot, {}))]:
            request.inputs.append([name, datatype, shape, len(data), False])
            views.append(data)

    def null_request(self, request: Infer, views: list) -> tuple[Infer, list]:
        """A not-ready request shaped like ``request`` (which ``add_inputs`` completed)."""
        given = request.inputs[:len(request.inputs) - self.added]
        descriptors, data = [], []
        for descriptor in given:
            zero = _zero_bytes(descriptor[1], descriptor[2])
            descriptors.append([descriptor[0], descriptor[1], descriptor[2], len(zero), False])
            data.append(zero)
        # The state of the slot padded is the model's business no more than its inputs: zeros.
        states = {s.input_name: np.zeros_like(self._as_array(views, request, s.input_name)) for s in self.states
                  if not s.datatype.is_bytes}
        for name, datatype, shape, tensor in [*self._control_tensors(0, 0, False), *self._state_tensors(states)]:
            descriptors.append([name, datatype, shape, len(tensor), False])
            data.append(tensor)
        null = msgspec.structs.replace(request, inputs=descriptors, request_id=None, outputs=None, sequence_id=None,
                                       sequence_flags=0)
        return null, data

    @staticmethod
    def _as_array(views: list, request: Infer, name: str) -> np.ndarray:
        for descriptor, view in zip(request.inputs, views):
            if descriptor[0] == name:
                return frame_to_array(view, descriptor[1], descriptor[2], name)
        raise KeyError(name)

    def _control_tensors(self, flags: int, correlation_id, ready: bool) -> list[tuple]:
        tensors = []
        for control in self.controls:
            if control.kind == _Kind.CONTROL_SEQUENCE_CORRID:
                data = self._correlation_id(control.datatype, correlation_id)
            else:
                on = {_Kind.CONTROL_SEQUENCE_START: bool(flags & START), _Kind.CONTROL_SEQUENCE_END: bool(flags & END),
                      _Kind.CONTROL_SEQUENCE_READY: ready}[control.kind]
                dtype = datatypes.numpy_dtype(datatypes.BY_NAME[control.datatype])
                data = np.array([control.values[on]], dtype=dtype).tobytes()
            tensors.append((control.name, control.datatype, list(self._shape), data))
        return tensors

    @staticmethod
    def _correlation_id(datatype: str, correlation_id) -> bytes:
        if datatype == "BYTES":
            return datatypes.pack_bytes([str(correlation_id).encode()])
        if isinstance(correlation_id, str):
            correlation_id = 0   # a string id has no number (Triton passes undefined bytes)
        unsigned = _UNSIGNED[datatype]
        mask = (1 << (8 * np.dtype(unsigned).itemsize)) - 1
        value = np.array([correlation_id & mask], dtype=unsigned)
        return value.view(datatypes.numpy_dtype(datatypes.BY_NAME[datatype])).tobytes()

    def _state_tensors(self, stored: dict[str, np.ndarray]) -> list[tuple]:
        tensors = []
        for state in self.states:
            array = stored.get(state.input_name)
            if array is None:
                array = state.initial[np.newaxis] if self.batched else state.initial
            datatype, shape, data = array_to_frame(array, state.input_name)
            tensors.append((state.input_name, datatype, shape, data))
        return tensors

    # -- outputs --------------------------------------------------------------------------

    def keep(self, slot: int, flags: int, outputs: dict) -> None:
        """Store one request's output states for the slot's next request; take them out of
        ``outputs`` unless the config declares them as model outputs."""
        if not self.states:
            return
        stored = self._slots.setdefault(slot, {})
        for state in self.states:
            array = outputs.get(state.output_name) if state.declared_output else outputs.pop(state.output_name, None)
            if array is not None:
                array = np.array(array, copy=True)
                if not state.datatype.is_bytes:
                    array = array.astype(datatypes.numpy_dtype(state.datatype), copy=False)
                stored[state.input_name] = array
        if flags & END:
            del self._slots[slot]

    def keep_rows(self, rows: list, outputs: dict) -> None:
        """``keep`` for a stacked batch: row i of each output belongs to ``rows[i]``, a
        (slot, flags) pair, or None for a padding request."""
        if not self.states:
            return
        states = {s.output_name: outputs.get(s.output_name) if s.declared_output else outputs.pop(s.output_name, None)
                  for s in self.states}
        for index, row in enumerate(rows):
            if row is not None:
                self.keep(row[0], row[1], {name: array[index:index + 1] for name, array in states.items()
                                           if array is not None})


def _zero_bytes(datatype: str, shape: list[int]) -> bytes:
    count = int(np.prod(shape, dtype=np.int64))
    dt = datatypes.from_name(datatype)
    return b"\0\0\0\0" * count if dt is None or dt.is_bytes else bytes(count * dt.itemsize)
