"""The ``tritium`` command: one subcommand per process role, plus tools.

Flags use Triton's names where Triton has one (``--model-repository``, ``--http-port``,
``--strict-readiness=false``...), so that launch scripts carry over.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import click
import orjson

from tritium import __version__, config_file
from tritium.triton_flags import BOOLEAN, TritonCommand, ignored_flag_options, ignored_flags_given


def _bool(value) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise click.BadParameter(f"expected true or false, got '{value}'")


def _log_verbose(value) -> int:
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"expected an integer, got '{value}'") from None


def repository_options(command):
    """The flags that change how configs are read (broker, serve, repo check)."""
    options = [
        click.option("--model-config-name", default=None, help="Use <model>/configs/NAME.pbtxt when present."),
        click.option("--disable-auto-complete-config", is_flag=True, help="Do not complete configs from model files."),
        click.option("--strict-model-config", type=BOOLEAN, default="false", show_default=True,
                     help="Deprecated Triton alias: true disables auto-complete."),
        click.option("--backend-config", multiple=True,
                     help="BACKEND,KEY=VALUE or KEY=VALUE; tritium reads default-max-batch-size."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def model_control_options(command):
    """Triton's model control flags (serve and broker)."""
    options = [
        click.option("--model-control-mode", type=click.Choice(["none", "poll", "explicit"]), default="none",
                     show_default=True, help="none: load all, never change; poll: follow the repository; "
                     "explicit: load and unload through the repository API."),
        click.option("--load-model", multiple=True, help="Explicit mode: load this model at startup ('*': all)."),
        click.option("--repository-poll-secs", default=15, show_default=True, type=int,
                     help="Poll mode: seconds between repository scans."),
        click.option("--model-load-thread-count", default=4, show_default=True, type=int,
                     help="Models read from disk in parallel."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


heartbeat_option = click.option(
    "--heartbeat-interval-secs", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
    help="Seconds between heartbeats to and from the broker; a peer silent for 3 intervals is dropped.")

cache_option = click.option(
    "--cache-config", multiple=True, help="local,size=BYTES: the response cache for models that enable it.")


def _cache_bytes(values) -> int:
    from tritium.broker.response_cache import parse_cache_config

    try:
        return parse_cache_config(tuple(values))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cache-config") from None


max_inflight_option = click.option(
    "--max-inflight-requests", default=0, show_default=True, type=click.IntRange(min=0),
    help="Inference requests one gateway keeps waiting on the broker before answering 503 (0: no limit).")


def log_options(command):
    """Triton's logging flags; the broker hands them to every process (and POST /v2/logging changes them)."""
    options = [
        click.option("--log-verbose", default="0", show_default=True, help="Verbose logging level (0: off)."),
        click.option("--log-info", type=BOOLEAN, default="true", show_default=True, help="Log info-level lines."),
        click.option("--log-warning", type=BOOLEAN, default="true", show_default=True,
                     help="Log warning-level lines."),
        click.option("--log-error", type=BOOLEAN, default="true", show_default=True, help="Log error-level lines."),
        click.option("--log-format", type=click.Choice(["default", "ISO8601"]), default="default",
                     show_default=True, help="Timestamp layout of log lines."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


LOG_FLAGS = ["log_info", "log_warning", "log_error", "log_format"]


def configure_logs(role: str, log_verbose, log_info, log_warning, log_error, log_format):
    """Log as the flags say from the start; the settings, for the broker to hand on."""
    from tritium import logs

    settings = logs.LogSettings(log_info=_bool(log_info), log_warning=_bool(log_warning),
                                log_error=_bool(log_error), log_verbose_level=_log_verbose(log_verbose),
                                log_format=log_format)
    logs.configure(role, settings.log_verbose_level)
    logs.apply(settings)
    return settings


def control_settings(model_control_mode, load_model, repository_poll_secs, model_load_thread_count):
    from tritium.broker.lifecycle import ControlSettings

    if load_model and model_control_mode != "explicit":
        raise click.UsageError("Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    if "*" in load_model and len(load_model) > 1:
        raise click.UsageError("'--load-model=*' can not be used with other '--load-model' arguments.")
    if repository_poll_secs <= 0 or model_load_thread_count <= 0:
        raise click.BadParameter("--repository-poll-secs and --model-load-thread-count must be positive")
    return ControlSettings(model_control_mode, tuple(load_model), float(repository_poll_secs),
                           model_load_thread_count)


def repository_settings(model_config_name, disable_auto_complete_config, strict_model_config,
                        backend_config, gpus_here: bool = True):
    from tritium.repo import RepositoryOptions
    from tritium.hosts import detect_gpus

    default_max_batch_size = 4
    for item in backend_config:
        setting = item.split(",", 1)[-1] if "," in item else item
        key, _, value = setting.partition("=")
        if key == "default-max-batch-size":
            try:
                default_max_batch_size = int(value)
            except ValueError:
                raise click.BadParameter(f"default-max-batch-size must be an integer, got '{value}'") from None
    return RepositoryOptions(
        model_config_name=model_config_name,
        auto_complete=not (disable_auto_complete_config or _bool(strict_model_config)),
        default_max_batch_size=default_max_batch_size,
        gpus=detect_gpus() if gpus_here else None,
    )


def curve_options(peer_option: str, peer_help: str):
    """--curve-secret-key plus the broker's folder of client keys or a client's broker key."""
    def decorate(command):
        command = click.option(peer_option, default=None, help=peer_help)(command)
        return click.option("--curve-secret-key", default=None,
                            help="This process's CURVE secret key file (NAME.key_secret); see docs/security.md.")(command)
    return decorate


def curve_keys(secret_key: str | None, peer_option: str, peer: str | None, *, server: bool):
    """The CURVE settings of the flags (None: no CURVE); both flags or neither, files that load."""
    from tritium.errors import InvalidArgument
    from tritium.security import CurveKeys

    if (secret_key is None) != (peer is None):
        raise click.UsageError(f"--curve-secret-key and {peer_option} go together: give both or neither.")
    if secret_key is None:
        return None
    keys = CurveKeys(secret_key, authorized_keys_dir=peer) if server else CurveKeys(secret_key, server_key_file=peer)
    try:
        keys.check()
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None
    return keys


def restricted_api_options(command):
    """Triton's --http-restricted-api and --grpc-restricted-protocol (gateway and serve)."""
    command = click.option("--grpc-restricted-protocol", multiple=True,
                           help="PROTOCOL,...:KEY=VALUE: those gRPC calls need the metadata "
                           "triton-grpc-protocol-KEY: VALUE (repeatable).")(command)
    return click.option("--http-restricted-api", multiple=True,
                        help="API,...:KEY=VALUE: those HTTP calls need the header KEY: VALUE (repeatable).")(command)


def restricted_apis(http_values, grpc_values):
    """The two flags' rules, or Triton's startup error for a malformed or repeated category."""
    from tritium.gateway.restricted import GRPC_FLAG, HTTP_FLAG, parse_restrictions
    from tritium.errors import InvalidArgument

    try:
        return parse_restrictions(http_values, HTTP_FLAG), parse_restrictions(grpc_values, GRPC_FLAG)
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None


def _backend_options(values) -> dict[str, dict[str, str]]:
    """--backend-config=BACKEND,KEY=VALUE flags as {backend: {key: value}}."""
    options: dict[str, dict[str, str]] = {}
    for value in values:
        backend, _, setting = value.partition(",")
        key, equals, item = setting.partition("=")
        if not setting or not equals:
            continue  # global settings (KEY=VALUE) are read by the broker
        options.setdefault(backend, {})[key] = item
    return options


def _pass_through(ctx: click.Context, names: list[str]) -> tuple[str, ...]:
    """Rebuild the command-line flags ``names`` as given, for a child process."""
    args = []
    for name in names:
        value = ctx.params.get(name)
        flag = "--" + name.replace("_", "-")
        if value is None or value is False or value == ():
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, tuple):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return tuple(args)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tritium")
def main() -> None:
    """tritium: a Triton-compatible inference server."""


# -- serve ----------------------------------------------------------------------------------

class ServeCommand(TritonCommand, config_file.SettingsCommand):
    """``tritium serve`` and ``tritonserver``: settings from flags, file and environment; Triton's
    answer to an unknown flag."""


@main.command(cls=ServeCommand)
@click.option("--model-repository", "--model-store", "model_repository", multiple=True, required=True,
              help="A model repository folder (repeatable).")
@click.option("--allow-http", type=BOOLEAN, default="true", show_default=True,
              help="Serve HTTP; tritium always does (false is refused).")
@click.option("--http-address", default="0.0.0.0", show_default=True, help="Address the HTTP server binds.")
@click.option("--http-port", default=8000, show_default=True, type=int, help="HTTP port.")
@click.option("--grpc-address", default="0.0.0.0", show_default=True, help="Address the gRPC server binds.")
@click.option("--grpc-port", default=8001, show_default=True, type=int, help="gRPC port.")
@click.option("--allow-grpc", type=BOOLEAN, default="true", show_default=True, help="Serve gRPC.")
@click.option("--metrics-port", default=8002, show_default=True, type=int, help="Prometheus metrics port.")
@click.option("--metrics-address", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option("--allow-metrics", type=BOOLEAN, default="true", show_default=True, help="Serve Prometheus metrics.")
@click.option("--metrics-config", multiple=True, help="KEY=VALUE; tritium reads histogram_latencies.")
@click.option("--metrics-interval-ms", default=2000, show_default=True, type=click.FloatRange(min=1),
              help="How often host CPU, memory and GPU metrics are updated.")
@click.option("--http-workers", default=None, type=int,
              help="Gateway processes sharing the HTTP and gRPC ports (default: one per 2 cores).")
@click.option("--exit-timeout-secs", default=30, show_default=True, type=int,
              help="On SIGTERM: how long requests in flight may take to finish.")
@click.option("--exit-on-error", type=BOOLEAN, default="true", show_default=True,
              help="Exit when a model fails to load at startup.")
@click.option("--strict-readiness", type=BOOLEAN, default="true", show_default=True,
              help="Ready only when every model is ready (false: ready when the server is up).")
@log_options
@click.option("--backend-directory", default=None, help="Where custom backends are looked up.")
@click.option("--http-max-input-size", default=64 * 1024 * 1024, show_default=True, type=int,
              help="Largest HTTP request body, in bytes.")
@click.option("--id", "server_id", default="triton", show_default=True, help="Server name in /v2 metadata.")
@click.option("--allow-client-shm", type=BOOLEAN, default="false", show_default=True,
              help="Let clients register system shared memory regions (they must share the gateway's host).")
@click.option("--grpc-max-message-size", default=2**31 - 1, show_default=True, type=int,
              help="Largest gRPC message, in bytes, either way (Triton's fixed limit by default).")
@heartbeat_option
@max_inflight_option
@cache_option
@click.option("--response-cache-byte-size", default=None, type=click.IntRange(min=0),
              help="Deprecated Triton flag: the same as --cache-config=local,size=BYTES.")
@restricted_api_options
@repository_options
@model_control_options
@ignored_flag_options
@click.pass_context
def serve(ctx, model_repository, allow_http, http_address, http_port, grpc_address, grpc_port, allow_grpc,
          metrics_port, metrics_address, allow_metrics, metrics_config, metrics_interval_ms, http_workers,
          exit_timeout_secs, exit_on_error, strict_readiness, log_verbose, log_info, log_warning, log_error,
          log_format, backend_directory, http_max_input_size, server_id, allow_client_shm, grpc_max_message_size,
          heartbeat_interval_secs, max_inflight_requests, cache_config, response_cache_byte_size,
          http_restricted_api, grpc_restricted_protocol, model_control_mode, load_model,
          repository_poll_secs, model_load_thread_count, **rest) -> None:
    """Run broker, a host agent and gateways on this machine (``tritonserver`` is the same command)."""
    from tritium.supervisor import ServeSettings, Supervisor

    ignored = ignored_flags_given(rest)
    repository = rest
    if allow_http == "false":
        raise click.UsageError("--allow-http=false is not supported: tritium always serves HTTP "
                               "(its readiness and model control go through it).")
    log_settings = configure_logs("serve", log_verbose, log_info, log_warning, log_error, log_format)
    verbose = log_settings.log_verbose_level
    _warn_ignored(ignored + _foreign_backend_configs(repository["backend_config"]))
    if response_cache_byte_size is not None and not cache_config:
        cache_config = (f"local,size={response_cache_byte_size}",)
        ctx.params["cache_config"] = cache_config
    ctx.params["metrics_interval_ms"] = int(metrics_interval_ms)
    repository_settings(**repository)  # fail early on bad flags, before starting anything
    _cache_bytes(cache_config)
    control_settings(model_control_mode, load_model, repository_poll_secs, model_load_thread_count)
    restricted_apis(http_restricted_api, grpc_restricted_protocol)
    workers = http_workers or max(1, (os.cpu_count() or 2) // 2)
    settings = ServeSettings(
        model_repositories=tuple(model_repository), http_address=http_address, http_port=http_port,
        grpc_address=grpc_address, grpc_port=grpc_port, grpc_enabled=_bool(allow_grpc),
        metrics_port=metrics_port, metrics_address=metrics_address, metrics_enabled=_bool(allow_metrics),
        http_workers=workers,
        exit_timeout_s=float(exit_timeout_secs), exit_on_error=_bool(exit_on_error), log_verbose=verbose,
        repository_args=_pass_through(ctx, ["model_config_name", "disable_auto_complete_config",
                                            "strict_model_config", "backend_config"]),
        broker_args=_pass_through(ctx, ["metrics_port", "metrics_address", "allow_metrics", "metrics_config",
                                        "model_control_mode", "load_model", "repository_poll_secs",
                                        "model_load_thread_count", "exit_timeout_secs",
                                        "heartbeat_interval_secs", "cache_config", *LOG_FLAGS]),
        gateway_args=("--http-max-input-size", str(http_max_input_size), "--id", server_id,
                      "--strict-readiness", strict_readiness, "--exit-timeout-secs", str(exit_timeout_secs),
                      "--grpc-address", grpc_address, "--grpc-port", str(grpc_port), "--allow-grpc", allow_grpc,
                      "--allow-client-shm", allow_client_shm, "--grpc-max-message-size", str(grpc_max_message_size),
                      "--reuse-port", "true",   # serve's own gateways share; serve checks the ports are free
                      *_pass_through(ctx, ["heartbeat_interval_secs", "max_inflight_requests",
                                          "http_restricted_api", "grpc_restricted_protocol", *LOG_FLAGS])),
        worker_args=("--exit-timeout-secs", str(exit_timeout_secs),
                     *_pass_through(ctx, ["backend_directory", "backend_config", "metrics_interval_ms",
                                          "heartbeat_interval_secs", *LOG_FLAGS])),
        resolved_env=config_file.variables(ctx.command),
    )
    sys.exit(Supervisor(settings).run())


def tritonserver() -> None:
    """The ``tritonserver`` command: ``tritium serve`` under Triton's name."""
    serve.main(args=sys.argv[1:], prog_name="tritonserver")


# Triton's backends that tritium does not have: their --backend-config settings reach nothing.
_TRITON_ONLY_BACKENDS = frozenset({"tensorflow", "tensorrt", "openvino", "fil", "dali", "vllm", "tensorrtllm"})


def _foreign_backend_configs(values) -> list[str]:
    named = {value.partition(",")[0] for value in values if "," in value}
    return [f"--backend-config={name},..." for name in sorted(named & _TRITON_ONLY_BACKENDS)]


def _warn_ignored(flags: list[str]) -> None:
    if flags:
        import logging

        logging.getLogger("tritium.cli").warning(
            "these Triton flags have no effect in tritium and are ignored: %s", ", ".join(flags))


# -- the parts ------------------------------------------------------------------------------

@main.command(cls=config_file.SettingsCommand)
@click.option("--model-repository", "--model-store", "model_repository", multiple=True, required=True,
              help="A model repository folder (repeatable).")
@click.option("--frontend", required=True, help="ZeroMQ endpoint gateways connect to (bound).")
@click.option("--backend", required=True, help="ZeroMQ endpoint workers connect to (bound).")
@click.option("--metrics-port", default=8002, show_default=True, type=int, help="Prometheus metrics port.")
@click.option("--metrics-address", default="0.0.0.0", show_default=True, help="Address the metrics server binds.")
@click.option("--allow-metrics", type=BOOLEAN, default="true", show_default=True, help="Serve Prometheus metrics.")
@click.option("--metrics-config", multiple=True, help="KEY=VALUE; tritium reads histogram_latencies.")
@log_options
@click.option("--exit-timeout-secs", default=30, show_default=True, type=int,
              help="On SIGTERM: how long queued and running requests may take to finish.")
@heartbeat_option
@cache_option
@click.option("--workers-on-this-host", is_flag=True, hidden=True,
              help="Check instance groups against this host's GPUs (serve: the only worker runs here).")
@curve_options("--curve-authorized-keys", "Folder of the CURVE public keys (NAME.key) of every gateway and worker "
               "let in; read again when it changes.")
@repository_options
@model_control_options
def broker(model_repository, frontend, backend, metrics_port, metrics_address, allow_metrics, metrics_config,
           log_verbose, log_info, log_warning, log_error, log_format, exit_timeout_secs, heartbeat_interval_secs,
           cache_config, workers_on_this_host,
           curve_secret_key,
           curve_authorized_keys, model_control_mode, load_model, repository_poll_secs, model_load_thread_count,
           **repository) -> None:
    """Run the broker: model registry, queues, dynamic batching, statistics, metrics."""
    from tritium.broker.metrics import MetricsSettings
    from tritium.broker.server import Broker, BrokerSettings

    log_settings = configure_logs("broker", log_verbose, log_info, log_warning, log_error, log_format)
    options = dict(item.partition("=")[::2] for item in metrics_config)
    metrics = MetricsSettings(metrics_address, metrics_port, _bool(options.get("histogram_latencies", "false"))) \
        if _bool(allow_metrics) else None
    control = control_settings(model_control_mode, load_model, repository_poll_secs, model_load_thread_count)
    curve = curve_keys(curve_secret_key, "--curve-authorized-keys", curve_authorized_keys, server=True)
    settings = BrokerSettings(tuple(model_repository), frontend, backend,
                              repository_settings(**repository, gpus_here=workers_on_this_host),
                              metrics=metrics, control=control, log_verbose=_log_verbose(log_verbose),
                              heartbeat_interval_s=heartbeat_interval_secs, exit_timeout_s=float(exit_timeout_secs),
                              curve=curve, cache_bytes=_cache_bytes(cache_config))
    server = Broker(settings)
    server.log_settings = log_settings  # what it hands every gateway, agent and instance
    server.load_repository()
    sys.exit(server.run())


@main.command(cls=config_file.SettingsCommand)
@click.option("--broker", "broker_address", required=True, help="The broker's frontend endpoint.")
@click.option("--http-address", default="0.0.0.0", show_default=True, help="Address the HTTP server binds.")
@click.option("--http-port", default=8000, show_default=True, type=int, help="HTTP port.")
@click.option("--grpc-address", default="0.0.0.0", show_default=True, help="Address the gRPC server binds.")
@click.option("--grpc-port", default=8001, show_default=True, type=int, help="gRPC port.")
@click.option("--allow-grpc", type=BOOLEAN, default="true", show_default=True, help="Serve gRPC.")
@click.option("--http-max-input-size", default=64 * 1024 * 1024, show_default=True, type=int,
              help="Largest HTTP request body, in bytes.")
@click.option("--exit-timeout-secs", default=30, show_default=True, type=int,
              help="On SIGTERM: how long requests in flight may take to finish.")
@click.option("--strict-readiness", type=BOOLEAN, default="true", show_default=True,
              help="Ready only when every model is ready (false: ready when the server is up).")
@click.option("--id", "server_id", default="triton", show_default=True, help="Server name in /v2 metadata.")
@log_options
@click.option("--allow-client-shm", type=BOOLEAN, default="false", show_default=True,
              help="Let clients register system shared memory regions (they must share this host).")
@click.option("--grpc-max-message-size", default=2**31 - 1, show_default=True, type=int,
              help="Largest gRPC message, in bytes, either way.")
@heartbeat_option
@max_inflight_option
@restricted_api_options
@curve_options("--curve-server-key", "The broker's CURVE public key file (NAME.key).")
@click.option("--reuse-port", type=BOOLEAN, default="false", show_default=True,
              help="Share the HTTP and gRPC ports with this deployment's other gateways (SO_REUSEPORT); "
                   "false: a port in use stops startup.")
def gateway(broker_address, http_address, http_port, grpc_address, grpc_port, allow_grpc, http_max_input_size,
            exit_timeout_secs, strict_readiness, server_id, log_verbose, log_info, log_warning, log_error,
            log_format, allow_client_shm,
            grpc_max_message_size, heartbeat_interval_secs, max_inflight_requests, http_restricted_api,
            grpc_restricted_protocol, curve_secret_key, curve_server_key, reuse_port) -> None:
    """Run one gateway process: the KServe v2 HTTP and gRPC front ends."""
    from tritium.gateway.server import GatewaySettings, run

    configure_logs("gateway", log_verbose, log_info, log_warning, log_error, log_format)
    curve = curve_keys(curve_secret_key, "--curve-server-key", curve_server_key, server=False)
    http_restricted, grpc_restricted = restricted_apis(http_restricted_api, grpc_restricted_protocol)
    run(GatewaySettings(broker=broker_address, http_address=http_address, http_port=http_port,
                        grpc_address=grpc_address, grpc_port=grpc_port if _bool(allow_grpc) else None,
                        max_input_bytes=http_max_input_size, exit_timeout_s=float(exit_timeout_secs),
                        server_id=server_id, strict_readiness=_bool(strict_readiness),
                        allow_client_shm=_bool(allow_client_shm), grpc_max_message_bytes=grpc_max_message_size,
                        heartbeat_interval_s=heartbeat_interval_secs, max_inflight_requests=max_inflight_requests,
                        curve=curve, http_restricted=http_restricted, grpc_restricted=grpc_restricted,
                        reuse_port=_bool(reuse_port)))


@main.command(cls=config_file.SettingsCommand)
@click.option("--broker", "broker_address", required=True, help="The broker's backend endpoint.")
@click.option("--model-repository", "--model-store", "model_repository", multiple=True, required=True,
              help="A model repository folder (repeatable).")
@click.option("--models", default=None, help="Comma-separated models this host serves (default: all).")
@click.option("--exit-timeout-secs", default=30, show_default=True, type=int,
              help="On SIGTERM: how long requests in flight may take to finish.")
@click.option("--backend-directory", default=None, help="Where custom backends are looked up (<dir>/<backend>/).")
@click.option("--backend-config", multiple=True, help="BACKEND,KEY=VALUE: an option given to that backend.")
@click.option("--metrics-interval-ms", default=2000, show_default=True, type=int,
              help="How often the host's CPU, memory and GPU figures reach the broker.")
@log_options
@heartbeat_option
@click.option("--max-cpu-instances", default=None, type=click.IntRange(min=0),
              help="Autoscaled CPU instances this host may run, besides its fixed ones (default: one per core).")
@curve_options("--curve-server-key", "The broker's CURVE public key file (NAME.key).")
def worker(broker_address, model_repository, models, exit_timeout_secs, backend_directory, backend_config,
           metrics_interval_ms, log_verbose, log_info, log_warning, log_error, log_format, heartbeat_interval_secs,
           max_cpu_instances, curve_secret_key, curve_server_key) -> None:
    """Run a host agent: starts and supervises this host's instance processes."""
    from tritium.hosts import detect_gpus
    from tritium.workers.agent import HostAgent, WorkerSettings

    logged = configure_logs("worker", log_verbose, log_info, log_warning, log_error, log_format)
    verbose = logged.log_verbose_level
    curve = curve_keys(curve_secret_key, "--curve-server-key", curve_server_key, server=False)
    settings = WorkerSettings(
        broker=broker_address, model_repositories=tuple(model_repository), gpus=detect_gpus(),
        models=tuple(m for m in models.split(",") if m) if models else None, log_verbose=verbose,
        exit_timeout_s=float(exit_timeout_secs), backend_directory=backend_directory,
        backend_config=_backend_options(backend_config), metrics_interval_s=metrics_interval_ms / 1000,
        heartbeat_interval_s=heartbeat_interval_secs, curve=curve,
        max_cpu_instances=max_cpu_instances if max_cpu_instances is not None else (os.cpu_count() or 1))
    sys.exit(HostAgent(settings).run())


# -- tools ----------------------------------------------------------------------------------

def _register_tools() -> None:
    """perf and analyze live in their packages; the group only lists them."""
    from tritium.analyze.command import analyze_command
    from tritium.perf.command import perf_command

    main.add_command(perf_command)
    main.add_command(analyze_command)


_register_tools()


@main.group("keys")
def keys_group() -> None:
    """CURVE key pairs for the broker, gateways and workers (docs/security.md)."""


@keys_group.command("generate")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--name", required=True, help="Base name of the files: NAME.key and NAME.key_secret.")
@click.option("--force", is_flag=True, help="Replace existing files of that name.")
def keys_generate(directory, name, force) -> None:
    """Write a CURVE key pair: NAME.key (public, handed out) and NAME.key_secret (mode 0600)."""
    from tritium.errors import InvalidArgument
    from tritium.security import generate_keys, load_public_key

    if not name or "/" in name or name.startswith("."):
        raise click.BadParameter(f"'{name}' is not a plain file name", param_hint="--name")
    try:
        public, secret = generate_keys(directory, name, force)
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None
    click.echo(f"public key: {public} ({load_public_key(str(public)).decode()})")
    click.echo(f"secret key: {secret} (keep it on this host)")


@main.group("repo")
def repo_group() -> None:
    """Inspect model repositories."""


@repo_group.command("check")
@click.argument("repositories", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@repository_options
def repo_check(repositories, as_json, **repository) -> None:
    """Show every model of REPOSITORIES as tritium would load it; exit 1 if any fails."""
    from tritium.repo import ModelRepository
    from tritium.repo.check import check_rows, render_table, rows_as_json

    # Open every model file, TorchScript too, to report what a load would refuse.
    options = dataclasses.replace(repository_settings(**repository), read_torchscript=True)
    scan = ModelRepository(repositories, options).load_all()
    rows = check_rows(scan)
    if as_json:
        sys.stdout.write(orjson.dumps(rows_as_json(rows, scan.errors), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        click.echo(render_table(rows, scan.errors))
    sys.exit(1 if scan.errors or any(not row.ok for row in rows) else 0)


@main.group("config")
def config_group() -> None:
    """Inspect the settings of the server commands."""


@config_group.command("show", context_settings={"ignore_unknown_options": True})
@click.argument("role", type=click.Choice([name for name, command in main.commands.items()
                                           if isinstance(command, config_file.SettingsCommand)]))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def config_show(ctx, role, args, as_json) -> None:
    """Print every setting ROLE would run with and where it came from: ARGS are ROLE's flags
    (--config FILE among them); TRITIUM_* variables are read as ROLE would read them."""
    config_path, rows = config_file.effective(ctx, main.commands[role], role, list(args))
    render = config_file.render_json if as_json else config_file.render_table
    click.echo(render(role, config_path, rows))


if __name__ == "__main__":
    main()
