"""The backend interface every backend implements, built-in or custom.

It has the lifecycle of Triton's backend API: a ``Backend`` once per process
(``initialize``, ``finalize``), a ``Model`` once per model (``create_model`` is its
initialize, then ``finalize``), an ``Instance`` per model instance, one per process here
(``create_instance`` is its initialize, then ``execute`` or ``execute_batch``, and
``finalize``).
An instance implements one of two ways to execute:

* ``execute(requests) -> responses``: it gets the separate requests of a batch, as
  Triton's Python backend does (used for models that handle requests themselves);
* ``execute_batch(inputs, output_names) -> outputs``: it gets every input stacked along
  the batch dimension and returns stacked outputs; tritium stacks and splits around it
  (what Triton's onnxruntime and PyTorch backends do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import msgspec
import numpy as np

from tritium.repo import ModelConfig
from tritium.errors import TritiumError
from tritium.security import CurveKeys


@dataclass(frozen=True)
class BackendConfig:
    """What a backend is given once per process (Triton's TRITONBACKEND_Initialize)."""

    name: str
    backend_directory: Path | None = None
    options: dict[str, str] = field(default_factory=dict)   # from --backend-config=NAME,KEY=VALUE


@dataclass(frozen=True)
class ModelContext:
    name: str
    version: int
    model_dir: Path          # <repository>/<model>
    config: ModelConfig      # completed and resolved for this host
    config_json: dict        # the same, in Triton's JSON form

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)

    @property
    def parameters(self) -> dict[str, str]:
        return {key: value.string_value for key, value in self.config.parameters.items()}


@dataclass(frozen=True)
class InstanceContext:
    model: ModelContext
    name: str                # Triton's instance name, e.g. "densenet_onnx_0"
    kind: str                # "CPU", "GPU" or "MODEL"
    device_id: int           # the host's GPU id for GPU instances, 0 otherwise
    broker: str = ""         # the broker's backend endpoint, for models that call models (BLS)
    instance_id: str = ""    # this instance's identity at the broker
    curve: CurveKeys | None = None   # the keys for a BLS socket to a CURVE broker


# A custom backend's (tritium.backend): it may keep attributes of its own on a request or response,
# and weak references to them, as it could when they were dataclasses.
class InferenceRequest(msgspec.Struct, dict=True, weakref=True):
    request_id: str
    inputs: dict[str, np.ndarray]
    requested_outputs: list[str] | None   # None: every output of the model
    parameters: dict
    batch_size: int
    correlation_id: int | str = 0
    flags: int = 0                        # sequence START (1) / END (2), as Triton's request flags
    timeout_us: int = 0                   # the request's `timeout` parameter (0: none), as Triton's request.timeout()
    # send(response or None, final) answers this request: a decoupled model's 0..N times, any other's
    # once (a model may answer so instead of returning the response).
    response_sender: Callable[[Optional["InferenceResponse"], bool], None] | None = None
    trace: object = None                  # traced: a CallTrace (tritium/tracing/stamps.py), request.trace() in Python models
    cancelled: bool = False               # its client gave up on it (request.is_cancelled() in Python models)


class Rescheduled:
    """What ``execute`` gives in the place of a request its model released to run again (a
    Python model's request rescheduling): no response; the request comes back in a later batch."""


RESCHEDULED = Rescheduled()


class InferenceResponse(msgspec.Struct, dict=True, weakref=True):
    outputs: dict[str, np.ndarray] = msgspec.field(default_factory=dict)
    error: TritiumError | None = None
    parameters: dict = msgspec.field(default_factory=dict)


class Instance:
    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse | Rescheduled | None]:
        """One entry per request: its response, None where the model answers it through its
        ``response_sender``, or RESCHEDULED where it runs again in a later batch."""
        raise NotImplementedError

    def execute_batch(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    @property
    def stacks_batches(self) -> bool:
        """True when this instance implements ``execute_batch``."""
        return type(self).execute_batch is not Instance.execute_batch

    def is_ready(self) -> bool:
        """Whether the instance can serve (Triton's Python ``is_ready``); asked now and then."""
        return True

    def finalize(self) -> None:
        pass


class Model:
    """Once per model in the process: what instances share (Triton's ModelState)."""

    def create_instance(self, context: InstanceContext) -> Instance:
        raise NotImplementedError

    def finalize(self) -> None:
        pass


class Backend:
    """Once per process: the runtime (Triton's backend); creates the model's ``Model``."""

    name = "base"

    def initialize(self, config: BackendConfig) -> None:
        self.config = config

    def create_model(self, context: ModelContext) -> Model:
        raise NotImplementedError

    def finalize(self) -> None:
        pass
