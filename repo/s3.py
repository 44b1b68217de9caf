"""Model repositories in S3 (``s3://bucket/path``): the location, the bucket and the
credentials; repo/cloud_mirror.py keeps the copy on this host that the repository is read from.

Locations are parsed as Triton parses them: ``s3://bucket/path``, or, for an S3-compatible
server that is not AWS, ``s3://host:port/bucket/path`` with an optional ``http://`` or
``https://`` before the host (http by default). Credentials come from where boto3 (and
Triton) look: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, then the instance's role; or, as in Triton, from the
file ``TRITON_CLOUD_CREDENTIAL_PATH`` names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO

from tritium.repo.cloud_mirror import Bucket, StorageError, client_errors, named_credential

SCHEME = "s3://"
# Triton's pattern for a location that names its server (s3.h); bucket names as S3 allows them.
_WITH_ENDPOINT = re.compile(r"(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)(((/[0-9a-zA-Z.\-_]+)*)?)")
# Where the mirrors are kept: Triton's variable for where it copies S3 models to.
MOUNT_DIRECTORY_VARIABLE = "TRITON_AWS_MOUNT_DIRECTORY"


@dataclass(frozen=True)
class S3Location:
    url: str               # as given
    bucket: str
    prefix: str            # the repository's key prefix: "" or "path/to/repo/"
    endpoint: str | None   # "http://host:port" for a server that is not AWS


def parse_location(url: str) -> S3Location:
    """``s3://[http(s)://host:port/]bucket[/path]``, extra slashes ignored (as Triton's CleanPath)."""
    rest = url[len(SCHEME):]
    scheme = next((s for s in ("https://", "http://") if rest.startswith(s)), "")
    rest = re.sub(r"/+", "/", rest[len(scheme):]).strip("/")
    if not rest:
        raise StorageError(f"Invalid bucket name: '{url}'")
    matched = _WITH_ENDPOINT.fullmatch(rest)
    if matched is not None:
        host, port, bucket, path = matched.group(2), matched.group(3), matched.group(4), matched.group(5)
        endpoint: str | None = f"{scheme or 'http://'}{host}:{port}"
    elif scheme or ":" in rest.partition("/")[0]:   # not AWS's bucket 'minio.example.com', silently
        raise StorageError(f"'{url}': a server's location is s3://[http(s)://]host:port/bucket[/path], "
                           "the bucket's name in lowercase letters, digits, dots and hyphens")
    else:
        bucket, _, path = rest.partition("/")
        endpoint = None
    path = path.strip("/")
    return S3Location(url, bucket, f"{path}/" if path else "", endpoint)


class S3Bucket(Bucket[S3Location]):
    """A repository's bucket in S3 (or a server that speaks its protocol), read with boto3."""

    scheme = "s3"
    mount_variable = MOUNT_DIRECTORY_VARIABLE
    store, client_module, client_package, extra = "S3", "boto3", "boto3", "s3"

    def make_client(self):
        return make_client(self.location)

    def identity(self) -> str:
        return f"{self.location.endpoint}|{self.location.bucket}|{self.prefix}"

    def objects(self, prefix: str) -> dict[str, str]:
        return {item["Key"]: item["ETag"] for page in self._pages(prefix) for item in page.get("Contents", ())}

    def folders(self, prefix: str) -> set[str]:
        return {entry["Prefix"] for page in self._pages(prefix, Delimiter="/") for entry in page.get("CommonPrefixes", ())}

    def download(self, key: str, out: BinaryIO) -> None:
        from botocore.exceptions import BotoCoreError

        with client_errors(f"cannot download {self.url_of(key)}", writing=True, connection=(BotoCoreError,)):
            self.client.download_fileobj(self.location.bucket, key, out)

    def url_of(self, key: str) -> str:
        server = f"{self.location.endpoint.split('://', 1)[1]}/" if self.location.endpoint else ""
        return f"s3://{server}{self.location.bucket}/{key}"

    def _pages(self, prefix: str, **listing) -> list[dict]:
        """Every page of the bucket's listing under ``prefix``; StorageError when it cannot be listed."""
        with client_errors(f"cannot list {self.url_of(prefix)}"):
            return list(self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix, **listing))


def make_client(location: S3Location):
    """A boto3 S3 client for the location; path-style addressing, as Triton's client uses."""
    import boto3
    from botocore.config import Config

    credential = credential_for(location)
    session = boto3.Session(profile_name=credential.profile) if credential.profile and not credential.keys else boto3
    return session.client("s3", endpoint_url=location.endpoint, config=Config(s3={"addressing_style": "path"}),
                          **credential.client_arguments())


@dataclass(frozen=True)
class S3Credential:
    """One credential of Triton's credentials file; all empty: boto3's own chain (AWS's
    variables, profile, then the host's role)."""

    key_id: str = ""
    secret_key: str = ""
    session_token: str = ""
    region: str = ""
    profile: str = ""

    @property
    def keys(self) -> bool:
        return bool(self.key_id and self.secret_key)

    def client_arguments(self) -> dict[str, str]:
        if not self.keys:
            return {}
        arguments = {"aws_access_key_id": self.key_id, "aws_secret_access_key": self.secret_key}
        if self.session_token:
            arguments["aws_session_token"] = self.session_token
        if self.region:
            arguments["region_name"] = self.region
        return arguments


def credential_for(location: S3Location) -> S3Credential:
    """From the file ``TRITON_CLOUD_CREDENTIAL_PATH`` names, as Triton reads it: under ``"s3"``,
    the credential whose name is the longest prefix of the location; without the variable,
    boto3's own chain."""
    fields = named_credential("s3", location.url, dict, "a JSON object")
    if fields is None:
        return S3Credential()
    return S3Credential(**{key: str(fields.get(key, "")) for key in
                           ("key_id", "secret_key", "session_token", "region", "profile")})
