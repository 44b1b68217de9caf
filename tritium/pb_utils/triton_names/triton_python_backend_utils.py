"""tritium's ``triton_python_backend_utils``: the helpers Triton Python models use.

Written for tritium against the documented contract of Triton's Python backend. The
classes that carry tensors and requests (``Tensor``, ``InferenceRequest``, ...) are
attached to this module by tritium's Python backend when an instance starts.
"""

from __future__ import annotations

import json
import struct

import numpy as np

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# The proto enum numbers of inference.DataType, and the numpy types Triton's helpers map them to.
_TYPE_ENUM = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32,
    12: np.float64, 13: np.object_,
}


def triton_string_to_numpy(triton_type_string):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type):
    return _TYPE_ENUM.get(data_type)


def numpy_to_triton_type(data_type):
    """The enum number of what equals one of numpy's types (a numpy type or dtype), as Triton's
    helper compares: ``np.bytes_`` and ``dtype("S")`` are BYTES (13), but a sized ``dtype("S5")``,
    Python's own types (``float``, ``bytes``), names (``"float32"``) and text have none (None)."""
    for enum_value, np_type in _TYPE_ENUM.items():
        if data_type == np_type:
            return enum_value
    return 13 if data_type == np.bytes_ else None


def serialize_byte_tensor(input_tensor):
    """Length-prefixed serialization of a BYTES tensor, returned as Triton 2.51's Python backend
    returns it: the bytes (``()`` for an empty tensor, None for a tensor of another datatype)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    chunks = []
    for item in input_tensor.flatten(order="C"):
        if not isinstance(item, bytes):
            item = str(item).encode("utf-8")
        chunks.append(struct.pack("<I", len(item)))
        chunks.append(item)
    return b"".join(chunks)


def deserialize_bytes_tensor(encoded_tensor):
    items = []
    view = memoryview(encoded_tensor)
    offset = 0
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset:offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


def get_input_tensor_by_name(inference_request, name):
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config, name):
    for tensor in model_config.get("input", []):
        if tensor["name"] == name:
            return tensor
    return None


def get_output_config_by_name(model_config, name):
    for tensor in model_config.get("output", []):
        if tensor["name"] == name:
            return tensor
    return None


def get_model_dir():
    """The model's version folder (``<repository>/<model>/<version>``), as Triton's stub gives it."""
    from tritium.pb_utils.types import runtime

    return runtime.model_dir


def using_decoupled_model_transaction_policy(model_config):
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The configuration a model's ``auto_complete_config`` may complete."""

    _IO_KEYS = ("name", "data_type", "dims", "optional")

    def __init__(self, model_config):
        if isinstance(model_config, str):
            model_config = json.loads(model_config)
        self._model_config = model_config

    def as_dict(self):
        return self._model_config

    def _name(self):
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size):
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
            raise ValueError(
                f"max_batch_size must be a non-negative integer for model '{self._name()}', "
                f"got {max_batch_size!r}")
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured} is greater than the "
                f"max_batch_size {max_batch_size} set in auto_complete_config function for "
                f"model '{self._name()}'")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input):
        self._add_io("input", input)

    def add_output(self, output):
        self._add_io("output", output)

    def _add_io(self, kind, tensor):
        name = self._name()
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} must be a dict in auto_complete_config of model '{name}'")
        allowed = self._IO_KEYS if kind == "input" else self._IO_KEYS[:3]
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for "
                    f"model '{name}' contains property other than {', '.join(allowed)}")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} in auto-complete-config function for model '{name}' is missing "
                    f"'{key}' property")
        existing = self._model_config.setdefault(kind, [])
        for current in existing:
            if current.get("name") != tensor["name"]:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type not in ("", "TYPE_INVALID") and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{name}', configuration expects datatype "
                    f"{current_type} for {kind} '{tensor['name']}', model provides "
                    f"{tensor['data_type']}")
            current_dims = [int(d) for d in current.get("dims", [])]
            if current_dims and current_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{name}', tensor '{tensor['name']}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{current_dims}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        existing.append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict):
        name = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{name}' contains property other than 'decoupled', which cannot be "
                    "autocompleted.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{name}', which is already set to {policy['decoupled']}.")
            policy["decoupled"] = wanted


# The classes Triton binds in C++, as its stub puts them here.
from tritium.pb_utils.triton_names.c_python_backend_utils import *  # noqa: E402,F401,F403

# The name some code uses for triton_to_numpy_type.
triton_type_to_numpy = triton_to_numpy_type
