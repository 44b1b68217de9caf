"""Settings for the server commands from a YAML file and ``TRITIUM_*`` environment variables.

Nothing here lists settings: every key is read off the click command's own options when it
runs, so a flag added to ``serve``, ``broker``, ``gateway`` or ``worker`` is settable from a
file and from the environment with no change here. The key of an option is its long flag
without the dashes (``--http-port`` -> ``http-port``, its other long names too); its variable is
``TRITIUM_`` and the key in capitals with ``_`` for ``-`` (``TRITIUM_HTTP_PORT``).

Precedence: command-line flag > environment > file > built-in default. The file and the
environment become the click context's ``default_map``, which click already ranks below the
command line; which of the two a value came from is kept beside it for ``tritium config show``.
"""

from __future__ import annotations

import copy
import difflib
import os
from dataclasses import dataclass
from typing import Any, Mapping

import click
import orjson
from click.core import ParameterSource

from tritium.triton_flags import TritonBool

ENV_PREFIX = "TRITIUM_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# Keys a file or the environment may also use, when the command has the target and no key of
# that name of its own: Triton users write the models to load as a list of models.
KEY_ALIASES = {"models": "load-model"}
_RESOLVED = "tritium.config_file.resolved"  # ctx.meta key


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a setting's value came from: flag, env (a variable), file (a path) or default."""

    source: str
    where: str | None = None

    def __str__(self) -> str:
        return f"{self.source} {self.where}" if self.where else self.source


@dataclass(frozen=True, slots=True)
class Resolved:
    """What the file and the environment set, by click parameter name."""

    config_path: str | None
    values: Mapping[str, Any]
    origins: Mapping[str, Origin]


