"""The public API for custom backends: what a ``tritium_<name>.py`` module or a
``<backend-directory>/<name>/`` package imports to define ``TritiumBackend``.

See docs/backends.md for the lifecycle and an example.
"""

from tritium.workers.backends.base import (
    Backend,
    BackendConfig,
    InferenceRequest,
    InferenceResponse,
    Instance,
    InstanceContext,
    Model,
    ModelContext,
)

__all__ = ["Backend", "BackendConfig", "InferenceRequest", "InferenceResponse", "Instance", "InstanceContext",
           "Model", "ModelContext"]
