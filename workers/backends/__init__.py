"""Backends by name; each is imported only by the instance processes that use it."""

from __future__ import annotations

import importlib

from workers.backends.base import Backend

_BUILTIN = {
    "onnxruntime": ("workers.backends.onnxruntime", "OnnxRuntimeBackend"),
    "python": ("workers.backends.python_backend", "PythonBackend"),
    "pytorch": ("workers.backends.pytorch", "PyTorchBackend"),
}


def load_backend(name: str) -> Backend:
    if name not in _BUILTIN:
        raise LookupError(f"backend '{name}' is not available in this tritium installation "
                          f"(built in: {', '.join(sorted(_BUILTIN))})")
    module_name, class_name = _BUILTIN[name]
    return getattr(importlib.import_module(module_name), class_name)()
