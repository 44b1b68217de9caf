"""An Azure Storage server on loopback for the tests (Azurite, Microsoft's emulator of the blob
service), with a container and the account's well-known key.

Azurite is a Node.js program: the tests look for ``azurite-blob`` where ``TRITIUM_AZURITE``
says, in the checkout's ``.azurite/`` (where CI installs it: ``npm install --prefix .azurite
azurite@3.35.0``), then on PATH, and are skipped without it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import IO
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ACCOUNT = "devstoreaccount1"   # Azurite's account and its published key
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite() -> str | None:
    local = Path(__file__).resolve().parents[1] / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
    for candidate in (os.environ.get("TRITIUM_AZURITE"), str(local), shutil.which("azurite-blob")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@dataclass
class AzureServer:
    endpoint: str      # "http://127.0.0.1:PORT/devstoreaccount1"
    client: object     # a BlobServiceClient for the tests' own uploads and deletions
    process: subprocess.Popen

    @property
    def environment(self) -> dict[str, str]:
        """What a process needs to read this server's containers."""
        return {"TRITIUM_AZURE_BLOB_ENDPOINT": self.endpoint, "AZURE_STORAGE_ACCOUNT": ACCOUNT,
                "AZURE_STORAGE_KEY": KEY}

    def location(self, container: str, path: str = "") -> str:
        return f"as://{ACCOUNT}/{container}" + (f"/{path}" if path else "")

    def put(self, container: str, key: str, body: bytes | str) -> None:
        self.client.get_container_client(container).upload_blob(key, body, overwrite=True)

    def delete_prefix(self, container: str, prefix: str) -> None:
        blobs = self.client.get_container_client(container)
        for blob in list(blobs.list_blobs(name_starts_with=prefix)):
            blobs.delete_blob(blob.name)

    def stop(self) -> None:
        """The server goes away (its port refuses connections)."""
        self.process.terminate()
        self.process.wait(timeout=10)


@contextmanager
def azure_server(*containers: str) -> Iterator[AzureServer]:
    from azure.storage.blob import BlobServiceClient

    from tests.servers import free_port

    program = azurite()
    if program is None:
        pytest.skip("Azurite is not installed (npm install --prefix .azurite azurite@3.35.0)")
    port = free_port()
    output = tempfile.TemporaryFile()   # what it says, shown if it does not start
    process = subprocess.Popen([program, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                                "--skipApiVersionCheck", "--silent"],
                               stdout=output, stderr=subprocess.STDOUT)
    try:
        endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
        client = BlobServiceClient(endpoint, credential={"account_name": ACCOUNT, "account_key": KEY})
        _wait_until_it_listens(port, process, output)
        for container in containers:
            client.create_container(container)
        yield AzureServer(endpoint, client, process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output.close()


def _wait_until_it_listens(port: int, process: subprocess.Popen, output: IO[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            exited = process.poll()
            if exited is not None or time.monotonic() > deadline:
                output.seek(0)
                said = output.read()[-2000:].decode(errors="replace").strip() or "nothing"
                why = f"exited with status {exited}" if exited is not None else f"did not listen within {timeout_s:.0f} s"
                raise RuntimeError(f"Azurite (installed: {process.args[0]}) {why}; it said: {said}") from None
            time.sleep(0.05)
