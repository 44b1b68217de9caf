"""The classes Triton's Python backend gives ``model.py``, as tritium implements them.

Triton binds these in C++; tritium's are plain Python with the same names, methods and
behaviour. ``triton_python_backend_utils`` re-exports them. What needs the instance
process (BLS requests, response senders) reaches it through ``runtime``, which the
Python backend fills in when an instance starts.
"""

from __future__ import annotations

import enum
import json
import logging
import operator
import os
import sys
import threading
from typing import Any

import numpy as np

from tritium import datatypes

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_MEMORY_GPU = 2
TRITONSERVER_MEMORY_CPU = 0
# What pybind11 raises for an argument it cannot convert (Triton's bindings, built without details).
PYBIND_CAST = ("Unable to cast Python instance to C++ type (#define PYBIND11_DETAILED_ERROR_MESSAGES or compile "
               "in debug mode for details)")


class _Runtime:
    """Hooks into the instance process: set by workers/backends/python_backend.py."""

    model_name = ""
    model_dir = ""        # the model's version folder: pb_utils.get_model_dir()
    instance_name = ""    # named in the errors of custom metrics, as Triton names it
    _bls = None           # the BlsClient of this instance process
    bls_open = False      # between initialize and finalize: BLS is refused in both, as in Triton
    release_flags_set = False   # a request's set_release_flags was called: the instance looks after execute

    @property
    def bls(self):
        """The BLS client of this process, for InferenceRequest.exec(): a process the model forked
        (a multiprocessing pool, as Triton's BLS allows) gets a socket of its own, since one
        socket shared by two processes would hand each the other's answers."""
        client = self._bls
        if client is not None and client.pid != os.getpid():
            with _FORKED:   # (two threads of the forked process asking first would make two)
                client = self._bls
                if client.pid != os.getpid():
                    client = self._bls = client.for_this_process()
        return client

    @bls.setter
    def bls(self, client) -> None:
        self._bls = client


runtime = _Runtime()
_FORKED = threading.Lock()


def _after_fork() -> None:
    global _FORKED
    _FORKED = threading.Lock()   # another thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork)


