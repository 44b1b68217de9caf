"""Serving an example as a user would: copy its model repository, run its build script, serve it."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

from tests.servers import PROJECT_ROOT, TritiumServer

EXAMPLES = PROJECT_ROOT / "examples"


def example_module(example: str, script: str) -> ModuleType:
    """examples/<example>/<script>.py, imported from its file as a user would run it."""
    path = EXAMPLES / example / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"example_{example}_{script}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built_repository(example: str, workdir: Path) -> Path:
    """A copy of the example's model repository with its build script's output in it."""
    repository = workdir / "model_repository"
    shutil.copytree(EXAMPLES / example / "model_repository", repository,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if (EXAMPLES / example / "build.py").exists():
        example_module(example, "build").build(repository)
    return repository


def serve_example(example: str, tmp_path_factory, *flags: str) -> TritiumServer:
    return TritiumServer(built_repository(example, tmp_path_factory.mktemp(example)), *flags)
