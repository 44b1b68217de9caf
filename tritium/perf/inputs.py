"""The tensors a perf run sends: generated from the model's metadata, or read from a JSON file.

The JSON file has perf_analyzer's layout: ``{"data": [STEP, ...]}`` where a STEP maps each
input to a flat list, to ``{"content": [...], "shape": [...]}`` or to ``{"b64": "..."}``.
For sequence models ``data`` may be a list of streams, each a list of STEPs.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritium import datatypes
from tritium.perf.errors import USAGE, PerfError


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: datatypes.DataType
    shape: tuple[int, ...]     # one sample's shape (no batch dimension)


Step = dict[str, np.ndarray]


def input_specs(metadata: dict, batching: bool, shapes: dict[str, list[int]]) -> list[InputSpec]:
    specs = []
    for tensor in metadata["inputs"]:
        dims = [int(d) for d in tensor["shape"]][1 if batching else 0:]
        shape = list(shapes.get(tensor["name"]) or dims)
        specs.append(InputSpec(tensor["name"], _datatype(tensor), tuple(shape)))
    return specs


def _datatype(tensor: dict) -> datatypes.DataType:
    found = datatypes.from_name(tensor["datatype"])
    if found is None:
        raise PerfError(f"input '{tensor['name']}' has datatype '{tensor['datatype']}', which is not a "
                        f"KServe v2 datatype")
    return found


def generated_steps(specs: list[InputSpec], random: bool, string_length: int) -> list[list[Step]]:
    """One stream of one step, random or zero, as perf_analyzer's ``--input-data random|zero``."""
    rng = np.random.default_rng(0)
    step = {}
    for spec in specs:
        if any(d < 0 for d in spec.shape):
            raise PerfError(f"input '{spec.name}' has a variable dimension {list(spec.shape)}; give "
                            f"--shape {spec.name}:d1,d2,... or an --input-data file", USAGE)
        step[spec.name] = _generated(spec, random, string_length, rng)
    return [[step]]


def _generated(spec: InputSpec, random: bool, string_length: int, rng) -> np.ndarray:
    kind = spec.datatype
    count = int(np.prod(spec.shape)) if spec.shape else 1
    if kind.is_bytes:
        text = "x" * string_length if not random else None
        values = [text.encode() if text else bytes(rng.integers(97, 123, string_length, dtype=np.uint8))
                  for _ in range(count)]
        return np.array(values, dtype=np.object_).reshape(spec.shape)
    if kind.numpy is None:   # BF16: raw 16-bit words
        return np.zeros(spec.shape, dtype=np.uint16)
    if not random:
        return np.zeros(spec.shape, dtype=kind.numpy)
    if kind.numpy.kind == "f":
        return rng.standard_normal(count).astype(kind.numpy).reshape(spec.shape)
    if kind.numpy.kind == "b":
        return rng.integers(0, 2, count).astype(np.bool_).reshape(spec.shape)
    return rng.integers(0, 100, count).astype(kind.numpy).reshape(spec.shape)


def file_steps(path: str, specs: list[InputSpec]) -> list[list[Step]]:
    """The streams of a perf_analyzer JSON data file, each value checked against the model."""
    try:
        document = json.loads(Path(path).read_text())
        entries = document["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PerfError(f"--input-data {path}: not a perf_analyzer data file ({exc})", USAGE) from None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f"--input-data {path}: 'data' must be a non-empty list", USAGE)
    streams = entries if isinstance(entries[0], list) else [entries]
    by_name = {spec.name: spec for spec in specs}
    return [[_file_step(path, step, by_name) for step in stream] for stream in streams]


def _file_step(path: str, step: dict, by_name: dict[str, InputSpec]) -> Step:
    missing = [name for name in by_name if name not in step]
    if missing:
        raise PerfError(f"--input-data {path}: a step has no value for input(s) {', '.join(missing)}", USAGE)
    return {name: _file_value(path, by_name[name], step[name]) for name in by_name}


def _file_value(path: str, spec: InputSpec, value) -> np.ndarray:
    kind = spec.datatype
    shape = spec.shape
    if isinstance(value, dict) and "b64" in value:
        raw = base64.b64decode(value["b64"])
        return np.frombuffer(raw, dtype=kind.numpy).reshape(shape) if not kind.is_bytes else \
            np.array([raw], dtype=np.object_)
    if isinstance(value, dict):
        shape = tuple(value.get("shape", shape))
        value = value.get("content", [])
    flat = np.array([v.encode() if isinstance(v, str) else v for v in value],
                    dtype=np.object_ if kind.is_bytes else kind.numpy)
    try:
        return flat.reshape(shape)
    except ValueError:
        raise PerfError(f"--input-data {path}: input '{spec.name}' has {flat.size} values, which do not "
                        f"fill shape {list(shape)}", USAGE) from None


def batched(step: Step, batch_size: int, batching: bool) -> Step:
    """The same sample ``batch_size`` times along a new first dimension (when the model batches)."""
    if not batching:
        return step
    return {name: np.stack([array] * batch_size) for name, array in step.items()}