class _ErrorCode(enum.Enum):
    """TritonError's codes as Triton binds them (a pybind11 enum): equal to their numbers and
    hashed as them, so that a dict keyed by either finds them, yet not ints and not ordered."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __eq__(self, other):
        if isinstance(other, _ErrorCode):
            return self is other
        return self.value == other   # as pybind11 compares an enum: by its number (2, 2.0, numpy's ints)

    def __hash__(self):
        return hash(self.value)

    def __int__(self):
        return self.value

    __index__ = __int__


_ErrorCode.__name__ = "__ErrorCode"   # its repr, as Triton's: <__ErrorCode.NOT_FOUND: 2>
_ErrorCode.__qualname__ = "TritonError.__ErrorCode"   # where pickle finds it (set below)


class TritonError:
    """An error a model returns in a response (not an exception: Triton's API)."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message, code=_ErrorCode.INTERNAL):
        if type(code) is not _ErrorCode:   # Triton's constructor takes one of the codes only, not a number
            raise incompatible_arguments(
                "__init__", "c_python_backend_utils.TritonError(message: str, code: "
                "c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)", message, code)
        self._message = str(message)
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code

    def __repr__(self):
        return f"TritonError({self._message!r}, code={self._code})"


setattr(TritonError, "__ErrorCode", _ErrorCode)   # (a name in the class body would be mangled)


class TritonModelException(Exception):
    """What Triton's stub raises for errors; models raise it too."""

    def message(self):
        return str(self)


def refused_by_server(what: str, message: str) -> TritonModelException:
    """Triton's wording for what its server refused a model's request for (metrics, model control)."""
    return TritonModelException(f"{what}: Failed to process the request for model '{runtime.instance_name}', "
                                f"message: {message}")


def as_text(value):
    """``value`` as Triton's bindings take a string argument: str (a subclass made plain), or bytes
    as UTF-8 (a name read from a BYTES tensor, as Triton's BLS example passes it); anything else
    as it is, for the caller to refuse."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value) if isinstance(value, str) else value


_NOT_GIVEN = object()   # an argument the caller left out


def incompatible_arguments(function: str, signature: str, *invoked) -> TypeError:
    """pybind11's TypeError for arguments that fit none of a function's (or a constructor's) signatures."""
    kind = "constructor" if function == "__init__" else "function"
    return TypeError(f"{function}(): incompatible {kind} arguments. The following argument types are supported:"
                     f"\n    1. {signature}\n\nInvoked with: {', '.join(repr(a) for a in invoked)}")


class Tensor:
    def __init__(self, name, data):
        if type(name) is not str:
            name = as_text(name)
        if not isinstance(name, str) or not isinstance(data, np.ndarray):   # Triton's takes a numpy array only
            raise TypeError(f"Tensor(): incompatible constructor arguments: a name (str) and a numpy array, "
                            f"got {type(name).__name__} and {type(data).__name__}")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = data   # fixed-width bytes (numpy's S) too are kept as given, as Triton keeps them
        if array.dtype.kind == "U" or datatypes.from_numpy(array.dtype) is None:   # Triton refuses text as well
            raise TritonModelException(
                f"tensor '{name}' has numpy dtype {array.dtype}, which has no Triton datatype")
        self._name = name
        self._array = array

    @classmethod
    def _of(cls, name: str, array: np.ndarray) -> Tensor:
        """A tensor of an array tritium made itself (a request's input): nothing to check."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self):
        return self._name

    def as_numpy(self):
        array = self._array
        if array.dtype.kind == "V" and datatypes.is_bf16(array.dtype):   # numpy has no BF16 of its own: Triton refuses
            raise TritonModelException("Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() "
                                       "and from_dlpack() instead.")
        return array

    def shape(self):
        return list(self._array.shape)

    def triton_dtype(self):
        from tritium.pb_utils.triton_names.triton_python_backend_utils import numpy_to_triton_type

        dtype = self._array.dtype
        return 13 if dtype.kind == "S" else numpy_to_triton_type(dtype)   # (the helper has no type for S5)

    def is_cpu(self):
        return True

    def to_dlpack(self):
        return self._exported().__dlpack__()

    def __dlpack__(self, stream=None):
        """So that ``torch.from_dlpack(tensor)`` takes it as it is, as Triton's tensors allow."""
        return self._exported().__dlpack__()

    def __dlpack_device__(self):
        return self._exported().__dlpack_device__()

    def _exported(self):
        """What exports the tensor's memory through DLPack: its array, or for BF16, which numpy
        cannot export, a PyTorch view of it (a model using BF16 through DLPack has PyTorch)."""
        array = self._array
        if not datatypes.is_bf16(array.dtype):
            return array
        try:
            import torch
        except ImportError:
            raise TritonModelException("a BF16 tensor is exported through DLPack with PyTorch, "
                                       "which is not installed") from None
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)

    @staticmethod
    def from_dlpack(name, dlpack):
        """A tensor over ``dlpack``'s memory: an object with ``__dlpack__`` (a torch tensor) or the
        capsule ``to_dlpack()`` made, as Triton's examples pass it (CPU memory only here)."""
        name = as_text(name)
        if not isinstance(name, str):
            raise TypeError(f"from_dlpack(): incompatible function arguments: the name must be a str, "
                            f"got {type(name).__name__}")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        torch = sys.modules.get("torch")
        if type(dlpack).__name__ == "PyCapsule":
            if torch is not None:   # a capsule says nothing of its dtype before it is opened: torch opens BF16 too
                return Tensor(name, _numpy_of_torch(torch, torch.utils.dlpack.from_dlpack(dlpack)))
            dlpack = _Capsule(dlpack)
        elif not (hasattr(dlpack, "__dlpack__") and hasattr(dlpack, "__dlpack_device__")):
            raise TritonModelException(_NOT_DLPACK)
        elif isinstance(dlpack, Tensor):   # another pb_utils tensor (BF16 too): its memory, shared
            return Tensor._of(name, dlpack._array)
        elif torch is not None and isinstance(dlpack, torch.Tensor):
            return Tensor(name, _numpy_of_torch(torch, dlpack))
        return Tensor(name, np.from_dlpack(dlpack))

    def __repr__(self):
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def _numpy_of_torch(torch, tensor) -> np.ndarray:
    """A CPU torch tensor's memory as numpy, BF16 included (as ml_dtypes' bfloat16)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(datatypes.numpy_dtype(datatypes.BY_NAME["BF16"]))
    return tensor.numpy()


# Triton's text, the spaces of its source's continued line included.
_NOT_DLPACK = ("Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and "
               "`__dlpack_device__` attributes")


class _Capsule:
    """A bare DLPack capsule as numpy takes one: an object that hands it out (a capsule says
    nothing of its device before it is opened; tritium's tensors are in CPU memory)."""

    def __init__(self, capsule) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)   # kDLCPU


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None, parameters=None):
        tensors = _tensor_list(output_tensors, "InferenceResponse", "output_tensors")
        if None in tensors:
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse(): incompatible constructor arguments: error must be a "
                            f"pb_utils.TritonError or None, got {type(error).__name__}")
        self._tensors = tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self):
        return self._tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


def _tensor_list(tensors, function: str, argument: str) -> list:
    """A list argument of pb_utils.Tensor (None entries kept, for the caller's own error), or
    the TypeError Triton's bindings raise for what is not one (None itself included)."""
    if isinstance(tensors, (list, tuple)):
        for tensor in tensors:
            if tensor is not None and not isinstance(tensor, Tensor):
                break
        else:
            return list(tensors)
    raise TypeError(f"{function}(): incompatible constructor arguments: {argument} must be a list of "
                    f"pb_utils.Tensor, got {type(tensors).__name__}")


