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
from tritium.affinity import apart, pin, split_layout
from tritium.cpu_quota import cpu_quota, usable_cpus
from tritium.options import (BROKER, BROKER_SPIN_US, GATEWAY, GATEWAY_SPIN_US, REPO_CHECK, REPOSITORY_FOLDER,
                             SEND_EVERY_WHEN_APART, SERVE, WORKER, child_args, options_of)
from tritium.triton_flags import TritonCommand, ignored_flag_options, ignored_flags_given, trace_flags, trace_settings


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


def _cache_bytes(values) -> int:
    from tritium.broker.response_cache import parse_cache_config

    try:
        return parse_cache_config(tuple(values))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cache-config") from None


_METRICS_CONFIG_KEYS = {"histogram_latencies", "counter_latencies", "summary_latencies", "summary_quantiles"}


def metrics_settings(o: dict):
    """The broker's metrics settings from its flags; a ``--metrics-config`` key tritium does not
    read, and a ``summary_quantiles`` pair that does not parse, are said to be ignored, once, at
    startup (Triton logs the pair and goes on)."""
    import logging

    from tritium.broker.latency_summary import DEFAULT_QUANTILES, parse_quantiles
    from tritium.broker.metrics import MetricsSettings

    log = logging.getLogger("tritium.cli")
    options = dict(item.partition("=")[::2] for item in o["metrics_config"])
    for key in sorted(set(options) - _METRICS_CONFIG_KEYS):
        log.warning("--metrics-config %s=%s is ignored: tritium reads %s", key, options[key],
                    ", ".join(sorted(_METRICS_CONFIG_KEYS)))
    quantiles, bad = parse_quantiles(options["summary_quantiles"]) if "summary_quantiles" in options else ((), [])
    for item in bad:
        log.warning("--metrics-config summary_quantiles: '%s' is ignored: expected <quantile>:<error>, the "
                    "quantile between 0 and 1", item)
    return MetricsSettings(o["metrics_address"], o["metrics_port"], _bool(options.get("histogram_latencies", "false")),
                           _bool(options.get("counter_latencies", "true")),
                           _bool(options.get("summary_latencies", "false")),
                           tuple(dict.fromkeys(rank for rank, _ in quantiles or DEFAULT_QUANTILES)),   # (one series each)
                           cpu=_bool(o["allow_cpu_metrics"]), gpu=_bool(o["allow_gpu_metrics"]))

# The options each settings helper below takes.
_LOG_KEYS = ("log_verbose", "log_info", "log_warning", "log_error", "log_format", "log_file")
_CONTROL_KEYS = ("model_control_mode", "load_model", "repository_poll_secs", "model_load_thread_count",
                 "model_load_retry_count")
_REPOSITORY_KEYS = ("model_config_name", "disable_auto_complete_config", "strict_model_config", "backend_config",
                    "backend_directory")


def _pick(o: dict, keys: tuple[str, ...]) -> dict:
    return {key: o[key] for key in keys}


def configure_logs(role: str, log_verbose, log_info, log_warning, log_error, log_format, log_file):
    """Log as the flags say from the start; the settings, for the broker to hand on (``log_file``:
    the file this process logs to, "" when it could not open the one it was given)."""
    from tritium import logs

    settings = logs.LogSettings(log_info=_bool(log_info), log_warning=_bool(log_warning),
                                log_error=_bool(log_error), log_verbose_level=_log_verbose(log_verbose),
                                log_format=log_format)
    log_file = logs.configure(role, settings.log_verbose_level, log_file)
    logs.apply(settings)
    return dataclasses.replace(settings, log_file=log_file)


def control_settings(model_control_mode, load_model, repository_poll_secs, model_load_thread_count,
                     model_load_retry_count):
    from tritium.broker.lifecycle import ControlSettings

    if load_model and model_control_mode != "explicit":
        raise click.UsageError("Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    if "*" in load_model and len(load_model) > 1:
        raise click.UsageError("'--load-model=*' can not be used with other '--load-model' arguments.")
    if repository_poll_secs <= 0 or model_load_thread_count <= 0:
        raise click.BadParameter("--repository-poll-secs and --model-load-thread-count must be positive")
    return ControlSettings(model_control_mode, tuple(load_model), float(repository_poll_secs),
                           model_load_thread_count, model_load_retry_count)


def repository_settings(model_config_name, disable_auto_complete_config, strict_model_config,
                        backend_config, backend_directory=None, gpus_here: bool = True):
    from pathlib import Path

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
        backend_directory=Path(backend_directory) if backend_directory else None,
    )


def rate_limit_resources(mode: str, resources):
    """The rate limiter's resource counts, or None when it is off (Triton then ignores them)."""
    from tritium.broker.rate_limiter import ResourceFlag

    if mode.lower() == "off":
        return None
    return tuple(ResourceFlag.parse(text) for text in resources)


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


