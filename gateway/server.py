"""The gateway process: uvloop, a broker link, the data plane, the HTTP and gRPC servers.

Several gateway processes of one deployment can serve the same port (``reuse_http_port``, ``reuse_grpc_port``):
each binds its own listening socket with SO_REUSEPORT and the kernel spreads connections
over them. Without it a port in use stops startup (tritium/ports.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass

import uvloop

from tritium.gateway.broker_link import BrokerLink, BrokerRefused
from tritium.gateway.dataplane import DataPlane, ServerIdentity
from tritium.gateway.header_forwarding import compile_pattern
from tritium.gateway.grpc_api import MAX_MESSAGE_BYTES, GrpcInferenceService, bind_grpc
from tritium.gateway.grpc_keepalive import GrpcKeepalive
from tritium.gateway.grpc_server import bind_grpc_tritium
from tritium.gateway.grpc_tls import GrpcTls
from tritium.gateway.http_api import HttpApp
from tritium.gateway.http_server import HttpSettings, HttpServer
from tritium.gateway.restricted import RestrictedApis
from tritium.gateway.send_ring import SendRing
from tritium.gateway.tracing import GatewayTracer
from tritium.gateway.turn_sends import TurnSends
from tritium import notify
from tritium.gctune import tune_for_serving
from tritium.exit_codes import ExitCode
from tritium.ports import PortInUse, bound_socket
from tritium.protocol import DEFAULT_HEARTBEAT_INTERVAL_S
from tritium.security import CurveKeys
from tritium.shared_pool import DEFAULT_POOL_BYTES
from tritium.tracing.settings import TraceSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewaySettings:
    broker: str
    http_address: str = "0.0.0.0"
    http_port: int | None = 8000          # None: no HTTP front end (Triton's --allow-http=false)
    grpc_address: str = "0.0.0.0"
    grpc_port: int | None = 8001          # None: no gRPC front end (Triton's --allow-grpc=false)
    grpc_max_message_bytes: int = MAX_MESSAGE_BYTES
    max_input_bytes: int = 64 * 1024 * 1024
    exit_timeout_s: float = 30.0
    server_id: str = "triton"
    strict_readiness: bool = True
    allow_client_shm: bool = False
    broker_timeout_s: float | None = None   # how long to wait for the broker's first model table
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    max_inflight_requests: int = 0          # inference requests waiting on the broker; 0: unbounded
    curve: CurveKeys | None = None          # None: no CURVE on the broker link
    http_restricted: RestrictedApis = RestrictedApis()   # Triton's --http-restricted-api
    grpc_restricted: RestrictedApis = RestrictedApis()   # Triton's --grpc-restricted-protocol
    reuse_http_port: bool = False   # share the port with this deployment's other gateways or servers (SO_REUSEPORT)
    reuse_grpc_port: bool = False
    grpc_server: str = "tritium"   # the gRPC transport: "tritium" (gateway/grpc_server.py) or "grpcio"
    grpc_keepalive: GrpcKeepalive = GrpcKeepalive()   # Triton's --grpc-keepalive-* and --grpc-max-connection-age*
    trace: TraceSettings = TraceSettings()   # Triton's --trace-config, seeding the broker's copy
    http_header_forward_pattern: str | None = None   # Triton's: matching headers become request parameters
    grpc_header_forward_pattern: str | None = None   # the same for gRPC metadata
    grpc_compression_level: str = "none"   # Triton's --grpc-infer-response-compression-level
    grpc_tls: GrpcTls | None = None        # Triton's --grpc-use-ssl and its files (None: plain HTTP/2)
    spin_s: float = 0.0   # --gateway-spin-us: how long to poll for answers before sleeping
    batched_sends: bool = True   # --gateway-batched-sends: a turn's writes in one system call (io_uring)
    send_every: int = 0   # --gateway-send-every: a turn's requests go to the broker every this many (0: at its end)
    tensor_pool_bytes: int = DEFAULT_POOL_BYTES   # --tensor-pool-mb: the shared pool for large tensors (0: none)


def listening_socket(address: str, port: int, reuse_port: bool = False) -> socket.socket:
    sock = bound_socket("HTTP", address, port, reuse_port)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(settings: GatewaySettings) -> int:
    """Serve until a stop signal, then drain: readiness false at once, accepted requests
    finished within ``--exit-timeout-secs`` (HTTP, then gRPC); a second signal exits at once.
    The exit code: PROTOCOL_MISMATCH when a broker refused this gateway (BrokerRefused at startup)."""
    loop = asyncio.get_running_loop()
    link = BrokerLink(settings.broker, heartbeat_interval_s=settings.heartbeat_interval_s, curve=settings.curve,
                      spin_s=settings.spin_s, pool_bytes=settings.tensor_pool_bytes, send_every=settings.send_every)
    dataplane = DataPlane(link, ServerIdentity(name=settings.server_id),
                          strict_readiness=settings.strict_readiness, allow_client_shm=settings.allow_client_shm,
                          max_inflight_requests=settings.max_inflight_requests)
    ring = SendRing.open() if settings.batched_sends else None
    if ring is not None:
        log.info("gateway sends each event-loop turn's answers in one system call (io_uring)")
    sends = TurnSends(loop, ring, more_coming=lambda: link.waiting > 0)
    http_forward = compile_pattern(settings.http_header_forward_pattern)
    app = HttpApp(dataplane, max_body_bytes=settings.max_input_bytes,
                  restricted=settings.http_restricted, header_forward=http_forward)
    sock = listening_socket(settings.http_address, settings.http_port, settings.reuse_http_port) \
        if settings.http_port is not None else None
    grpc_server = None
    if settings.grpc_port is not None:   # bound now: a taken port stops startup before the broker is waited for
        service = GrpcInferenceService(dataplane, settings.grpc_restricted,
                                       compile_pattern(settings.grpc_header_forward_pattern))
        where = (settings.grpc_address, settings.grpc_port, settings.grpc_max_message_bytes, settings.reuse_grpc_port,
                 settings.grpc_keepalive, settings.grpc_tls)
        if settings.grpc_server == "grpcio":
            if settings.grpc_compression_level != "none":
                log.warning("--grpc-infer-response-compression-level applies to tritium's gRPC server only, "
                            "not to --grpc-server=grpcio: responses go out uncompressed")
            grpc_server, grpc_port = bind_grpc(service, *where)
        else:
            grpc_server, grpc_port = bind_grpc_tritium(service, *where, settings.grpc_compression_level, sends=sends)
    http = HttpServer(app, HttpSettings(max_body_bytes=settings.max_input_bytes,
                                        keep_header_lines=http_forward is not None), sends)
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second stop signal: exiting without waiting for requests in flight")
            os._exit(ExitCode.FORCED)
        log.info("stopping: readiness is now false; finishing %d accepted request(s)", link.waiting)
        dataplane.shutting_down = True
        notify.stopping()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    exit_code = ExitCode.OK

    def on_refused(_) -> None:   # a broker of another protocol version took over: stop as at startup
        nonlocal exit_code
        exit_code = ExitCode.PROTOCOL_MISMATCH
        if not stop.is_set():
            on_signal()

    link.refused.add_done_callback(on_refused)
    log.info("gateway waiting for the broker at %s", settings.broker)
    await link.start(settings.broker_timeout_s)
    tracer = GatewayTracer(link, settings.trace)
    dataplane.tracer = tracer
    await tracer.start()
    tune_for_serving()
    if grpc_server is not None:
        await grpc_server.start()
        tls = settings.grpc_tls
        log.info("gateway serving gRPC on %s:%d%s", settings.grpc_address, grpc_port,
                 "" if tls is None else " over TLS, client certificates required" if tls.mutual else " over TLS")
    served = [f"grpc={settings.grpc_address}:{grpc_port}"] if grpc_server is not None else []
    if sock is not None:
        await http.start(sock)
        port = sock.getsockname()[1]
        served.insert(0, f"http={settings.http_address}:{port}")
        log.info("gateway serving HTTP on %s:%d", settings.http_address, port)
    notify.ready(f"gateway {' '.join(served)}")
    watchdog = asyncio.ensure_future(_tick_watchdog(stop))
    await stop.wait()
    try:
        grpc_stopping = grpc_server.stop(settings.exit_timeout_s) if grpc_server is not None else None
        if sock is not None:
            await http.drain(settings.exit_timeout_s)
        if grpc_stopping is not None:
            await grpc_stopping
    finally:
        tracer.close()
        link.close()
        sends.close()
        watchdog.cancel()
        log.info("gateway stopped")
    return exit_code


async def _tick_watchdog(stop: asyncio.Event) -> None:
    """WATCHDOG=1 while the event loop turns."""
    watchdog = notify.Watchdog.from_environment()
    while not stop.is_set():
        watchdog.tick()
        await asyncio.sleep(0.25)


def run(settings: GatewaySettings) -> None:
    try:
        code = uvloop.run(serve(settings))
    except PortInUse as exc:   # one line, as Triton says it, and the status systemd restarts after
        log.error("%s", exc)
        sys.exit(ExitCode.ERROR)
    except BrokerRefused:   # the link has said why
        sys.exit(ExitCode.PROTOCOL_MISMATCH)
    sys.exit(code)
