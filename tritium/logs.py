"""Logging for every tritium process: one line per event, with the process role and pid.

Lines go to standard error, or with ``--log-file`` appended to that file, each process
opening it for itself (one ``write`` per line, so lines of different processes do not mix).

``LogSettings`` are Triton's logging extension settings. The broker owns them and sends
them to every gateway, agent and instance when they change (``Kind.LOG_SETTINGS``), so
that ``POST /v2/logging`` changes what every process logs.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, replace

from tritium.errors import InvalidArgument, Unsupported

_FORMATS = {
    "default": "%(asctime)s.%(msecs)03d %(levelname).1s {role}[%(process)d] %(name)s: %(message)s",
    "ISO8601": "%(asctime)sZ %(levelname).1s {role}[%(process)d] %(name)s: %(message)s",
}
_DATE_FORMATS = {"default": "%Y-%m-%dT%H:%M:%S", "ISO8601": "%Y-%m-%dT%H:%M:%S"}

_role = "tritium"
_handler: logging.Handler | None = None


@dataclass(frozen=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict:
        return asdict(self)

    def updated(self, changes: dict) -> "LogSettings":
        """These settings with a client's changes (Triton's keys; unknown keys and nulls are ignored)."""
        values: dict = {}
        for key in _FIELDS:   # in Triton's order, whatever the order they came in
            value = changes.get(key)
            if value is None:
                continue
            if key == "log_file":
                raise Unsupported("log file location can not be updated through network protocol")
            if key == "log_verbose_level":
                # unsigned 32 bits: gRPC's LogSettings carries it as uint32 (Triton wraps larger values)
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
                    raise InvalidArgument("log_verbose_level must be an unsigned integer")
            elif key == "log_format":
                if not isinstance(value, str):
                    raise InvalidArgument("log_format must be a string")
                if value not in _FORMATS:
                    raise InvalidArgument(f"invalid argument for --log_format, got: {value}")
            elif not isinstance(value, bool):
                raise InvalidArgument(f"{key} must be a boolean")
            values[key] = value
        return replace(self, **values)


# Triton's order of reading them (its first refusal is the one answered): not the dataclass's by chance.
_FIELDS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
assert set(_FIELDS) == set(LogSettings.__dataclass_fields__)
# Libraries whose debug lines are theirs, not the server's: hpack writes one per HTTP/2 header.
_QUIET_LIBRARIES = ("hpack",)


def known_changes(changes: dict) -> dict:
    """A client's changes as every process takes them: Triton's keys, checked (a client's mistake is
    raised here); the other keys and nulls are left out, as Triton ignores them (whatever they hold:
    numbers past 64 bits and NaN too)."""
    LogSettings().updated(changes)
    return {key: value for key, value in changes.items() if key in _FIELDS and value is not None}


class _SettingsFilter(logging.Filter):
    """Lets a record through when its level is turned on."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        if record.levelno >= logging.ERROR:
            return s.log_error
        if record.levelno >= logging.WARNING:
            return s.log_warning
        if record.levelno >= logging.INFO:
            return s.log_info
        return s.log_verbose_level > 0


def configure(role: str, verbose: int = 0, log_file: str | None = None) -> str:
    """Send logs to ``log_file`` (appended to) or stderr, tagged with ``role``; ``verbose`` > 0
    turns on debug lines. Returns the file logged to: "" for stderr, also when ``log_file``
    cannot be opened (as Triton, which then logs to the console; here with a warning saying why)."""
    global _role, _handler
    _role = role
    handler: logging.Handler | None = None
    problem = None
    if log_file:
        try:
            handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
    _handler = handler
    logging.getLogger().handlers[:] = [handler]
    apply(LogSettings(log_verbose_level=verbose))
    if problem is not None:
        logging.getLogger(__name__).warning("cannot write the log file %s (%s): logging to standard error",
                                            log_file, problem)
        return ""
    return log_file or ""


def apply(settings: LogSettings) -> None:
    """Make this process log as ``settings`` say."""
    if _handler is None:
        return
    formatter = logging.Formatter(_FORMATS[settings.log_format].format(role=_role),
                                  datefmt=_DATE_FORMATS[settings.log_format])
    if settings.log_format == "ISO8601":
        formatter.converter = time.gmtime
    _handler.setFormatter(formatter)
    _handler.filters[:] = [_SettingsFilter(settings)]
    logging.getLogger().setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO)


def apply_wire(values: dict) -> None:
    """Apply settings received from the broker."""
    apply(LogSettings(**{k: v for k, v in values.items() if k in _FIELDS}))
