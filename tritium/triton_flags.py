"""Triton's command line as ``tritonserver`` users write it.

Three things carry a Triton launch script over unchanged: booleans written Triton's way
(``true``/``false``/``1``/``0``), every tritonserver flag accepted (those that have no meaning
here with one warning line naming them), and Triton's own error for a flag nobody knows.
docs/compatibility.md has the whole table.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

import click

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class TritonBool(click.ParamType):
    """A boolean that takes a value (``--allow-grpc=false``), kept as the string true or false
    so that it passes unchanged to the child processes' flags."""

    name = "boolean"

    def convert(self, value, param, ctx) -> str:
        lowered = str(value).strip().lower()
        if lowered in _TRUE:
            return "true"
        if lowered in _FALSE:
            return "false"
        self.fail(f"expected true or false, got '{value}'", param, ctx)


BOOLEAN = TritonBool()


@dataclass(frozen=True, slots=True)
class IgnoredFlag:
    """A tritonserver flag accepted and left without effect: what it does in Triton, and why
    it does nothing here."""

    flag: str
    type: click.ParamType | type
    why: str
    multiple: bool = False


_NO_GPU_MEMORY = "the backends allocate their own memory"
_GRPC_TUNING = "gRPC keeps its own defaults"

# Every tritonserver 2.5x flag that tritium accepts and ignores, in the order of Triton's usage.
IGNORED_FLAGS: tuple[IgnoredFlag, ...] = (
    IgnoredFlag("--model-namespacing", BOOLEAN, "model names are global across repositories"),
    IgnoredFlag("--enable-peer-access", BOOLEAN, _NO_GPU_MEMORY),
    IgnoredFlag("--http-thread-count", int, "--http-workers sets the gateway processes"),
    IgnoredFlag("--grpc-infer-allocation-pool-size", int, _GRPC_TUNING),
    IgnoredFlag("--sagemaker-port", int, "there is no SageMaker endpoint"),
    IgnoredFlag("--sagemaker-safe-port-range", str, "there is no SageMaker endpoint"),
    IgnoredFlag("--sagemaker-thread-count", int, "there is no SageMaker endpoint"),
    IgnoredFlag("--vertex-ai-port", int, "there is no Vertex AI endpoint"),
    IgnoredFlag("--vertex-ai-thread-count", int, "there is no Vertex AI endpoint"),
    IgnoredFlag("--vertex-ai-default-model", str, "there is no Vertex AI endpoint"),
    IgnoredFlag("--repoagent-directory", str, "repository agents are not supported"),
    IgnoredFlag("--cache-directory", str, "the response cache is built in"),
    IgnoredFlag("--pinned-memory-pool-byte-size", int, _NO_GPU_MEMORY),
    IgnoredFlag("--cuda-memory-pool-byte-size", str, _NO_GPU_MEMORY, multiple=True),
    IgnoredFlag("--cuda-virtual-address-size", str, _NO_GPU_MEMORY, multiple=True),
    IgnoredFlag("--min-supported-compute-capability", float, "every GPU the backends can use is used"),
    IgnoredFlag("--buffer-manager-thread-count", int, "tensors are not copied by a thread pool"),
    IgnoredFlag("--host-policy", str, "instances are not pinned to NUMA nodes", multiple=True),
    IgnoredFlag("--model-load-gpu-limit", str, "loads are not limited by GPU memory", multiple=True),
)

# Flags whose Triton default is off and which tritium cannot turn on: "true" is a usage error.
UNSUPPORTED_WHEN_TRUE: dict[str, str] = {
    "--allow-sagemaker": "there is no SageMaker endpoint",
    "--allow-vertex-ai": "there is no Vertex AI endpoint",
}


# The trace options of the options table (tritium/options.py), read together into one TraceSettings.
TRACE_FLAGS = ("trace_config", "trace_file", "trace_level", "trace_rate", "trace_count", "trace_log_frequency")