def restricted_apis(http_values, grpc_values):
    """The two flags' rules, or Triton's startup error for a malformed or repeated category."""
    from tritium.gateway.restricted import GRPC_FLAG, HTTP_FLAG, parse_restrictions
    from tritium.errors import InvalidArgument

    try:
        return parse_restrictions(http_values, HTTP_FLAG), parse_restrictions(grpc_values, GRPC_FLAG)
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None


def _one_front_end(o) -> None:
    if not (_bool(o["allow_http"]) or _bool(o["allow_grpc"])):
        raise click.UsageError("--allow-http=false and --allow-grpc=false leave nothing to serve: "
                               "allow HTTP, gRPC or both.")


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tritium")
def main() -> None:
    """tritium: a Triton-compatible inference server."""


# -- serve ----------------------------------------------------------------------------------

class ServeCommand(TritonCommand, config_file.SettingsCommand):
    """``tritium serve`` and ``tritonserver``: settings from flags, file and environment; Triton's
    answer to an unknown flag."""


@main.command(cls=ServeCommand)
@options_of(SERVE)
@ignored_flag_options
@click.pass_context
def serve(ctx, **o) -> None:
    """Run broker, a host agent and gateways on this machine (``tritonserver`` is the same command)."""
    from tritium.supervisor import ServeSettings, Supervisor

    trace = trace_settings(o)
    ignored = ignored_flags_given(o)
    _one_front_end(o)
    configure_logs("serve", **_pick(o, _LOG_KEYS))
    _warn_ignored(ignored + _foreign_backend_configs(o["backend_config"]))
    if o["response_cache_byte_size"] is not None:
        if o["cache_config"]:
            raise click.UsageError("Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                                   "Please provide one or the other.")
        o["cache_config"] = (f"local,size={o['response_cache_byte_size']}",)
    # fail early on bad flags, before starting anything
    repository_settings(**_pick(o, _REPOSITORY_KEYS))
    _cache_bytes(o["cache_config"])
    control_settings(**_pick(o, _CONTROL_KEYS))
    restricted_apis(o["http_restricted_api"], o["grpc_restricted_protocol"])
    grpc_tls(o)
    http_workers = o["http_workers"] or max(1, usable_cpus() // 2)
    _place_parts(o, http_workers)
    settings = ServeSettings(
        http_address=o["http_address"], http_port=o["http_port"], http_enabled=_bool(o["allow_http"]),
        grpc_address=o["grpc_address"],
        grpc_port=o["grpc_port"], grpc_enabled=_bool(o["allow_grpc"]), metrics_port=o["metrics_port"],
        metrics_address=o["metrics_address"], metrics_enabled=_bool(o["allow_metrics"]),
        http_workers=http_workers,
        reuse_http_port=_bool(o["reuse_http_port"]), reuse_grpc_port=_bool(o["reuse_grpc_port"]),
        exit_timeout_s=float(o["exit_timeout_secs"]), exit_on_error=_bool(o["exit_on_error"]),
        broker_args=child_args(o, BROKER), worker_args=child_args(o, WORKER),
        # serve checks the ports are free (or shared as asked) before starting its gateways
        gateway_args=(*child_args(o, GATEWAY), *trace_flags(trace), *_gateway_port_sharing(o, http_workers)),
        resolved_env=config_file.variables(ctx.command),
    )
    sys.exit(Supervisor(settings).run())


def _place_parts(o: dict, http_workers: int) -> None:
    """Each part's CPUs under ``--cpu-layout split``, and how many requests the gateways send at a
    time: a few as they come where they run apart from the broker (and from the instances, when
    those are pinned), so that the broker starts on them on a CPU of its own; else a turn's at its
    end. The instances are left free unless --worker-cpus says otherwise: a compute-heavy model needs
    every CPU.

    Under a CPU quota smaller than the CPUs this process may use (a container's CPU limit without
    a CPU set of its own) the CPUs are shared with other processes: pinning gives no part one."""
    cpus, quota = frozenset(os.sched_getaffinity(0)), cpu_quota()
    shared = quota is not None and quota < len(cpus)
    if o["cpu_layout"] == "split":
        given = [f"--{key.replace('_', '-')}" for key in ("gateway_cpus", "broker_cpus") if o[key]]
        if given:
            raise click.UsageError(f"--cpu-layout split chooses the gateways' and the broker's CPUs: give it or "
                                   f"{', '.join(given)}, not both")
        if shared:
            raise click.UsageError(f"--cpu-layout split needs CPUs of their own for the gateways: this process may "
                                   f"use {len(cpus)} CPUs but only {quota:g} CPUs' worth of time (a CPU quota)")
        try:
            o["gateway_cpus"], o["broker_cpus"] = split_layout(cpus, http_workers)
        except ValueError as exc:
            raise click.UsageError(f"--cpu-layout split {exc}") from None
    if o["gateway_send_every"] is None:
        away = apart(o["gateway_cpus"], o["broker_cpus"]) and (
            not o["worker_cpus"] or apart(o["gateway_cpus"], o["worker_cpus"]))
        o["gateway_send_every"] = SEND_EVERY_WHEN_APART if away and not shared else 0


def _gateway_port_sharing(o: dict, http_workers: int) -> tuple[str, ...]:
    """Serve's gateways share the ports among themselves when there are several; a lone gateway
    shares them only as --reuse-http-port / --reuse-grpc-port say, so that another server can
    share a port only with a server that agreed to it, as in Triton."""
    if http_workers > 1:
        return ("--reuse-port", "true")
    return ("--reuse-http-port", o["reuse_http_port"], "--reuse-grpc-port", o["reuse_grpc_port"])


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


def polling_s(given_us: int | None, default_us: int, flag: str) -> float:
    """How long to poll before sleeping: as given, else the default, or none under a CPU quota,
    where every microsecond polled counts against the container's limit."""
    if given_us is not None:
        return given_us / 1e6
    quota = cpu_quota()
    if quota is not None:
        import logging

        logging.getLogger("tritium.cli").info(
            "a CPU quota of %g CPUs: no polling before sleeping (%s sets it anyway)", quota, flag)
        return 0.0
    return default_us / 1e6


# -- the parts ------------------------------------------------------------------------------

@main.command(cls=config_file.SettingsCommand)
@options_of(BROKER)
def broker(**o) -> None:
    """Run the broker: model registry, queues, dynamic batching, statistics, metrics."""
    pin(o["broker_cpus"])   # before ZeroMQ starts its thread
    from tritium.broker.server import Broker, BrokerSettings

    log_settings = configure_logs("broker", **_pick(o, _LOG_KEYS))
    metrics = metrics_settings(o) if _bool(o["allow_metrics"]) else None
    curve = curve_keys(o["curve_secret_key"], "--curve-authorized-keys", o["curve_authorized_keys"], server=True)
    settings = BrokerSettings(tuple(o["model_repository"]), o["frontend"], o["backend"],
                              repository_settings(**_pick(o, _REPOSITORY_KEYS), gpus_here=o["workers_on_this_host"]),
                              metrics=metrics, control=control_settings(**_pick(o, _CONTROL_KEYS)),
                              log_verbose=log_settings.log_verbose_level,
                              heartbeat_interval_s=o["heartbeat_interval_secs"],
                              exit_timeout_s=float(o["exit_timeout_secs"]), curve=curve,
                              cache_bytes=_cache_bytes(o["cache_config"]),
                              spin_s=polling_s(o["broker_spin_us"], BROKER_SPIN_US, "--broker-spin-us"),
                              rate_limit_resources=rate_limit_resources(o["rate_limit"], o["rate_limit_resource"]))
    server = Broker(settings)
    server.log_settings = log_settings  # what it hands every gateway, agent and instance
    server.load_repository()
    sys.exit(server.run())


def grpc_tls(o: dict):
    """TLS for the gRPC port from Triton's flags (None: plain HTTP/2, or no gRPC at all); a usage
    error naming the flag and the file that cannot serve."""
    from tritium.errors import InvalidArgument
    from tritium.gateway.grpc_tls import tls_from_flags

    if not _bool(o["allow_grpc"]):
        return None
    try:
        return tls_from_flags(o["grpc_use_ssl"], o["grpc_use_ssl_mutual"], o["grpc_server_cert"],
                              o["grpc_server_key"], o["grpc_root_cert"])
    except InvalidArgument as exc:
        raise click.UsageError(exc.message) from None


def grpc_keepalive(o: dict):
    """The gRPC keepalive and connection-age settings from Triton's flags."""
    from tritium.gateway.grpc_keepalive import GrpcKeepalive

    return GrpcKeepalive(time_ms=o["grpc_keepalive_time"], timeout_ms=o["grpc_keepalive_timeout"],
                         permit_without_calls=_bool(o["grpc_keepalive_permit_without_calls"]),
                         max_pings_without_data=o["grpc_http2_max_pings_without_data"],
                         max_age_ms=o["grpc_max_connection_age"], max_age_grace_ms=o["grpc_max_connection_age_grace"],
                         min_recv_ping_interval_ms=o["grpc_http2_min_recv_ping_interval_without_data"],
                         max_ping_strikes=o["grpc_http2_max_ping_strikes"])


@main.command(cls=config_file.SettingsCommand)
@options_of(GATEWAY)
def gateway(**o) -> None:
    """Run one gateway process: the KServe v2 HTTP and gRPC front ends."""
    pin(o["gateway_cpus"])   # before ZeroMQ starts its thread
    from tritium.gateway.server import GatewaySettings, run

    configure_logs("gateway", **_pick(o, _LOG_KEYS))
    _one_front_end(o)
    trace = trace_settings(o)
    curve = curve_keys(o["curve_secret_key"], "--curve-server-key", o["curve_server_key"], server=False)
    http_restricted, grpc_restricted = restricted_apis(o["http_restricted_api"], o["grpc_restricted_protocol"])
    run(GatewaySettings(broker=o["broker_address"], http_address=o["http_address"],
                        http_port=o["http_port"] if _bool(o["allow_http"]) else None,
                        grpc_address=o["grpc_address"],
                        grpc_port=o["grpc_port"] if _bool(o["allow_grpc"]) else None,
                        max_input_bytes=o["http_max_input_size"], exit_timeout_s=float(o["exit_timeout_secs"]),
                        server_id=o["server_id"], strict_readiness=_bool(o["strict_readiness"]),
                        allow_client_shm=_bool(o["allow_client_shm"]),
                        grpc_max_message_bytes=o["grpc_max_message_size"],
                        heartbeat_interval_s=o["heartbeat_interval_secs"],
                        max_inflight_requests=o["max_inflight_requests"], curve=curve,
                        http_restricted=http_restricted, grpc_restricted=grpc_restricted,
                        reuse_http_port=_bool(o["reuse_port"]) or _bool(o["reuse_http_port"]),
                        reuse_grpc_port=_bool(o["reuse_port"]) or _bool(o["reuse_grpc_port"]),
                        grpc_server=o["grpc_server"],
                        grpc_keepalive=grpc_keepalive(o), trace=trace,
                        http_header_forward_pattern=o["http_header_forward_pattern"],
                        grpc_header_forward_pattern=o["grpc_header_forward_pattern"],
                        grpc_compression_level=o["grpc_infer_response_compression_level"], grpc_tls=grpc_tls(o),
                        spin_s=polling_s(o["gateway_spin_us"], GATEWAY_SPIN_US, "--gateway-spin-us"),
                        batched_sends=_bool(o["gateway_batched_sends"]),
                        send_every=o["gateway_send_every"] or 0,
                        tensor_pool_bytes=o["tensor_pool_mb"] << 20))


@main.command(cls=config_file.SettingsCommand)
@options_of(WORKER)
def worker(**o) -> None:
    """Run a host agent: starts and supervises this host's instance processes."""
    pin(o["worker_cpus"])   # the instances it starts inherit the set
    from tritium.hosts import detect_gpus
    from tritium.workers.agent import HostAgent, WorkerSettings

    logged = configure_logs("worker", **_pick(o, _LOG_KEYS))
    curve = curve_keys(o["curve_secret_key"], "--curve-server-key", o["curve_server_key"], server=False)
    models = o["models"]
    max_cpu_instances = o["max_cpu_instances"]
    settings = WorkerSettings(
        broker=o["broker_address"], model_repositories=tuple(o["model_repository"]), gpus=detect_gpus(),
        models=tuple(m for m in models.split(",") if m) if models else None, log_verbose=logged.log_verbose_level,
        log_file=logged.log_file,
        exit_timeout_s=float(o["exit_timeout_secs"]), backend_directory=o["backend_directory"],
        backend_config=_backend_options(o["backend_config"]), metrics_interval_s=o["metrics_interval_ms"] / 1000,
        heartbeat_interval_s=o["heartbeat_interval_secs"], curve=curve, tensor_pool_bytes=o["tensor_pool_mb"] << 20,
        max_cpu_instances=max_cpu_instances if max_cpu_instances is not None else usable_cpus())
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
@click.argument("repositories", nargs=-1, required=True, type=REPOSITORY_FOLDER)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@options_of(REPO_CHECK)
def repo_check(repositories, as_json, **repository) -> None:
    """Show every model of REPOSITORIES as tritium would load it; exit 1 if any fails."""
    from tritium.repo import ModelRepository
    from tritium.repo.check import check_rows, render_table, rows_as_json

    # Open every model file, TorchScript too, to report what a load would refuse.
    options = dataclasses.replace(repository_settings(**repository), read_torchscript=True)
    model_repository = ModelRepository(repositories, options)
    model_repository.fetch()   # bucket repositories' mirrors (a failure is one of the scan's errors)
    scan = model_repository.load_all()
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
    command = main.commands[role]
    assert isinstance(command, config_file.SettingsCommand)  # the choice lists only those
    config_path, rows = config_file.effective(ctx, command, role, list(args))
    render = config_file.render_json if as_json else config_file.render_table
    click.echo(render(role, config_path, rows))


if __name__ == "__main__":
    main()
