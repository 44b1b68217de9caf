"""Triton's ModelConfig protobuf classes, taken from tritonclient's generated module.

``from tritonclient.grpc import model_config_pb2`` first runs the package's ``__init__``,
which imports grpc and the whole gRPC client: about 50 ms of CPU in every process that
only reads configs, every instance among them. Loading the generated module by its own
name skips that; the package, imported later, finds it registered and uses the same
classes (one descriptor pool entry, one set of message types).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import tritonclient

_NAME = "tritonclient.grpc.model_config_pb2"


def _load():
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(_NAME, Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module   # (loaded while this module is imported, under the import lock)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]   # no half-made module for a later import to find
        raise
    return module


if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2
else:
    model_config_pb2 = _load()

__all__ = ["model_config_pb2"]
