"""Model repositories in S3 (``s3://bucket/path``), read through a local mirror.

Everything that reads a repository reads folders, so an S3 repository is copied into a folder
of this host and kept in step with the bucket: ``S3Mirror.sync`` lists the objects under the
repository's prefix (or under one model's), downloads those whose ETag changed and removes
the files whose objects are gone. A download lands in a temporary file that then replaces the
old one, so a reader sees either file whole, and the poll's fingerprints (mtime, size) see the
change. The processes of one host (the broker and the worker agent of ``tritium serve``)
share a mirror: it is named after the location, and a lock file keeps two syncs apart.

Locations are parsed as Triton parses them: ``s3://bucket/path``, or, for an S3-compatible
server that is not AWS, ``s3://host:port/bucket/path`` with an optional ``http://`` or
``https://`` before the host (http by default). Credentials come from where boto3 (and
Triton) look: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, then the instance's role.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCHEME = "s3://"
# Triton's pattern for a location that names its server (s3.h); bucket names as S3 allows them.
_WITH_ENDPOINT = re.compile(r"(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)(((/[0-9a-zA-Z.\-_]+)*)?)")
# Where the mirrors are kept: Triton's variable for where it copies S3 models to.
MOUNT_DIRECTORY_VARIABLE = "TRITON_AWS_MOUNT_DIRECTORY"
_MANIFEST = "manifest.json"
_BYTECODE_CACHE = "__pycache__"


class S3Error(Exception):
    """The repository cannot be read from S3 (a bad location, no access, the server down)."""


def is_s3(location: str | Path) -> bool:
    return str(location).startswith(SCHEME)


@dataclass(frozen=True)
class S3Location:
    url: str               # as given
    bucket: str
    prefix: str            # the repository's key prefix: "" or "path/to/repo/"
    endpoint: str | None   # "http://host:port" for a server that is not AWS

    def key_prefix(self, model: str | None = None) -> str:
        return self.prefix if model is None else f"{self.prefix}{model}/"


def parse_location(url: str) -> S3Location:
    """``s3://[http(s)://host:port/]bucket[/path]``, extra slashes ignored (as Triton's CleanPath)."""
    rest = url[len(SCHEME):]
    scheme = next((s for s in ("https://", "http://") if rest.startswith(s)), "")
    rest = re.sub(r"/+", "/", rest[len(scheme):]).strip("/")
    if not rest:
        raise S3Error(f"Invalid bucket name: '{url}'")
    matched = _WITH_ENDPOINT.fullmatch(rest)
    if matched is not None:
        host, port, bucket, path = matched.group(2), matched.group(3), matched.group(4), matched.group(5)
        endpoint: str | None = f"{scheme or 'http://'}{host}:{port}"
    else:
        bucket, _, path = rest.partition("/")
        endpoint = None
    path = path.strip("/")
    return S3Location(url, bucket, f"{path}/" if path else "", endpoint)


def mirror_folder(location: S3Location) -> Path:
    """The folder this host keeps the location's mirror in (the same for each process)."""
    base = os.environ.get(MOUNT_DIRECTORY_VARIABLE) or tempfile.gettempdir()
    digest = hashlib.sha256(f"{location.endpoint}|{location.bucket}|{location.prefix}".encode()).hexdigest()[:16]
    return Path(base) / f"tritium-s3-{digest}"


class S3Mirror:
    """One S3 repository's copy on this host: ``root`` is the folder to read as the repository."""

    def __init__(self, location: S3Location, folder: Path | None = None, client=None) -> None:
        self.location = location
        self._folder = folder or mirror_folder(location)
        self.root = self._folder / "repository"
        self._client = client

    def sync(self, model: str | None = None) -> None:
        """Bring the mirror (or one model's folder of it) in step with the bucket; raises S3Error."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise S3Error(f"cannot make the folder {self.root}: {exc.strerror or exc}") from exc
        with self._locked():
            manifest = self._read_manifest()
            scope = self.location.key_prefix(model)
            objects = self._list(scope)
            kept = {key: etag for key, etag in manifest.items() if not key.startswith(scope)}
            for key, etag in objects.items():
                relative = key[len(self.location.prefix):]
                if manifest.get(key) != etag or not (self.root / relative).exists():
                    self._download(key, self.root / relative)
                kept[key] = etag
            self._remove_missing(model, {key[len(self.location.prefix):] for key in objects})
            self._write_manifest(kept)

    # -- S3 -------------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            self._client = make_client(self.location)
        return self._client

    def _list(self, prefix: str) -> dict[str, str]:
        """key -> ETag of every file object under ``prefix`` (folder markers left out)."""
        from botocore.exceptions import BotoCoreError, ClientError

        objects = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    key = item["Key"]
                    if not key.endswith("/") and _safe_relative(key[len(self.location.prefix):]):
                        objects[key] = item["ETag"]
        except (BotoCoreError, ClientError) as exc:
            raise S3Error(f"cannot list {self._url(prefix)}: {exc}") from exc
        return objects

    def _download(self, key: str, target: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        partial = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(handle, "wb") as out:
                self.client.download_fileobj(self.location.bucket, key, out)
            os.replace(partial, target)
        except (BotoCoreError, ClientError) as exc:
            raise S3Error(f"cannot download {self._url(key)}: {exc}") from exc
        except OSError as exc:   # a key that is also a folder's prefix ('a' and 'a/b'), a full disk
            raise S3Error(f"cannot write {self._url(key)} to {target}: {exc.strerror or exc}") from exc
        finally:
            if partial is not None and os.path.exists(partial):
                os.unlink(partial)

    def _url(self, key: str) -> str:
        return f"s3://{self.location.bucket}/{key}"

    # -- the local copy -----------------------------------------------------------------

    def _remove_missing(self, model: str | None, present: set[str]) -> None:
        top = self.root / model if model is not None else self.root
        if not top.exists():
            return
        for folder, _, files in os.walk(top, topdown=False):
            here = Path(folder)
            if _BYTECODE_CACHE in here.parts:   # written by the Python models that run from here
                continue
            for name in files:
                path = here / name
                if path.relative_to(self.root).as_posix() not in present:   # (a crashed download's leftover too)
                    path.unlink(missing_ok=True)
            if here != self.root and os.listdir(here) in ([], [_BYTECODE_CACHE]):
                shutil.rmtree(here, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read_manifest(self) -> dict[str, str]:
        try:
            return json.loads((self._folder / _MANIFEST).read_text())
        except (OSError, ValueError):
            return {}

    def _write_manifest(self, manifest: dict[str, str]) -> None:
        partial = self._folder / f".{_MANIFEST}.partial"
        partial.write_text(json.dumps(manifest))
        os.replace(partial, self._folder / _MANIFEST)


def _safe_relative(relative: str) -> bool:
    """A key that stays inside the mirror once written as a path (no '..', no absolute part)."""
    parts = relative.split("/")
    return bool(relative) and all(part not in ("", ".", "..") for part in parts)


def make_client(location: S3Location):
    """A boto3 S3 client for the location; path-style addressing, as Triton's client uses."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise S3Error("reading a model repository from S3 needs boto3: pip install 'tritium[s3]'") from exc
    return boto3.client("s3", endpoint_url=location.endpoint, config=Config(s3={"addressing_style": "path"}))
