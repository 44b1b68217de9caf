"""Triton's trace settings: what ``--trace-config`` starts with, what the trace extension
(HTTP ``/v2[/models/M]/trace/setting``, gRPC ``TraceSetting``) reads and changes.

Values are checked and worded as Triton 2.51 checks and words them. Triton answers with
every value as a string (``trace_level`` a list of strings); :func:`as_triton` writes that.
The broker keeps the one copy every gateway samples with (:class:`TraceSettingsStore`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tritium.errors import InvalidArgument, Unsupported

MODES = ("triton", "opentelemetry")
LEVELS = ("TIMESTAMPS", "TENSORS")      # in the order Triton lists them
UINT32_MAX = 4294967295
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
DEFAULT_OTEL_URL = "localhost:4318/v1/traces"
FILE_NOT_SETTABLE = "trace file location can not be updated through network protocol"
OTEL_MISSING = ("--trace-config mode=opentelemetry needs the OpenTelemetry SDK and its OTLP/HTTP exporter: "
                "pip install 'tritium[otel]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)")


@dataclass(frozen=True, slots=True)
class TraceSettings:
    level: tuple[str, ...] = ()          # empty: OFF
    rate: int = 1000                     # trace every rate-th request
    count: int = -1                      # traces left to take; -1: no limit
    log_frequency: int = 0               # traces per file (0: one file, written at the end)
    file: str = ""
    mode: str = "triton"
    url: str = ""                        # OpenTelemetry: the OTLP/HTTP endpoint ("": the default)
    resource: tuple[str, ...] = ()       # OpenTelemetry: resource attributes, KEY=VALUE
    bsp_max_export_batch_size: int = 512
    bsp_schedule_delay: int = 5000
    bsp_max_queue_size: int = 2048

    @property
    def on(self) -> bool:
        return bool(self.level) and self.rate != 0 and self.count != 0

    def as_triton(self) -> dict:
        """The settings as Triton answers them, keys in Triton's order."""
        answer = {"trace_level": list(self.level) or ["OFF"], "trace_rate": str(self.rate),
                  "trace_count": str(self.count)}
        if self.mode == "triton":
            answer.update(log_frequency=str(self.log_frequency), trace_file=self.file, trace_mode="triton")
            return answer
        answer["trace_mode"] = self.mode
        if self.url:
            answer["url"] = self.url
        if self.resource:
            answer["resource"] = ",".join(self.resource)
        answer.update(bsp_max_export_batch_size=str(self.bsp_max_export_batch_size),
                      bsp_schedule_delay=str(self.bsp_schedule_delay),
                      bsp_max_queue_size=str(self.bsp_max_queue_size))
        return answer

    def as_wire(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, values: dict) -> "TraceSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known}
        return cls(**values)


# The extension's keys and the settings fields they change.
# In the order Triton reads them, whatever the order they came in: its first refusal is the one answered.
_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


# -- the extension: what a client asks to change ------------------------------------------------

# {settings field: its new value, or None to clear it}
Changes = dict[str, "tuple[str, ...] | int | None"]


def _check_can_trace(settings: TraceSettings) -> None:
    """Triton takes any settings that leave tracing off, and refuses those that would trace
    nothing or nowhere (its words)."""
    if not settings.level:
        return
    if settings.rate == 0:
        reason = "sample rate must be non-zero"
    elif settings.mode == "triton" and not settings.file:
        reason = "trace file name is not given"
    else:
        return
    raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")


def changes_from_http(document: dict) -> Changes:
    """{field: value, or None to clear} from a POSTed JSON object, checked as Triton checks it."""
    if "trace_file" in document:
        raise Unsupported(FILE_NOT_SETTABLE)
    changes: Changes = {}
    for key, name in _FIELDS.items():   # trace_mode and keys Triton does not know are ignored, as there
        if key not in document:
            continue
        value = document[key]
        if value is None:
            changes[name] = None
        elif key == "trace_level":
            if not isinstance(value, list):
                raise InvalidArgument("attempt to access JSON non-array as array")
            level = _level(value)
            if level is not None:
                changes[name] = level
        else:
            if not isinstance(value, str):
                raise InvalidArgument("attempt to access JSON non-string as string")
            changes[name] = _number(key, value, "got:")
    return changes


