"""``--trace-config [MODE,]KEY=VALUE`` and the deprecated ``--trace-*`` flags, read as
Triton 2.51 reads them: the same keys, the same refusals, worded the same."""

from __future__ import annotations

import dataclasses

from tritium.errors import InvalidArgument
from tritium.tracing.settings import LEVELS, MODES, UINT32_MAX, TraceSettings

_GLOBAL_KEYS = {"level", "rate", "count", "mode"}
_OTEL_NUMBERS = ("bsp_max_export_batch_size", "bsp_schedule_delay", "bsp_max_queue_size")


def _deprecated(flag: str, replacement: str) -> str:
    return (f"Warning: '{flag}' has been deprecated and will be removed in future releases. "
            f"Please use '--trace-config {replacement} instead.")


def settings_from_flags(trace_config=(), trace_file=None, trace_level=(), trace_rate=None, trace_count=None,
                        trace_log_frequency=None, warn=print) -> TraceSettings:
    """The startup settings; InvalidArgument with Triton's words for a value it refuses.
    ``--trace-config`` wins over the deprecated flags, as in Triton."""
    values: dict = {}
    if trace_file is not None:
        warn(_deprecated("--trace-file", "triton,file=<path/to/your/file>"))
        values["file"] = trace_file
    for level in trace_level or ():
        warn(_deprecated("--trace-level", "level=<OFF|TIMESTAMPS|TENSORS>"))
        values["level"] = _merged_level(values.get("level", ()), level)
    for flag, name, given in (("--trace-rate", "rate", trace_rate), ("--trace-count", "count", trace_count),
                              ("--trace-log-frequency", "log_frequency", trace_log_frequency)):
        if given is not None:
            replacement = "triton,log-frequency" if name == "log_frequency" else name
            warn(_deprecated(flag, f"{replacement}=<{name.replace('_', ' ')} value>"))
            values[name] = _integer(flag, str(given), name != "count")
    resource: list[str] = []
    for item in trace_config:
        mode, setting = _split(item)
        key, _, value = setting.partition("=")
        option = f"--trace-config {key}"
        if mode is None and key in _GLOBAL_KEYS:
            if key == "level":
                values["level"] = _merged_level(values.get("level", ()), value)
            elif key == "mode":
                if value not in MODES:
                    raise InvalidArgument(_bad_mode(value))
                values["mode"] = value
            else:
                values[key.replace("-", "_")] = _integer(option, value, key != "count")
        elif mode == "triton" and key == "file":
            values["file"] = value
        elif mode == "triton" and key == "log-frequency":
            values["log_frequency"] = _integer(option, value, True)
        elif mode == "opentelemetry" and key == "url":
            values["url"] = value
        elif mode == "opentelemetry" and key == "resource":
            resource.append(value)
        elif mode == "opentelemetry" and key in _OTEL_NUMBERS:
            values[key] = _integer(option, value, True)
        # any other key is ignored, as Triton ignores it
    if resource:
        values["resource"] = tuple(resource)
    return dataclasses.replace(TraceSettings(), **values)


def _split(item: str) -> tuple[str | None, str]:
    head, comma, rest = item.partition(",")
    if comma and "=" not in head:
        if head not in MODES:
            raise InvalidArgument(_bad_mode(head))
        return head, rest
    if "=" not in item:
        raise InvalidArgument(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {item}")
    return None, item


def _bad_mode(value: str) -> str:
    return f'invalid value for trace mode option: {value}. Available options are "triton" and "opentelemetry"'


def _merged_level(level: tuple[str, ...], value: str) -> tuple[str, ...]:
    named = value.strip().upper()
    if named == "OFF":
        return ()
    if named not in LEVELS:
        raise InvalidArgument(f"invalid value for trace level option: {value.strip().lower()}")
    return tuple(name for name in LEVELS if name in level or name == named)


def _integer(option: str, text: str, unsigned: bool) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f'Bad option: "{option}".\nInvalid option value. Got {text}') from None
    if unsigned and value > UINT32_MAX:
        raise InvalidArgument(f'Bad option: "{option}".\nProvided option value is out of bound. Got {text}')
    return value & UINT32_MAX if unsigned else value
