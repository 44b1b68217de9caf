"""Importing a Python model's file as Triton's stub imports it.

The caller has put the file's folders on ``sys.path`` (the version folder and the model's
folder; a Python-based backend's own folder).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


class NotAPythonFile(Exception):
    """A model file whose name does not end with ``.py``, which Triton's stub refuses (its words)."""


def import_model_file(model_file: Path, python_based: bool) -> ModuleType:
    """``python_based``: ``model_file`` is a Python-based backend's model.py, imported as
    "model" (what its classes pickle as), from its path (the instance's working folder may hold
    another "model"); a model's own file (``*.py``), model.py or its ``default_model_filename``, is
    "<version>.<name>", as Triton's stub imports it (an import error then shows the import
    machinery's frames, as Triton's does, and a dot in the name fails as it does in Triton)."""
    if not python_based:
        if model_file.suffix != ".py":
            raise NotAPythonFile(f"Model name must end with '.py'. Model name is \"{model_file.name}\".")
        return importlib.import_module(f"{model_file.parent.name}.{model_file.stem}")
    module = _from_path("model", model_file)
    sys.modules["model"] = module
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _from_path(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    return importlib.util.module_from_spec(spec)