def changes_from_grpc(settings: dict[str, list[str]]) -> Changes:
    """The same from gRPC's map of string lists: an empty list clears."""
    if "trace_file" in settings:   # even empty (a clear), as Triton
        raise Unsupported(FILE_NOT_SETTABLE)
    changes: Changes = {}
    for key, name in _FIELDS.items():
        if key not in settings:
            continue
        values = settings[key]
        if not values:
            changes[name] = None
        elif key == "trace_level":
            level = _level(values)
            if level is not None:
                changes[name] = level
        elif len(values) != 1:
            raise InvalidArgument(f"expect only 1 value for '{key}'")
        else:
            changes[name] = _number(key, values[0], "got: ")
    return changes


def _level(values: list) -> tuple[str, ...] | None:
    """The level a list names; None when it names none Triton knows (nothing changes)."""
    if any(not isinstance(value, str) for value in values):
        raise InvalidArgument("attempt to access JSON non-string as string")
    if "OFF" in values:
        if len(values) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ()
    named = [level for level in LEVELS if level in values]
    return tuple(named) if named else None


def _number(key: str, text: str, got: str) -> int:
    """Triton's reading (``std::stoi``): a 32-bit signed integer, the range it names in its
    refusal that of the setting; rate and log frequency wrap into uint32 as a C cast does."""
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {text}") from None
    counted = key == "trace_count"
    if not INT32_MIN <= value <= INT32_MAX:
        low, high = (-1, INT32_MAX) if counted else (0, UINT32_MAX)
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}")
    if counted:
        if value < -1:
            raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= -1, {got}{text}")
        return value
    return value & UINT32_MAX


# -- the shared copy ------------------------------------------------------------------------------

@dataclass
class TraceSettingsStore:
    """The global settings, each model's own, and the traces each may still take.

    A model's settings are the global ones with the keys set for that model on top: a
    global change reaches every key a model did not set, and clearing a model's key (null)
    gives it the global value again. Clearing a global key gives back the startup value.
    """

    startup: TraceSettings
    current: TraceSettings = field(init=False)   # the startup settings until a global change
    models: dict[str, dict] = field(default_factory=dict)
    # Told to gateways with the settings: changed by a client's update and when a count runs
    # out, never by one trace being counted (each gateway counts its own down meanwhile).
    revision: int = 0

    def __post_init__(self) -> None:
        self.current = self.startup

    def effective(self, model: str | None) -> TraceSettings:
        overrides = self.models.get(model) if model else None
        return dataclasses.replace(self.current, **overrides) if overrides else self.current

    def update(self, model: str | None, changes: dict) -> TraceSettings:
        """Apply a client's changes; InvalidArgument, nothing changed, when they would turn
        tracing on in a way Triton refuses."""
        if model is None:
            values = {name: getattr(self.startup, name) if value is None else value
                      for name, value in changes.items()}
            current = dataclasses.replace(self.current, **values)
            _check_can_trace(current)
            self.current = current
        else:
            overrides = dict(self.models.get(model, {}))
            for name, value in changes.items():
                if value is None:
                    overrides.pop(name, None)
                else:
                    overrides[name] = value
            _check_can_trace(dataclasses.replace(self.current, **overrides))
            if overrides:
                self.models[model] = overrides
            else:
                self.models.pop(model, None)
        self.revision += 1
        return self.effective(model)

    def took_one(self, model: str | None) -> bool:
        """One trace of ``model`` was taken: count it; True when that was the last one allowed."""
        overrides = self.models.get(model) if model is not None else None
        if overrides is not None and "count" in overrides:
            if overrides["count"] > 0:
                overrides["count"] -= 1
                return self._ran_out(overrides["count"])
            return False
        if self.current.count > 0:
            self.current = dataclasses.replace(self.current, count=self.current.count - 1)
            return self._ran_out(self.current.count)
        return False

    def _ran_out(self, count: int) -> bool:
        if count == 0:
            self.revision += 1
        return count == 0

    def as_wire(self) -> dict:
        return {"revision": self.revision, "global": self.current.as_wire(),
                "models": {m: self.effective(m).as_wire() for m in self.models}}