class SettingsCommand(click.Command):
    """A click command whose options may also come from ``--config FILE`` and ``TRITIUM_*``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params.insert(0, click.Option(
            ["--config"], metavar="FILE", is_eager=True, expose_value=False, callback=_load,
            help=f"YAML file of settings named as the flags; {ENV_PREFIX}<KEY> variables and flags "
                 f"override it (default: ${CONFIG_ENV})."))

    def relaxed(self) -> SettingsCommand:
        """A copy that takes missing required settings as unset, to show what is set."""
        clone = copy.copy(self)
        clone.params = [copy.copy(param) for param in self.params]
        for param in clone.params:
            param.required = False
        return clone


def keys_of(command: click.Command) -> dict[str, click.Option]:
    """Every key the command takes, each with its option (aliases included)."""
    keys: dict[str, click.Option] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.expose_value:
            for name in _long_names(param):
                keys.setdefault(name, param)
    for alias, target in KEY_ALIASES.items():
        if alias not in keys and target in keys:
            keys[alias] = keys[target]
    return keys


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace("-", "_")


def variables(command: click.Command) -> frozenset[str]:
    """The environment variables this command reads settings from."""
    return frozenset([CONFIG_ENV, *(env_name(key) for key in keys_of(command))])


def resolve(ctx: click.Context, config_path: str | None, environ: Mapping[str, str]) -> Resolved:
    keys = keys_of(ctx.command)
    found: dict[str, tuple[Any, Origin]] = {}
    if config_path:
        found.update(_from_file(ctx, keys, config_path))
    found.update(_from_env(ctx, keys, environ))
    return Resolved(config_path, {name: value for name, (value, _) in found.items()},
                    {name: origin for name, (_, origin) in found.items()})


def _load(ctx: click.Context, _param: click.Parameter, config_path: str | None) -> str | None:
    # Runs before every other option (eager), so they find the file's and environment's
    # values in default_map when click resolves them.
    config_path = config_path or os.environ.get(CONFIG_ENV) or None
    resolved = resolve(ctx, config_path, os.environ)
    ctx.default_map = {**(ctx.default_map or {}), **resolved.values}
    ctx.meta[_RESOLVED] = resolved
    return config_path


def _long_names(option: click.Option) -> list[str]:
    names = [opt[2:] for opt in option.opts if opt.startswith("--")]
    return names or [option.name.replace("_", "-")]


def _from_file(ctx: click.Context, keys: dict[str, click.Option], path: str) -> dict[str, tuple[Any, Origin]]:
    document = _read_yaml(path)
    found: dict[str, tuple[Any, Origin]] = {}
    named_by: dict[str, str] = {}
    for key, value in document.items():
        option = keys.get(key) if isinstance(key, str) else None
        if option is None:
            raise click.UsageError(f"{path}: unknown key '{key}'{_suggestion(str(key), keys)}")
        if value is None:
            continue  # "key:" with nothing after it leaves the default
        first = named_by.setdefault(option.name, key)
        if first != key:
            raise click.UsageError(f"{path}: keys '{first}' and '{key}' set the same setting; keep one")
        found[option.name] = (_convert(ctx, option, value, f"{path}: key '{key}'"), Origin("file", path))
    return found


def _read_yaml(path: str) -> dict:
    import yaml  # only when a file is given: the parts start without it

    try:
        with open(path, encoding="utf-8") as file:
            document = yaml.safe_load(file)
    except OSError as error:
        raise click.UsageError(f"{path}: cannot read the config file: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise click.UsageError(f"{path}: not valid YAML: {error}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise click.UsageError(f"{path}: a config file is a mapping of keys to values, "
                               f"not a {_kind(document)}")
    return document


def _from_env(ctx: click.Context, keys: dict[str, click.Option],
              environ: Mapping[str, str]) -> dict[str, tuple[Any, Origin]]:
    found: dict[str, tuple[Any, Origin]] = {}
    named_by: dict[str, str] = {}
    for key, option in keys.items():
        variable = env_name(key)
        text = environ.get(variable)
        if not text:
            continue  # an empty variable is unset, as click takes it
        first = named_by.setdefault(option.name, variable)
        if first != variable:
            raise click.UsageError(f"{first} and {variable} set the same setting; keep one")
        value = [item.strip() for item in text.split(",") if item.strip()] if _many(option) else text
        found[option.name] = (_convert(ctx, option, value, f"environment variable {variable}"),
                              Origin("env", variable))
    return found


def _convert(ctx: click.Context, option: click.Option, value: Any, where: str) -> Any:
    """The value as click would take it from the command line, or a usage error naming ``where``."""
    if isinstance(value, dict):
        raise click.UsageError(f"{where}: expected {_type_name(option)}, not a mapping")
    if isinstance(value, list) and not _many(option):
        raise click.UsageError(f"{where}: takes one value, not a list")
    items = value if isinstance(value, list) else [value]
    items = [_scalar(option, item, where) for item in items]
    try:
        return option.type_cast_value(ctx, tuple(items) if _many(option) else items[0])
    except click.BadParameter as error:
        raise click.UsageError(f"{where}: {error.message}") from None


def _scalar(option: click.Option, item: Any, where: str) -> Any:
    if isinstance(item, (dict, list)):
        raise click.UsageError(f"{where}: each item of the list is one value, not a {_kind(item)}")
    if isinstance(item, bool) and not isinstance(option.type, click.types.BoolParamType):
        # Options such as --allow-grpc take the strings true/false on the command line.
        if isinstance(option.type, (click.types.StringParamType, TritonBool)):
            return "true" if item else "false"
        raise click.UsageError(f"{where}: expected {_type_name(option)}, not a boolean")
    if isinstance(item, float) and isinstance(option.type, click.types.IntParamType):
        raise click.UsageError(f"{where}: expected an integer, not {item}")  # int() would cut it
    return item


def _many(option: click.Option) -> bool:
    return option.multiple or option.nargs != 1


def _type_name(option: click.Option) -> str:
    return "a list" if _many(option) else f"a single {option.type.name} value"


_KIND_NAMES: dict[type, str] = {dict: "mapping", list: "list"}


def _kind(value: Any) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _suggestion(key: str, keys: dict[str, click.Option]) -> str:
    close = difflib.get_close_matches(key, keys, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# -- tritium config show --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shown:
    key: str
    value: Any
    origin: Origin
    required: bool


def effective(parent: click.Context, command: SettingsCommand, role: str,
              args: list[str]) -> tuple[str | None, list[Shown]]:
    """The settings ROLE would run with, given ``args``, and where each came from."""
    relaxed = command.relaxed()
    # Named under the group, so that a usage error reads "tritium config show ROLE [OPTIONS]".
    with relaxed.make_context(f"{parent.info_name} {role}", list(args), parent=parent.parent) as ctx:
        resolved: Resolved = ctx.meta[_RESOLVED]
        rows = []
        for param, original in zip(relaxed.params, command.params):
            if isinstance(param, click.Option) and param.expose_value:
                rows.append(Shown(_long_names(param)[0], ctx.params[param.name],
                                  _origin(ctx, param, resolved), original.required))
        return resolved.config_path, rows


def _origin(ctx: click.Context, param: click.Option, resolved: Resolved) -> Origin:
    source = ctx.get_parameter_source(param.name)
    if source == ParameterSource.COMMANDLINE:
        return Origin("flag")
    if source == ParameterSource.DEFAULT_MAP:
        return resolved.origins[param.name]
    if source == ParameterSource.ENVIRONMENT:  # click's own envvar=, should an option declare one
        return Origin("env", param.envvar if isinstance(param.envvar, str) else None)
    return Origin("default")


def render_table(role: str, config_path: str | None, rows: list[Shown]) -> str:
    head = f"tritium {role} settings (config file: {config_path or 'none'})"
    width = max(len(row.key) for row in rows) + 2
    shown = [(row.key, _display(row)) for row in rows]
    value_width = min(48, max(len(value) for _, value in shown) + 2)
    lines = [f"{key:<{width}}{value:<{value_width}}{row.origin}" for (key, value), row in zip(shown, rows)]
    return "\n".join([head, *lines])


def render_json(role: str, config_path: str | None, rows: list[Shown]) -> str:
    settings = {row.key: {"value": row.value, "source": row.origin.source, "from": row.origin.where}
                for row in rows}
    document = {"role": role, "config": config_path, "settings": settings}
    return orjson.dumps(document, option=orjson.OPT_INDENT_2, default=str).decode()


def _display(row: Shown) -> str:
    if row.value is None or row.value == ():
        return "(required, not set)" if row.required else "(not set)"
    if isinstance(row.value, tuple):
        return "[" + ", ".join(str(item) for item in row.value) + "]"
    return str(row.value).lower() if isinstance(row.value, bool) else str(row.value)
