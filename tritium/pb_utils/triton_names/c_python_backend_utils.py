"""tritium's ``c_python_backend_utils``: the module Triton's Python backend binds in C++, which
some models import directly (``import c_python_backend_utils as c_utils``). It holds the same
classes as ``triton_python_backend_utils``, and ``shared_memory``, the memory the instance shares
with the server."""

from __future__ import annotations

import shutil

from tritium.pb_utils.metrics import Metric, MetricFamily, MetricKind  # noqa: F401
from tritium.pb_utils.model_control import is_model_ready, load_model, unload_model  # noqa: F401
from tritium.pb_utils.types import (  # noqa: F401
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Logger,
    PreferredMemory,
    Tensor,
    TritonError,
    TritonModelException,
)

# What triton_python_backend_utils takes from here (shared_memory stays here, as in Triton).
__all__ = ["Metric", "MetricFamily", "MetricKind", "is_model_ready", "load_model", "unload_model",
           "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU", "InferenceRequest", "InferenceResponse",
           "InferenceResponseSender", "Logger", "PreferredMemory", "Tensor", "TritonError", "TritonModelException"]

_SHARED_MEMORY = "/dev/shm"


class SharedMemory:
    """Triton's stub has a pool of its own per instance; tritium's instances share tensors through
    the host's shared memory, so that is what ``free_memory`` reports."""

    def free_memory(self) -> int:
        """Bytes of shared memory free."""
        try:
            return shutil.disk_usage(_SHARED_MEMORY).free
        except OSError:
            return 0


shared_memory = SharedMemory()
