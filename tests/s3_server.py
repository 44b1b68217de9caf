"""An S3 server on loopback for the tests (moto's), with a bucket and the credentials to reach it.

moto answers the S3 protocol as AWS does (listing, ETags, errors), so the repository code is
tested over real HTTP with boto3, as it reaches a bucket in production.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "tritium-tests", "AWS_SECRET_ACCESS_KEY": "tritium-tests",
               "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3Server:
    host_port: str     # "127.0.0.1:PORT"
    client: object     # a boto3 S3 client for the tests' own uploads and deletions
    stop: Callable[[], None]   # the server goes away (its port refuses connections)

    def location(self, bucket: str, path: str = "") -> str:
        """The repository location as a Triton user writes it for a server that is not AWS."""
        return f"s3://{self.host_port}/{bucket}" + (f"/{path}" if path else "")

    def upload_folder(self, folder: Path, bucket: str, prefix: str) -> None:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                self.put(bucket, f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes())

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", ())
        for item in listed:
            self.client.delete_object(Bucket=bucket, Key=item["Key"])


@contextmanager
def s3_server(*buckets: str) -> Iterator[S3Server]:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)   # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield S3Server(f"{host}:{port}", client, server.stop)
    finally:
        try:
            server.stop()
        except Exception:  # stopped by the test already
            pass
