"""Listening ports: binding them, and telling a port taken by another program from one this
deployment's gateways share.

Gateways of one deployment share their HTTP and gRPC ports with SO_REUSEPORT (the kernel
spreads connections over them), but only when asked (``--reuse-port``): without it, a port
in use by anything else stops startup with Triton's one line, instead of the kernel
quietly splitting connections between two unrelated servers.
"""

from __future__ import annotations

import errno
import socket


class PortInUse(Exception):
    """A service's port is taken; its text is Triton's startup error line."""

    def __init__(self, service: str, address: str, port: int, reason: str = "already in use") -> None:
        super().__init__(f"failed to start {service} service: Unavailable - Socket '{address}:{port}' {reason}")

    @classmethod
    def from_error(cls, service: str, address: str, port: int, exc: OSError) -> "PortInUse":
        return cls(service, address, port,
                   "already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror}")


def bound_socket(service: str, address: str, port: int, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``address:port`` (not yet listening); PortInUse if it cannot be."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT only: never a live listener
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise PortInUse.from_error(service, address, port, exc) from None
    return sock


def check_free(service: str, address: str, port: int, reuse_port: bool = False) -> None:
    """PortInUse unless ``address:port`` could be bound now (with SO_REUSEPORT if ``reuse_port``)."""
    bound_socket(service, address, port, reuse_port).close()
