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


def import_model_file(model_file: Path, python_based: bool) -> ModuleType:
    """``python_based``: ``model_file`` is a Python-based backend's model.py, imported as
    "model" (what its classes pickle as); a model's own model.py is "<version>.model"; a file
    of another name (``default_model_filename``) is imported from its path."""
    if python_based:
        module = _from_path("model", model_file)
        sys.modules["model"] = module
    elif model_file.name == "model.py":
        return importlib.import_module(f"{model_file.parent.name}.model")
    else:
        module = _from_path(model_file.stem, model_file)
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _from_path(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    return importlib.util.module_from_spec(spec)
