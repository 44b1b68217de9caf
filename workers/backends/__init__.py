"""Finding a model's backend by name; each is imported only by the instance processes that use it.

``backend: "B"`` is one of the built-in backends (onnxruntime, pytorch, python), or a
custom backend: a Python module ``tritium_B.py`` (or a package ``tritium_B/``) looked
for, in Triton's order, in the model's version folder, the model's folder and
``<--backend-directory>/B/``, and then in the ``tritium.backends`` entry-point group.
The module defines ``TritiumBackend``, a subclass of ``tritium.backend.Backend``;
an entry point may name that class directly. A Python-based backend, as Triton has them
(``<--backend-directory>/B/model.py``, a Python model serving every model that names B), is
looked for after the folders.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from tritium.repo.backends import python_based_backend
from tritium.workers.backends.base import Backend, BackendConfig

ENTRY_POINT_GROUP = "tritium.backends"
_BUILTIN = {
    "onnxruntime": ("tritium.workers.backends.onnxruntime", "OnnxRuntimeBackend"),
    "python": ("tritium.workers.backends.python_backend", "PythonBackend"),
    "pytorch": ("tritium.workers.backends.pytorch", "PyTorchBackend"),
}


class BackendNotFound(LookupError):
    pass


def search_folders(name: str, version_dir: Path, model_dir: Path, backend_directory: Path | None) -> list[Path]:
    folders = [version_dir, model_dir]
    if backend_directory is not None:
        folders.append(backend_directory / name)
    return folders


def load_backend(name: str, version_dir: Path, model_dir: Path, config: BackendConfig) -> Backend:
    """Instantiate and initialize backend ``name`` for this process."""
    backend_class = _builtin(name) or _from_folders(name, version_dir, model_dir, config.backend_directory) \
        or _python_based(name, config.backend_directory) or _from_entry_points(name)
    if backend_class is None:
        searched = search_folders(name, version_dir, model_dir, config.backend_directory)
        python_based = "" if config.backend_directory is None else \
            f", then for a Python-based backend {config.backend_directory / name / 'model.py'}"
        raise BackendNotFound(
            f"backend '{name}' not found: looked for tritium_{name}.py or a package tritium_{name}/ in "
            f"{', '.join(str(f) for f in searched)}{python_based}, then for entry point '{name}' in group "
            f"'{ENTRY_POINT_GROUP}' (built in: {', '.join(sorted(_BUILTIN))})")
    backend = backend_class()
    if not isinstance(backend, Backend):
        raise BackendNotFound(f"backend '{name}': TritiumBackend must subclass workers.backends.base.Backend")
    backend.initialize(config)
    return backend


def _builtin(name: str):
    if name not in _BUILTIN:
        return None
    module_name, class_name = _BUILTIN[name]
    return getattr(importlib.import_module(module_name), class_name)


def _from_folders(name: str, version_dir: Path, model_dir: Path, backend_directory: Path | None):
    for folder in search_folders(name, version_dir, model_dir, backend_directory):
        for candidate in (folder / f"tritium_{name}.py", folder / f"tritium_{name}" / "__init__.py"):
            if candidate.is_file():
                return _backend_class(name, _import_file(f"tritium_{name}", candidate), candidate)
    return None


def _python_based(name: str, backend_directory: Path | None):
    model_file = python_based_backend(name, backend_directory)
    if model_file is None:
        return None
    from tritium.workers.backends.python_backend import PythonBackend

    return functools.partial(PythonBackend, model_file)


def _import_file(module_name: str, path: Path):
    spec = importlib.util.spec_from_file_location(
        module_name, path, submodule_search_locations=[str(path.parent)] if path.name == "__init__.py" else None)
    assert spec is not None and spec.loader is not None   # (a .py file's location always has both)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # the backend's own relative imports need it
    spec.loader.exec_module(module)
    return module


def _from_entry_points(name: str):
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        loaded = entry_point.load()
        if isinstance(loaded, type):
            return loaded
        return _backend_class(name, loaded, entry_point.value)
    return None


def _backend_class(name: str, module, where) -> type:
    backend_class = getattr(module, "TritiumBackend", None)
    if backend_class is None:
        raise BackendNotFound(f"backend '{name}' at {where} defines no class TritiumBackend")
    return backend_class
