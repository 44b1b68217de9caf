"""Readiness notification in systemd's ``sd_notify`` protocol, without a dependency.

systemd (``Type=notify``) and ``tritium serve`` both give their children a
``NOTIFY_SOCKET``; a process sends ``READY=1`` when it can really do its job.
"""

from __future__ import annotations

import os
import socket


def send(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def ready(status: str = "") -> bool:
    return send("READY=1\n" + (f"STATUS={status}\n" if status else "") + f"MAINPID={os.getpid()}\n")


def stopping() -> bool:
    return send("STOPPING=1\n")