def trace_settings(params: dict):
    """The startup trace settings from the trace flags (dropped from ``params``); a usage error
    in Triton's words for a value Triton refuses."""
    from tritium.errors import InvalidArgument
    from tritium.tracing.flags import settings_from_flags

    from tritium.tracing.settings import OTEL_MISSING

    given = {name: params.pop(name) for name in TRACE_FLAGS}
    try:
        settings = settings_from_flags(**given, warn=lambda line: click.echo(line, err=True))
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None
    if settings.mode == "opentelemetry" and not _installed("opentelemetry.sdk"):
        raise click.UsageError(OTEL_MISSING)
    return settings


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:   # its parent package is missing
        return False


def trace_flags(settings) -> tuple[str, ...]:
    """``settings`` as --trace-config flags, for a child process."""
    values = [f"level={level}" for level in settings.level] or ["level=OFF"]
    values += [f"rate={settings.rate}", f"count={settings.count}", f"triton,log-frequency={settings.log_frequency}",
               f"mode={settings.mode}", f"triton,file={settings.file}",
               *(f"opentelemetry,{key}={getattr(settings, key)}"
                 for key in ("url", "bsp_max_export_batch_size", "bsp_schedule_delay", "bsp_max_queue_size")),
               *(f"opentelemetry,resource={item}" for item in settings.resource)]
    return tuple(arg for value in values for arg in ("--trace-config", value))


def _param_name(flag: str) -> str:
    return flag[2:].replace("-", "_")


def ignored_flag_options(command):
    """Add every ignored and unsupported tritonserver flag to ``command``."""
    for item in reversed(IGNORED_FLAGS):
        command = click.option(item.flag, _param_name(item.flag), type=item.type, multiple=item.multiple,
                               default=None, help=f"Triton flag, accepted and ignored: {item.why}.")(command)
    for flag, why in UNSUPPORTED_WHEN_TRUE.items():
        command = click.option(flag, _param_name(flag), type=BOOLEAN, default="false", show_default=True,
                               help=f"Triton flag; only false is accepted: {why}.")(command)
    return command


def ignored_flags_given(params: dict) -> list[str]:
    """The ignored flags that the command line (or a config file) set, and drop them from ``params``."""
    given = []
    for flag in [item.flag for item in IGNORED_FLAGS]:
        value = params.pop(_param_name(flag))
        if value not in (None, ()):
            given.append(flag)
    for flag, why in UNSUPPORTED_WHEN_TRUE.items():
        if params.pop(_param_name(flag)) == "true":
            raise click.UsageError(f"{flag}=true is not supported: {why}.")
    return given


class TritonCommand(click.Command):
    """A command that answers a flag nobody knows as tritonserver does: the program's name,
    ``unrecognized option '--flag'``, the usage line, exit status 1."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = self._expanded(ctx, args)
        given_args = list(args)  # click consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            given = next((arg for arg in given_args if arg.split("=", 1)[0] == error.option_name), error.option_name)
            click.echo(f"{ctx.command_path}: unrecognized option '{given}'", err=True)
            click.echo(f"Usage: {ctx.command_path} [options]\nTry '{ctx.command_path} --help' for the flags.",
                       err=True)
            sys.exit(1)

    def _expanded(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Each long flag given by an unambiguous prefix of its name (``--log-warn=false``) under its
        full name, as tritonserver's getopt_long takes it; an ambiguous one ends as getopt ends."""
        params = self.get_params(ctx)
        names = sorted({opt for param in params for opt in (*param.opts, *param.secondary_opts)
                        if opt.startswith("--")})
        # A flag that takes a value takes the next argument whatever it looks like (``--log-file --x``).
        valued = {opt for param in params if isinstance(param, click.Option) and not param.is_flag
                  for opt in param.opts}
        expanded: list[str] = []
        value_next = False
        for position, arg in enumerate(args):
            if value_next:
                expanded.append(arg)
                value_next = False
                continue
            if arg == "--":
                return expanded + args[position:]
            flag, equals, value = arg.partition("=")
            if flag.startswith("--") and flag not in names:
                matches = [name for name in names if name.startswith(flag)]
                if len(matches) == 1:
                    arg = matches[0] + equals + value
                elif matches:
                    click.echo(f"{ctx.command_path}: option '{arg}' is ambiguous; possibilities: "
                               + " ".join(f"'{name}'" for name in matches), err=True)
                    sys.exit(1)
            expanded.append(arg)
            value_next = not equals and arg in valued
        return expanded
