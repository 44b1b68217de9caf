"""The gateway process: uvloop, a broker link, the data plane and uvicorn serving HTTP.

Several gateway processes can serve the same port: each binds its own listening
socket with SO_REUSEPORT and the kernel spreads connections over them.
"""

from __future__ import annotations

import asyncio
import logging
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
from tritium import notify
from tritium.gctune import tune_for_serving

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


def listening_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((address, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(settings: GatewaySettings) -> None:
    link = BrokerLink(settings.broker)
    dataplane = DataPlane(link, ServerIdentity(name=settings.server_id),
                          strict_readiness=settings.strict_readiness, allow_client_shm=settings.allow_client_shm)
    app = HttpApp(dataplane, max_body_bytes=settings.max_input_bytes + 1024 * 1024)
    sock = listening_socket(settings.http_address, settings.http_port)
    config = uvicorn.Config(app, http=GatewayHttpProtocol, loop="none", lifespan="off", access_log=False,
                            log_config=None, timeout_graceful_shutdown=int(settings.exit_timeout_s),
                            timeout_keep_alive=75, proxy_headers=False, server_header=False,
                            date_header=False)
    server = uvicorn.Server(config)
    log.info("gateway waiting for the broker at %s", settings.broker)
    await link.start(settings.broker_timeout_s)
    tune_for_serving()
    grpc_server = None
    if settings.grpc_port is not None:
        grpc_server, grpc_port = await start_grpc(dataplane, settings.grpc_address, settings.grpc_port,
                                                   settings.grpc_max_message_bytes)
        log.info("gateway serving gRPC on %s:%d", settings.grpc_address, grpc_port)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal after its drain: land it here
        signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
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
    finally:
        dataplane.shutting_down = True
        if grpc_server is not None:
            await grpc_server.stop(settings.exit_timeout_s)
        link.close()
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
