"""Every command-line option of the server commands, declared once.

Each row names the commands that accept it (``serve`` and the role commands ``broker``,
``gateway``, ``worker``; ``repo check`` reads configs as the broker does) and the children
``serve`` hands it to, as given: ``serve`` builds its broker's, workers' and gateways' command
lines from this table, so an option added here reaches the process that uses it. Options that
``serve`` translates instead of passing on (``--response-cache-byte-size``, ``--http-workers``)
have no ``to``. Flag names are Triton's where Triton has one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from tritium.affinity import CPU_LIST
from tritium.triton_flags import BOOLEAN

SERVE, BROKER, GATEWAY, WORKER, REPO_CHECK = "serve", "broker", "gateway", "worker", "repo check"


@dataclass(frozen=True)
class Option:
    """One flag: its names (the first is what children are given), who accepts it, who
    ``serve`` passes it to, and click's settings for it."""

    names: tuple[str, ...]
    on: frozenset[str]
    to: frozenset[str] = frozenset()
    dest: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.dest or self.names[0][2:].replace("-", "_")

    def click_option(self) -> Callable:
        names = (*self.names, self.dest) if self.dest else self.names
        return click.option(*names, **self.settings)


def _option(*names: str, on: str, to: str = "", dest: str | None = None, **settings) -> Option:
    """``on`` and ``to``: command names separated by commas."""
    def roles(text: str) -> frozenset[str]:
        return frozenset(part.strip() for part in text.split(",") if part.strip())
    if settings.get("default") is not None and not settings.get("multiple") and "show_default" not in settings:
        settings["show_default"] = True
    return Option(names, roles(on), roles(to), dest, settings)


class HeaderPattern(click.ParamType):
    """A header forwarding pattern, checked when the command line is read; kept as the text given."""

    name = "REGEX"

    def convert(self, value, param, ctx) -> str:
        from tritium.gateway.header_forwarding import compile_pattern

        try:
            compile_pattern(value)
        except re.error as exc:
            self.fail(f"{value!r} is not a regular expression: {exc}", param, ctx)
        return value


HEADER_PATTERN = HeaderPattern()


class RepositoryFolder(click.ParamType):
    """A model repository: a folder, or a location in S3 (``s3://bucket/path``), Google Cloud
    Storage (``gs://bucket/path``) or Azure Storage (``as://account/container/path``), read
    through a mirror on each host; a malformed location, or one whose client library is not
    installed, is refused when the command line is read."""

    name = "FOLDER"

    def convert(self, value, param, ctx) -> str:
        from tritium.repo.cloud_mirror import StorageError, bucket_for, is_cloud

        if is_cloud(value):
            try:
                bucket_for(str(value)).require_client()
            except StorageError as exc:
                self.fail(f"'{value}': {exc}", param, ctx)
        return value


REPOSITORY_FOLDER = RepositoryFolder()


class RateLimitResource(click.ParamType):
    """A --rate-limit-resource, checked when the command line is read; kept as the text given."""

    name = "NAME:COUNT[:DEVICE]"

    def convert(self, value, param, ctx) -> str:
        from tritium.broker.rate_limiter import ResourceFlag

        try:
            ResourceFlag.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


RATE_LIMIT_RESOURCE = RateLimitResource()
_ALL = "serve, broker, gateway, worker"
_CHILDREN = "broker, gateway, worker"
# How long the broker and a gateway poll before sleeping, unless told or under a CPU quota.
BROKER_SPIN_US = 300
GATEWAY_SPIN_US = 1000
# How many of a turn's requests a gateway sends at a time when it runs on CPUs apart from the
# broker's (docs/performance.md, "The gateway on a CPU of its own": 8 served more than 4, 6 or 12).
SEND_EVERY_WHEN_APART = 8

