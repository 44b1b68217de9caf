"""The gateway's cached view of the broker's models: states, metadata and what to validate.

The broker pushes the table (MODELS) whenever it changes; each gateway keeps it and
answers metadata, config and readiness from it without a round trip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from tritium import datatypes
from tritium.datatypes import DataType
from tritium.errors import InvalidArgument, NotFound, ProtocolError, Unavailable
from tritium.input_checks import DeclaredInput, runs_without_inputs
from tritium.protocol import Models

READY = "READY"
_LEADING_INTEGER = re.compile(r"\s*([+-]?[0-9]+)")


def server_not_ready() -> Unavailable:
    """Triton's answer to the model calls of a server that could not start."""
    return Unavailable("Server not ready")


def parse_version(text: str) -> int:
    """A model version as Triton reads one (``std::stol``: its leading integer, so "1.0" is 1,
    within int64), refusing what it refuses, with its texts."""
    match = _LEADING_INTEGER.match(text)
    if match is None or not -(2**63) <= int(match.group(1)) < 2**63:
        raise InvalidArgument(f"failed to get model version from specified version string '{text}' "
                              "(details: stol), version should be an integral value > 0")
    number = int(match.group(1))
    if number < 0:
        raise InvalidArgument(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return number


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: DataType
    dims: tuple[int, ...]
    optional: bool = False
    fixed_elements: int | None = None   # product of dims when no dim is variable


@dataclass(frozen=True)
class ModelSpec:
    """One model (all versions share the config) as the gateway validates requests for it."""

    name: str
    platform: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    decoupled: bool
    config_json: bytes
    labels: dict[str, tuple[str, ...]]   # classification labels per output
    declared_inputs: dict[str, DeclaredInput] = field(default_factory=dict, compare=False, repr=False)
    # inputs found valid: (name, datatype, shape, size) of each -> the batch size (gateway/validation.py)
    valid_inputs: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)
    runs_without_inputs: bool = False   # (tritium/input_checks.py)

    @classmethod
    def from_config(cls, config: dict, labels: dict | None = None) -> "ModelSpec":
        inputs = {t["name"]: _tensor(t) for t in config.get("input", [])}
        sequence = config.get("sequence_batching") or {}
        return cls(
            name=config["name"],
            platform=config.get("platform") or config.get("backend", ""),
            max_batch_size=int(config.get("max_batch_size", 0)),
            inputs=inputs,
            declared_inputs={name: DeclaredInput(t.datatype.name, t.dims, t.optional) for name, t in inputs.items()},
            outputs={t["name"]: _tensor(t) for t in config.get("output", [])},
            decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
            config_json=orjson.dumps(config),
            labels={name: tuple(lines) for name, lines in (labels or {}).items()},
            runs_without_inputs=runs_without_inputs(config.get("platform", ""), len(sequence.get("control_input", [])),
                                                    len(sequence.get("state", []))),
        )

    @property
    def required_inputs(self) -> list[str]:
        return [name for name, spec in self.inputs.items() if not spec.optional]

    def metadata_shape(self, tensor: TensorSpec) -> list[int]:
        return ([-1] if self.max_batch_size > 0 else []) + list(tensor.dims)


def _tensor(entry: dict) -> TensorSpec:
    datatype = datatypes.from_config_name(entry.get("data_type", "TYPE_INVALID"))
    if datatype is None:   # the broker sends only configs that loaded, whose types are known
        raise ProtocolError(f"the model table's tensor '{entry['name']}' has no known data type "
                            f"({entry.get('data_type')!r})")
    dims = tuple(int(d) for d in entry.get("dims", []))
    fixed = None
    if -1 not in dims:
        fixed = 1
        for d in dims:
            fixed *= d
    return TensorSpec(entry["name"], datatype, dims, bool(entry.get("optional", False)), fixed)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    spec: ModelSpec | None
    error: str | None
    versions: dict[int, tuple[str, str]]   # version -> (state, reason)
    ready_versions: tuple[int, ...] = ()   # ascending
    unhealthy: frozenset[int] = frozenset()  # READY versions whose model's is_ready() says no

    @classmethod
    def of(cls, name: str, spec: ModelSpec | None, error: str | None,
           versions: dict[int, tuple[str, str, bool]]) -> "ModelEntry":
        ready = tuple(sorted(v for v, (state, _, _) in versions.items() if state == READY))
        unhealthy = frozenset(v for v, (state, _, healthy) in versions.items() if state == READY and not healthy)
        return cls(name, spec, error, {v: (state, reason) for v, (state, reason, _) in versions.items()},
                   ready, unhealthy)


class ModelTable:
    def __init__(self) -> None:
        self.generation = -1
        self.models: dict[str, ModelEntry] = {}
        self.server_ready = False
        self.started = False   # the broker's startup loads have settled
        self.received = False
        self.failed: str | None = None   # the server could not start: no model call is served

    def update(self, table: Models) -> None:
        models = {}
        for row in table.models:
            spec, error = None, row.error
            try:
                spec = ModelSpec.from_config(row.config, row.labels) if row.config else None
            except ProtocolError as exc:   # one unreadable config costs its model, not the whole table
                error = str(exc)
            models[row.name] = ModelEntry.of(row.name, spec, error,
                                             {v.version: (v.state, v.reason, v.healthy) for v in row.versions})
        self.models = models
        self.generation = table.generation
        self.server_ready = bool(table.ready)
        self.started = self.started or bool(table.started)   # a new broker taking over loads again: still started
        self.failed = table.failed
        self.received = True

    def get(self, name: str) -> ModelEntry:
        if self.failed is not None:
            raise server_not_ready()
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def resolve(self, name: str, version: str | None) -> tuple[ModelSpec, int]:
        """The spec and concrete version a request for ``name``/``version`` goes to, or Triton's
        refusal, in its order: a version that is no number, 400 (InvalidArgument), before the model
        is looked for; an unknown model or version, 404 (NotFound); a version named that is known but
        not ready, 503 (Unavailable); no version ready while one loads, 400 "Model version not
        ready"; none ready otherwise, 404.
        """
        number = parse_version(version) if version else None
        entry = self.get(name)
        if number is not None:
            if number not in entry.versions:
                raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
            if entry.versions[number][0] != READY or entry.spec is None:
                # Triton remembers a version it no longer (or not yet) serves: 503, not 400.
                raise Unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
            return entry.spec, number
        ready = entry.ready_versions
        if not ready or entry.spec is None:
            if any(state == "LOADING" for state, _ in entry.versions.values()):
                raise InvalidArgument("Model version not ready")
            raise NotFound(f"Request for unknown model: '{name}' has no available versions")
        return entry.spec, ready[-1]
