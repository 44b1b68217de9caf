"""The gateway process: uvloop, a broker link, the data plane and uvicorn serving HTTP.

Several gateway processes can serve the same port: each binds its own listening
socket with SO_REUSEPORT and the kernel spreads connections over them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from dataclasses import dataclass

import uvicorn
import uvloop

from gateway.broker_link import BrokerLink
from gateway.dataplane import DataPlane, ServerIdentity
from gateway.grpc_api import MAX_MESSAGE_BYTES, start_grpc
from gateway.http_api import HttpApp
from gateway.http_protocol import GatewayHttpProtocol
from gateway.restricted import RestrictedApis
from tritium import notify
from tritium.gctune import tune_for_serving
from tritium.protocol import DEFAULT_HEARTBEAT_INTERVAL_S, ExitCode
from tritium.security import CurveKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewaySettings:
    broker: str
    http_address: str = "0.0.0.0"
    http_port: int = 8000
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


def listening_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class GatewayHttpServer(uvicorn.Server):
    """uvicorn's server, with what a stop signal means for a gateway.

    The first signal turns readiness false at once (load balancers stop sending), stops
    the gRPC server from taking new calls, and lets uvicorn finish the requests it
    accepted, within ``--exit-timeout-secs``; a second signal exits at once.
    """

    def __init__(self, config: uvicorn.Config, on_stop) -> None:
        super().__init__(config)
        self._on_stop = on_stop
        self._stop_signals = 0

    def handle_exit(self, sig, frame) -> None:
        self._stop_signals += 1
        if self._stop_signals > 1:
            log.warning("second stop signal: exiting without waiting for requests in flight")
            os._exit(ExitCode.FORCED)
        asyncio.get_event_loop().call_soon_threadsafe(self._on_stop)
        super().handle_exit(sig, frame)


async def serve(settings: GatewaySettings) -> None:
    link = BrokerLink(settings.broker, heartbeat_interval_s=settings.heartbeat_interval_s, curve=settings.curve)
    dataplane = DataPlane(link, ServerIdentity(name=settings.server_id),
                          strict_readiness=settings.strict_readiness, allow_client_shm=settings.allow_client_shm,
                          max_inflight_requests=settings.max_inflight_requests)
    app = HttpApp(dataplane, max_body_bytes=settings.max_input_bytes + 1024 * 1024,
                  restricted=settings.http_restricted)
    sock = listening_socket(settings.http_address, settings.http_port)
    config = uvicorn.Config(app, http=GatewayHttpProtocol, loop="none", lifespan="off", access_log=False,
                            log_config=None, timeout_graceful_shutdown=int(settings.exit_timeout_s),
                            timeout_keep_alive=75, proxy_headers=False, server_header=False,
                            date_header=False)
    grpc_server = None
    grpc_stopping = []

    def on_stop() -> None:
        log.info("stopping: readiness is now false; finishing %d accepted request(s)", link.waiting)
        dataplane.shutting_down = True
        if grpc_server is not None:
            grpc_stopping.append(asyncio.ensure_future(grpc_server.stop(settings.exit_timeout_s)))

    server = GatewayHttpServer(config, on_stop)
    log.info("gateway waiting for the broker at %s", settings.broker)
    await link.start(settings.broker_timeout_s)
    tune_for_serving()
    if settings.grpc_port is not None:
        grpc_server, grpc_port = await start_grpc(dataplane, settings.grpc_address, settings.grpc_port,
                                                   settings.grpc_max_message_bytes, settings.grpc_restricted)
        log.info("gateway serving gRPC on %s:%d", settings.grpc_address, grpc_port)
    # uvicorn re-raises the stop signal once it has drained; absorb it, so the exit code says "clean".
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    reporting = asyncio.ensure_future(_report_to_systemd(server, serving))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        port = sock.getsockname()[1]
        notify.ready(f"gateway http={settings.http_address}:{port}")
        log.info("gateway serving HTTP on %s:%d", settings.http_address, port)
    try:
        await serving
        # uvicorn has put back the handlers absorbing its re-raised signal: a stop signal
        # during the gRPC drain now cuts the drain short.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: os._exit(ExitCode.FORCED))
    finally:
        dataplane.shutting_down = True
        if grpc_server is not None:
            await (grpc_stopping[0] if grpc_stopping else grpc_server.stop(settings.exit_timeout_s))
        link.close()
        log.info("gateway stopped")
        await reporting


async def _report_to_systemd(server: uvicorn.Server, serving: asyncio.Future) -> None:
    """WATCHDOG=1 while the event loop turns; STOPPING=1 as soon as uvicorn begins its drain."""
    watchdog = notify.Watchdog.from_environment()
    while not server.should_exit and not serving.done():
        watchdog.tick()
        await asyncio.sleep(0.25)
    notify.stopping()


def run(settings: GatewaySettings) -> None:
    uvloop.run(serve(settings))