OPTIONS: tuple[Option, ...] = (
    # -- the parts of a deployment: where they meet, what each runs
    _option("--frontend", on="broker", required=True, help="ZeroMQ endpoint gateways connect to (bound)."),
    _option("--backend", on="broker", required=True, help="ZeroMQ endpoint workers connect to (bound)."),
    _option("--workers-on-this-host", on="broker", is_flag=True, hidden=True,
            help="Check instance groups against this host's GPUs (serve: the only worker runs here)."),
    _option("--broker", dest="broker_address", on="gateway, worker", required=True,
            help="The broker's endpoint: its --frontend for a gateway, its --backend for a worker."),
    _option("--models", on="worker", default=None, help="Comma-separated models this host serves (default: all)."),
    _option("--max-cpu-instances", on="worker", default=None, type=click.IntRange(min=0),
            help="Autoscaled CPU instances this host may run, besides its fixed ones (default: one per CPU it may "
                 "use, its CPU quota counted)."),
    # -- where models come from
    _option("--model-repository", "--model-store", dest="model_repository", on="serve, broker, worker",
            to="broker, worker", multiple=True, required=True, type=REPOSITORY_FOLDER,
            help="A model repository: a folder, or s3://, gs:// or as:// storage (repeatable)."),
    _option("--model-config-name", on="serve, broker, repo check", to="broker", default=None,
            help="Use <model>/configs/NAME.pbtxt when present."),
    _option("--disable-auto-complete-config", on="serve, broker, repo check", to="broker", is_flag=True,
            help="Do not complete configs from model files."),
    _option("--strict-model-config", on="serve, broker, repo check", to="broker", type=BOOLEAN, default="false",
            help="Deprecated Triton alias: true disables auto-complete."),
    _option("--backend-config", on="serve, broker, worker, repo check", to="broker, worker", multiple=True,
            help="BACKEND,KEY=VALUE: an option given to that backend; default-max-batch-size (global or "
                 "per backend) is read when completing configs."),
    _option("--backend-directory", on="serve, broker, worker, repo check", to="broker, worker", default=None,
            help="Where custom backends are looked up (<dir>/<backend>/), Python-based ones (model.py) too."),
    # -- model control
    _option("--model-control-mode", on="serve, broker", to="broker", default="none",
            type=click.Choice(["none", "poll", "explicit"], case_sensitive=False),   # Triton lowercases it
            help="none: load all, never change; poll: follow the repository; "
                 "explicit: load and unload through the repository API."),
    _option("--load-model", on="serve, broker", to="broker", multiple=True,
            help="Explicit mode: load this model at startup ('*': all)."),
    _option("--repository-poll-secs", on="serve, broker", to="broker", default=15, type=int,
            help="Poll mode: seconds between repository scans."),
    _option("--model-load-thread-count", on="serve, broker", to="broker", default=4, type=int,
            help="Models read from disk in parallel."),
    _option("--model-load-retry-count", on="serve, broker", to="broker", default=0, type=click.IntRange(min=0),
            help="How many more times a model version that fails to load is loaded again, at once."),
    # -- the rate limiter
    _option("--rate-limit", on="serve, broker", to="broker", default="off",
            type=click.Choice(["off", "execution_count"], case_sensitive=False),
            help="execution_count: an instance runs a batch only when the resources its instance group's "
                 "rate_limiter names are free, instances taking turns by executions and priority; off: "
                 "rate_limiter settings are ignored."),
    _option("--rate-limit-resource", on="serve, broker", to="broker", multiple=True, type=RATE_LIMIT_RESOURCE,
            help="How many of a resource there are, on DEVICE or on each device (repeatable; default: the most "
                 "any instance asks for)."),
    # -- the front ends
    _option("--allow-http", on="serve, gateway", to="gateway", type=BOOLEAN, default="true", help="Serve HTTP."),
    _option("--http-address", on="serve, gateway", to="gateway", default="0.0.0.0",
            help="Address the HTTP server binds."),
    _option("--http-port", on="serve, gateway", to="gateway", default=8000, type=int, help="HTTP port."),
    _option("--allow-grpc", on="serve, gateway", to="gateway", type=BOOLEAN, default="true", help="Serve gRPC."),
    _option("--grpc-address", on="serve, gateway", to="gateway", default="0.0.0.0",
            help="Address the gRPC server binds."),
    _option("--grpc-port", on="serve, gateway", to="gateway", default=8001, type=int, help="gRPC port."),
    _option("--grpc-server", on="serve, gateway", to="gateway", default="tritium",
            type=click.Choice(["tritium", "grpcio"]),
            help="The gRPC server: tritium (on the gateway's event loop) or grpcio (grpc.aio, kept for one release)."),
    _option("--http-workers", on="serve", default=None, type=click.IntRange(min=1),
            help="Gateway processes sharing the HTTP and gRPC ports (default: one per 2 CPUs this process may "
                 "use, its CPU quota counted)."),
    _option("--reuse-http-port", on="serve, gateway", type=BOOLEAN, default="false",
            help="Share the HTTP port with other servers that ask the same (SO_REUSEPORT); false: a port in use "
                 "stops startup. The gateways of one serve (--http-workers above 1) share it either way."),
    _option("--reuse-grpc-port", on="serve, gateway", type=BOOLEAN, default="false",
            help="The same for the gRPC port."),
    _option("--reuse-port", on="gateway", type=BOOLEAN, default="false",
            help="Share the HTTP and gRPC ports with this deployment's other gateways (SO_REUSEPORT); "
                 "false: a port in use stops startup."),
    _option("--http-max-input-size", on="serve, gateway", to="gateway", default=64 * 1024 * 1024, type=int,
            help="Largest JSON of an HTTP request (all of a body without binary data), and largest "
                 "compressed body once inflated, in bytes; binary tensor data sent uncompressed is not "
                 "limited, as in Triton."),
    _option("--grpc-max-message-size", on="serve, gateway", to="gateway", default=2**31 - 1, type=int,
            help="Largest gRPC message, in bytes, either way (Triton's fixed limit by default)."),
    _option("--grpc-keepalive-time", on="serve, gateway", to="gateway", default=7_200_000, type=click.IntRange(min=0),
            help="Milliseconds a gRPC connection may stay silent before the server pings it (0: never)."),
    _option("--grpc-keepalive-timeout", on="serve, gateway", to="gateway", default=20_000, type=click.IntRange(min=1),
            help="Milliseconds the server waits for anything after its ping before closing the connection."),
    _option("--grpc-keepalive-permit-without-calls", on="serve, gateway", to="gateway", type=BOOLEAN,
            default="false", help="Ping connections that have no calls in flight too."),
    _option("--grpc-http2-max-pings-without-data", on="serve, gateway", to="gateway", default=2,
            type=click.IntRange(min=0), help="Pings the server sends with no data sent between them (0: no limit)."),
    _option("--grpc-http2-min-recv-ping-interval-without-data", on="serve, gateway", to="gateway", default=300_000,
            type=click.IntRange(min=0),
            help="Milliseconds a client should leave between pings while the server sends it nothing; "
                 "a ping sooner is a strike."),
    _option("--grpc-http2-max-ping-strikes", on="serve, gateway", to="gateway", default=2, type=click.IntRange(min=0),
            help="Strikes tolerated before the connection is told GOAWAY (too_many_pings) and closed (0: any)."),
    _option("--grpc-max-connection-age", on="serve, gateway", to="gateway", default=0, type=click.IntRange(min=0),
            help="Milliseconds after which a gRPC connection is told GOAWAY, +-10% (0: never)."),
    _option("--grpc-max-connection-age-grace", on="serve, gateway", to="gateway", default=0,
            type=click.IntRange(min=0),
            help="Milliseconds a connection past its age has to finish its calls before it is closed (0: no limit)."),
    _option("--grpc-use-ssl", on="serve, gateway", to="gateway", type=BOOLEAN, default=None,
            help="Serve gRPC over TLS with --grpc-server-cert and --grpc-server-key.  [default: false]"),
    _option("--grpc-use-ssl-mutual", on="serve, gateway", to="gateway", type=BOOLEAN, default=None,
            help="Serve gRPC over TLS and require every client's certificate to chain to --grpc-root-cert; "
                 "given at all (true or false), it turns TLS on, as in Triton.  [default: false]"),
    _option("--grpc-server-cert", on="serve, gateway", to="gateway", default=None, metavar="FILE",
            help="The server's PEM certificate (chain) for gRPC over TLS."),
    _option("--grpc-server-key", on="serve, gateway", to="gateway", default=None, metavar="FILE",
            help="The PEM private key of --grpc-server-cert."),
    _option("--grpc-root-cert", on="serve, gateway", to="gateway", default=None, metavar="FILE",
            help="PEM certificates that clients' certificates are checked against (gRPC over TLS)."),
    _option("--id", dest="server_id", on="serve, gateway", to="gateway", default="triton",
            help="Server name in /v2 metadata."),
    _option("--strict-readiness", on="serve, gateway", to="gateway", type=BOOLEAN, default="true",
            help="Ready only when every model is ready (false: once the models loaded at startup "
                 "have settled, ready or failed)."),
    _option("--allow-client-shm", on="serve, gateway", to="gateway", type=BOOLEAN, default="false",
            help="Let clients register system shared memory regions (they must share the gateway's host)."),
    _option("--max-inflight-requests", on="serve, gateway", to="gateway", default=0, type=click.IntRange(min=0),
            help="Inference requests one gateway keeps waiting on the broker before answering 503 (0: no limit)."),
    _option("--http-restricted-api", on="serve, gateway", to="gateway", multiple=True,
            help="API,...:KEY=VALUE: those HTTP calls need the header KEY: VALUE (repeatable)."),
    _option("--grpc-restricted-protocol", on="serve, gateway", to="gateway", multiple=True,
            help="PROTOCOL,...:KEY=VALUE: those gRPC calls need the metadata "
                 "triton-grpc-protocol-KEY: VALUE (repeatable)."),
    _option("--grpc-infer-response-compression-level", on="serve, gateway", to="gateway", default="none",
            type=click.Choice(["none", "low", "medium", "high"], case_sensitive=False),   # Triton lowercases it
            help="Compress gRPC inference responses for clients that accept it: low prefers gzip, medium and "
                 "high deflate (tritium's gRPC server)."),
    _option("--http-header-forward-pattern", on="serve, gateway", to="gateway", type=HEADER_PATTERN, default=None,
            help="HTTP headers of an inference request whose names match this regular expression (anywhere "
                 "in the name, case ignored) reach the model as request parameters."),
    _option("--grpc-header-forward-pattern", on="serve, gateway", to="gateway", type=HEADER_PATTERN, default=None,
            help="The same for the metadata of a gRPC inference call."),
    # -- metrics
    _option("--allow-metrics", on="serve, broker", to="broker", type=BOOLEAN, default="true",
            help="Serve Prometheus metrics."),
    _option("--metrics-address", on="serve, broker", to="broker", default="0.0.0.0",
            help="Address the metrics server binds."),
    _option("--metrics-port", on="serve, broker", to="broker", default=8002, type=int,
            help="Prometheus metrics port."),
    _option("--allow-cpu-metrics", on="serve, broker", to="broker", type=BOOLEAN, default="true",
            help="Export the hosts' CPU and memory figures (nv_cpu_*)."),
    _option("--allow-gpu-metrics", on="serve, broker", to="broker", type=BOOLEAN, default="true",
            help="Export the hosts' GPU figures (nv_gpu_*)."),
    _option("--metrics-config", on="serve, broker", to="broker", multiple=True,
            help="KEY=VALUE; tritium reads histogram_latencies, counter_latencies, summary_latencies and "
                 "summary_quantiles."),
    _option("--metrics-interval-ms", on="serve, worker", to="worker", default=2000, type=click.FloatRange(min=1),
            help="How often the host's CPU, memory and GPU figures are measured and reach the broker."),
    # -- the response cache
    _option("--cache-config", on="serve, broker", to="broker", multiple=True,
            help="local,size=BYTES: the response cache for models that enable it."),
    _option("--response-cache-byte-size", on="serve", default=None, type=click.IntRange(min=0),
            help="Deprecated Triton flag: the same as --cache-config=local,size=BYTES."),
    # -- logging (the broker hands the settings to every process; POST /v2/logging changes them)
    _option("--log-verbose", on=_ALL, to=_CHILDREN, default="0", help="Verbose logging level (0: off)."),
    _option("--log-info", on=_ALL, to=_CHILDREN, type=BOOLEAN, default="true", help="Log info-level lines."),
    _option("--log-warning", on=_ALL, to=_CHILDREN, type=BOOLEAN, default="true", help="Log warning-level lines."),
    _option("--log-error", on=_ALL, to=_CHILDREN, type=BOOLEAN, default="true", help="Log error-level lines."),
    _option("--log-format", on=_ALL, to=_CHILDREN, type=click.Choice(["default", "ISO8601"]), default="default",
            help="Timestamp layout of log lines."),
    _option("--log-file", on=_ALL, to=_CHILDREN, default=None,
            help="Append log lines to this file instead of writing them to standard error (every process "
                 "of this command writes its own lines to it)."),
    # -- tracing (Triton's trace extension; serve hands its gateways the settings it read)
    _option("--trace-config", on="serve, gateway", multiple=True,
            help="[MODE,]KEY=VALUE: Triton's trace settings (docs/observability.md)."),
    _option("--trace-file", on="serve, gateway", default=None, help="Deprecated: --trace-config triton,file=PATH."),
    _option("--trace-level", on="serve, gateway", multiple=True, help="Deprecated: --trace-config level=LEVEL."),
    _option("--trace-rate", on="serve, gateway", default=None, help="Deprecated: --trace-config rate=N."),
    _option("--trace-count", on="serve, gateway", default=None, help="Deprecated: --trace-config count=N."),
    _option("--trace-log-frequency", on="serve, gateway", default=None,
            help="Deprecated: --trace-config triton,log-frequency=N."),
    # -- lifecycle
    _option("--exit-timeout-secs", on=_ALL, to=_CHILDREN, default=30, type=int,
            help="On SIGTERM: how long queued and running requests may take to finish."),
    _option("--exit-on-error", on="serve", type=BOOLEAN, default="true",
            help="Exit when a model fails to load at startup."),
    _option("--heartbeat-interval-secs", on=_ALL, to=_CHILDREN, default=1.0, type=click.FloatRange(min=0.05),
            help="Seconds between heartbeats to and from the broker; a peer silent for 3 intervals is dropped."),
    # -- CPU placement (docs/deploy.md, "Pinning processes to CPUs")
    _option("--gateway-cpus", on="serve, gateway", to="gateway", type=CPU_LIST, default=None,
            help="CPUs the gateway processes run on, as taskset lists them (e.g. 0-1,4); default: any."),
    _option("--broker-cpus", on="serve, broker", to="broker", type=CPU_LIST, default=None,
            help="CPUs the broker runs on; default: any."),
    _option("--worker-cpus", on="serve, worker", to="worker", type=CPU_LIST, default=None,
            help="CPUs the host agent and the instances it starts run on; default: any."),
    _option("--cpu-layout", on="serve", type=click.Choice(["any", "split"]), default="any",
            help="split: the gateway processes on CPUs of their own (the first this process may use, as many as "
                 "there are gateways, shared by them), the broker on the others, the instances on any, and each "
                 "gateway sending the requests it reads to the broker as they come, a few at a time (--worker-cpus "
                 "may still confine the instances). any: every part on any CPU, unless --gateway-cpus, "
                 "--broker-cpus or --worker-cpus say otherwise."),
    _option("--gateway-send-every", on="serve, gateway", to="gateway", type=click.IntRange(min=0), default=None,
            help="Send the requests a gateway reads in one event-loop turn to the broker this many at a time, "
                 "rather than all at the turn's end (0). Default: "
                 f"{SEND_EVERY_WHEN_APART} where serve runs the gateways on CPUs apart from the broker's "
                 "(--cpu-layout split, or --gateway-cpus sharing no CPU with --broker-cpus, nor with "
                 "--worker-cpus if given) and no CPU quota smaller than those CPUs applies, else 0."),
    # -- waiting without sleeping (docs/deploy.md, "Polling before sleeping")
    _option("--broker-spin-us", on="serve, broker", to="broker", type=click.IntRange(min=0), default=None,
            help="Microseconds the broker polls before it sleeps while requests come one at a time, for the "
                 "answer of the one running and after it for the next (yielding the CPU, stopping when another "
                 f"thread takes it); 0: sleep at once. Default: {BROKER_SPIN_US}, or 0 under a CPU quota "
                 "(a container's CPU limit, where polling would spend it)."),
    _option("--gateway-spin-us", on="serve, gateway", to="gateway", type=click.IntRange(min=0), default=None,
            help="Microseconds a gateway polls before it sleeps while requests come one at a time, for the "
                 "broker's answer and after it for the client's next request (yielding the CPU, stopping when "
                 f"another thread takes it); 0: sleep at once. Default: {GATEWAY_SPIN_US}, or 0 under a CPU "
                 "quota (a container's CPU limit, where polling would spend it)."),
    _option("--gateway-batched-sends", on="serve, gateway", to="gateway", type=BOOLEAN, default="true",
            help="Send what a gateway writes to its connections in one event-loop turn (a batch's answers) in one "
                 "system call, through Linux's io_uring; false: one write per connection. Where the kernel offers "
                 "no io_uring (before Linux 5.6, or a container's seccomp profile blocking it) a gateway writes "
                 "one at a time either way."),
    # -- large tensors (docs/deploy.md, "Large tensors: the shared pool")
    _option("--tensor-pool-mb", on="serve, gateway, worker", to="gateway, worker",
            type=click.IntRange(min=0, max=1 << 20), default=256,
            help="Shared memory each gateway writes large input tensors into, for the instances on its host to "
                 "read, and each instance its large outputs, for the gateways (the broker passes references, "
                 "not the bytes): the most one holds at once, in MiB; its pages stay allocated once used. "
                 "0: large tensors cross the local sockets as bytes."),
    # -- CURVE (docs/security.md)
    _option("--curve-secret-key", on="broker, gateway, worker", default=None,
            help="This process's CURVE secret key file (NAME.key_secret); see docs/security.md."),
    _option("--curve-authorized-keys", on="broker", default=None,
            help="Folder of the CURVE public keys (NAME.key) of every gateway and worker let in; "
                 "read again when it changes."),
    _option("--curve-server-key", on="gateway, worker", default=None,
            help="The broker's CURVE public key file (NAME.key)."),
)


def options_of(command: str) -> Callable:
    """The decorator that gives a command its rows of the table, in table order."""
    def decorate(function):
        for option in reversed(OPTIONS):
            if command in option.on:
                function = option.click_option()(function)
        return function
    return decorate


def child_args(params: Mapping[str, Any], child: str) -> tuple[str, ...]:
    """The flags ``serve`` gives ``child``: every option the table sends it, as ``serve`` got it."""
    args: list[str] = []
    for option in OPTIONS:
        if child not in option.to:
            continue
        value, flag = params.get(option.key), option.names[0]
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