def _parameters_json(parameters) -> str:
    """A request's or response's ``parameters`` as JSON text, refused as Triton's bindings refuse
    them (their words, the C++ type's name of a dict included)."""
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return json.dumps(parameters)


class InferenceResponseSender:
    """Sends the responses of one request: a decoupled model's 0..N, then FINAL; any other
    model's one response, with FINAL or followed by it (Triton 24.06 and later)."""

    def __init__(self, send, cancelled=lambda: False, decoupled=True):
        self._send = send
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0   # responses sent

    def send(self, response=None, flags=0):
        if response is not None and not isinstance(response, InferenceResponse):
            raise incompatible_arguments(
                "send", "(self: c_python_backend_utils.InferenceResponseSender, response: "
                "c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> None", self, response)
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):   # (Triton's checks and texts)
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is None and not final:
            raise TritonModelException("Inference Response object must be provided when the response flags is "
                                       "set to zero.")
        if not self._decoupled:   # Triton's checks and texts
            if response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response.")
            if response is None and not self._sent:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send "
                                           "complete final before sending a response.")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._send(response, final)
        self._sent += response is not None
        if final:
            self._closed = True

    def _has_sent(self) -> bool:
        return self._sent > 0

    def is_cancelled(self):
        return self._cancelled()


class PreferredMemory:
    def __init__(self, preferred_memory_type=TRITONSERVER_MEMORY_CPU, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_REQUIRED: Any = object()   # an argument Triton's InferenceRequest has no default for


def _check_required(**arguments) -> None:
    """Triton's bindings refuse a missing required argument, or None for any of these, with a
    TypeError (their ``incompatible constructor arguments``): a call that runs on tritium must run
    on Triton."""
    missing = [name for name, value in arguments.items() if value is _REQUIRED]
    nones = [name for name, value in arguments.items() if value is None]
    if missing or nones:
        problems = ([f"missing required argument(s): {', '.join(missing)}"] if missing else []) + \
                   ([f"None given for: {', '.join(nones)}"] if nones else [])
        raise TypeError("InferenceRequest(): incompatible constructor arguments: " + "; ".join(problems)
                        + " (inputs, requested_output_names and model_name are required)")


# The integer arguments of a BLS request and the C types Triton's bindings read them as.
_INTEGER_RANGES = {"model_version": (-2**63, 2**63), "flags": (0, 2**32), "timeout": (0, 2**64)}


def _check_integers(**arguments) -> dict[str, int]:
    """The arguments as integers; as Triton's bindings, anything else (a string, a float, a value
    its C type cannot hold) is a TypeError when the request is made, not an error when it runs."""
    checked = {}
    for name, value in arguments.items():
        low, high = _INTEGER_RANGES[name]
        try:
            number = operator.index(value)   # (numpy integers too, as pybind11 takes them)
        except TypeError:
            number = None
        if number is None or not low <= number < high:
            raise TypeError(f"InferenceRequest(): incompatible constructor arguments: {name} must be an integer "
                            f"from {low} to {high - 1}, got {value!r}")
        checked[name] = number
    return checked


class InferenceRequest:
    """A request given to ``execute``, or one a model builds to call another model (BLS)."""

    def __init__(self, request_id="", correlation_id=0, inputs=_REQUIRED, requested_output_names=_REQUIRED,
                 model_name=_REQUIRED, model_version=-1, flags=0, timeout=0, preferred_memory=None,
                 trace=None, parameters=None):
        _check_required(request_id=request_id, correlation_id=correlation_id, inputs=inputs,
                        requested_output_names=requested_output_names, model_name=model_name,
                        model_version=model_version, flags=flags, timeout=timeout)
        # (first, as pybind11 converts the arguments before the constructor's own checks)
        integers = _check_integers(model_version=model_version, flags=flags, timeout=timeout)
        if not isinstance(correlation_id, (int, str)):   # bytes too: Triton checks for str itself
            raise TritonModelException("Correlation ID must be integer or string")
        correlation_id = str(correlation_id) if isinstance(correlation_id, str) else int(correlation_id)
        if isinstance(correlation_id, int) and not 0 <= correlation_id < 2 ** 64:   # Triton's is a uint64
            raise RuntimeError(PYBIND_CAST)
        self._request_id = as_text(request_id)
        self._correlation_id = correlation_id
        self._inputs = _tensor_list(inputs, "InferenceRequest", "inputs")
        if not isinstance(requested_output_names, (list, tuple)):   # a str is not a list of names to Triton
            raise TypeError("InferenceRequest(): incompatible constructor arguments: requested_output_names "
                            f"must be a list of str, got {type(requested_output_names).__name__}")
        self._requested_output_names = [as_text(name) for name in requested_output_names]
        self._model_name = as_text(model_name)
        self._check_entries()
        self._model_version = integers["model_version"]
        self._flags = integers["flags"]
        self._timeout = integers["timeout"]
        self._parameters = _parameters_json(parameters)
        self._sender = None
        self._origin = None   # a request given to execute: the instance's request (its client may cancel it)
        self._release_flags = 1   # TRITONSERVER_REQUEST_RELEASE_ALL
        self._trace = trace   # a traced request's CallTrace; passed on, a BLS call joins its trace

    def _check_entries(self) -> None:
        if not all(isinstance(name, str) for name in self._requested_output_names):
            raise TypeError("InferenceRequest(): incompatible constructor arguments: requested_output_names "
                            "must be a list of str")
        which = f"for request with id '{self._request_id}' and model name '{self._model_name}'"
        if any(tensor is None for tensor in self._inputs):
            raise TritonModelException(f"Input tensor {which} should not be empty.")
        if any(name == "" for name in self._requested_output_names):
            raise TritonModelException(f"Requested output name {which} should not be empty.")

    @classmethod
    def _received(cls, request_id: str, correlation_id, flags: int, inputs: list, requested_output_names: set,
                  model_name: str, model_version: int, parameters: dict, trace) -> InferenceRequest:
        """A request given to ``execute``: built from what tritium already checked, once per request
        (its parameters as the gateway checked them, made JSON text only if the model asks)."""
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = 0
        request._parameters = parameters
        request._sender = None
        request._origin = None
        request._release_flags = 1   # TRITONSERVER_REQUEST_RELEASE_ALL
        request._trace = trace
        return request

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = _check_integers(flags=flags)["flags"]

    def timeout(self):
        return self._timeout

    def parameters(self):
        if not isinstance(self._parameters, str):   # a received request's, as checked by the gateway
            # Compact and unescaped, as Triton's backend writes them (a model's own are json.dumps's).
            self._parameters = json.dumps(self._parameters, separators=(",", ":"), ensure_ascii=False) \
                if self._parameters else "{}"
        return self._parameters

    def requested_output_names(self):
        return self._requested_output_names

    def model_name(self):
        return self._model_name

    def model_version(self):
        return self._model_version

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException("get_response_sender() is only available to requests given to execute")
        if not isinstance(self._sender, InferenceResponseSender):   # made on first use: most models never ask
            self._sender = self._sender()
        return self._sender

    def is_cancelled(self):
        """Whether the client gave up on this request (a request built for BLS never is)."""
        return self._origin is not None and self._origin.cancelled

    def set_release_flags(self, flags):
        self._release_flags = flags
        runtime.release_flags_set = True

    def trace(self):
        return self._trace

    def exec(self, decoupled=False):
        """Run this request on ``model_name`` and return its response (BLS)."""
        return _bls_client().execute(self, decoupled)

    def async_exec(self, decoupled=False):
        """The awaitable form of exec(), for ``async def execute``."""
        return _bls_client().execute_async(self, decoupled)


def _bls_client():
    client = runtime.bls
    if client is None or not runtime.bls_open:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    return client


class LogLevel(enum.IntEnum):   # int() works on it, as on Triton's
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    LogLevel = LogLevel
    INFO = LogLevel.INFO   # as Triton's bindings export the levels onto Logger
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE
    _log = logging.getLogger("model")
    _LEVELS = {INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR, VERBOSE: logging.DEBUG}

    @classmethod
    def log(cls, message, level=_NOT_GIVEN):
        text = as_text(message)
        if not isinstance(text, str) or not isinstance(level, LogLevel) and level is not _NOT_GIVEN:
            given = (message,) if level is _NOT_GIVEN else (message, level)   # pybind11 lists what was passed
            raise incompatible_arguments("log", "(message: str, level: c_python_backend_utils.Logger.LogLevel = "
                                         "<LogLevel.INFO: 0>) -> None", *given)
        cls._log.log(cls._LEVELS[cls.INFO if level is _NOT_GIVEN else level], "%s", text)

    @classmethod
    def log_info(cls, message):
        cls._log_at("log_info", message, cls.INFO)

    @classmethod
    def log_warn(cls, message):
        cls._log_at("log_warn", message, cls.WARNING)

    @classmethod
    def log_error(cls, message):
        cls._log_at("log_error", message, cls.ERROR)

    @classmethod
    def log_verbose(cls, message):
        cls._log_at("log_verbose", message, cls.VERBOSE)

    @classmethod
    def _log_at(cls, function: str, message, level) -> None:
        text = as_text(message)
        if not isinstance(text, str):
            raise incompatible_arguments(function, "(message: str) -> None", message)
        cls._log.log(cls._LEVELS[level], "%s", text)
