"""Builders of small model repositories for the repo/ tests: config text, ONNX files, model.py."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from examples import models as example_models
from tritium.repo import ModelLoadError, RepositoryOptions
from tritium.repo.loader import load_model

FileContent = str | bytes | Callable[[Path], object]


def write_model(root: Path, name: str, config: str | None = None,
                files: Mapping[str, FileContent] | None = None) -> Path:
    """``root/name`` with ``config.pbtxt`` (dedented) and ``files``: relative path -> content.

    A callable content is called with the target path and must create the file itself
    (the ONNX builders below do).
    """
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    for relative, content in (files or {}).items():
        target = model_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(textwrap.dedent(content))
    return model_dir


def onnx_io(inputs: Sequence[tuple[str, int, Sequence]], outputs: Sequence[tuple[str, int, Sequence]]):
    """A builder of an ONNX file with these (name, elem_type, shape) inputs and outputs.

    Shapes use -1 (or a string) for symbolic dims. Output i is Identity(input 0): the
    repository only reads the signature, so the graph just has to be well formed.
    """
    def build(path: Path) -> Path:
        def value(name, elem, shape):
            dims = [f"{name}_d{i}" if d == -1 else d for i, d in enumerate(shape)]
            return helper.make_tensor_value_info(name, elem, dims)

        nodes = [helper.make_node("Identity", [inputs[0][0]], [name]) for name, _, _ in outputs]
        graph = helper.make_graph(nodes, "io", [value(*i) for i in inputs],
                                  [value(*o) for o in outputs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        return path
    return build


def add_sub(dims=(-1, 16), dtype=np.float32):
    """examples.models.add_sub as a file builder."""
    return lambda path: example_models.add_sub(path, dims=dims, dtype=dtype)


def identity(dims=(-1, -1), dtype=np.float32):
    return lambda path: example_models.identity(path, dims=dims, dtype=dtype)


FLOAT, INT64, STRING, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL

PLAIN_PY_MODEL = """
    class TritonPythonModel:
        def execute(self, requests):
            return []
"""


def config_fails_model(message: str) -> str:
    """A Python model whose auto_complete_config raises ``ValueError(message)``."""
    return f"""
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            raise ValueError("{message}")
"""


def options(**kwargs) -> RepositoryOptions:
    return RepositoryOptions(**kwargs)


def load(root: Path, name: str, **kwargs):
    """Load ``root/name`` with RepositoryOptions(**kwargs); return the ModelDefinition."""
    return load_model(name, root / name, RepositoryOptions(**kwargs))


def load_error(root: Path, name: str, **kwargs) -> str:
    """The message of the ModelLoadError that loading ``root/name`` raises."""
    with pytest.raises(ModelLoadError) as info:
        load(root, name, **kwargs)
    message = info.value.message
    assert "\n" not in message, f"error messages are one line: {message!r}"
    return message


def version_error(root: Path, name: str, **kwargs) -> str:
    """The reason every selected version of ``root/name`` fails with: the model's own code failed
    while it loads (Triton lists the model, its versions UNAVAILABLE with the reason)."""
    reasons = {info.error for info in load(root, name, **kwargs).versions}
    assert len(reasons) == 1 and None not in reasons, reasons
    return reasons.pop()


def minimal_io(max_batch_size: int = 0, dims: str = "[ 4 ]", data_type: str = "TYPE_FP32") -> str:
    """Config text listing one input and one output, for models that need them."""
    return f"""
    max_batch_size: {max_batch_size}
    input [ {{ name: "INPUT0" data_type: {data_type} dims: {dims} }} ]
    output [ {{ name: "OUTPUT0" data_type: {data_type} dims: {dims} }} ]
    """
