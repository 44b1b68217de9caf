"""A Google Cloud Storage server on loopback for the tests (an emulator of its JSON API), with a
bucket, reached as Triton's client reaches one: through ``CLOUD_STORAGE_EMULATOR_ENDPOINT``.

The emulator answers listings (with folders), generations and errors as the service does, so
the repository code is tested over real HTTP with google-cloud-storage, as it reaches a bucket
in production.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class GcsServer:
    endpoint: str      # "http://127.0.0.1:PORT"
    client: object     # a google-cloud-storage client for the tests' own uploads and deletions
    _server: object

    @property
    def environment(self) -> dict[str, str]:
        """What a process needs to read this server's buckets."""
        return {"CLOUD_STORAGE_EMULATOR_ENDPOINT": self.endpoint}

    def location(self, bucket: str, path: str = "") -> str:
        return f"gs://{bucket}" + (f"/{path}" if path else "")

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.bucket(bucket).blob(key).upload_from_string(body.encode() if isinstance(body, str) else body)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        for blob in list(self.client.list_blobs(bucket, prefix=prefix)):
            blob.delete()

    def stop(self) -> None:
        """The server goes away (its port refuses connections)."""
        self._server.stop()
        self._server._api._httpd.server_close()


@contextmanager
def gcs_server(*buckets: str) -> Iterator[GcsServer]:
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)   # one line per request otherwise
    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    try:
        endpoint = "http://127.0.0.1:%d" % server._api._httpd.server_address[1]
        client = storage.Client(project="tritium-tests", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": endpoint})
        for bucket in buckets:
            client.create_bucket(bucket)
        yield GcsServer(endpoint, client, server)
    finally:
        try:
            server.stop()
        except Exception:  # stopped by the test already
            pass
