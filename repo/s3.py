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
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, then the instance's role; or, as in Triton, from the
file ``TRITON_CLOUD_CREDENTIAL_PATH`` names.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import logging
import re
import shutil
import stat
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
# Triton's file of credentials per location (JSON: {"s3": {"s3://bucket": {"key_id": ...}}}).
CREDENTIAL_PATH_VARIABLE = "TRITON_CLOUD_CREDENTIAL_PATH"
_MANIFEST = "manifest.json"
log = logging.getLogger(__name__)
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
    elif scheme or ":" in rest.partition("/")[0]:   # not AWS's bucket 'minio.example.com', silently
        raise S3Error(f"'{url}': a server's location is s3://[http(s)://]host:port/bucket[/path], "
                      "the bucket's name in lowercase letters, digits, dots and hyphens")
    else:
        bucket, _, path = rest.partition("/")
        endpoint = None
    path = path.strip("/")
    return S3Location(url, bucket, f"{path}/" if path else "", endpoint)


def mirror_folder(location: S3Location) -> Path:
    """The folder this host keeps the location's mirror in: the same for each process of one
    user, in a folder of that user's alone (checked by ``S3Mirror``)."""
    base = Path(os.environ.get(MOUNT_DIRECTORY_VARIABLE) or tempfile.gettempdir()) / f"tritium-s3-{os.geteuid()}"
    digest = hashlib.sha256(f"{location.endpoint}|{location.bucket}|{location.prefix}".encode()).hexdigest()[:16]
    return base / digest


class S3Mirror:
    """One S3 repository's copy on this host: ``root`` is the folder to read as the repository.

    A sync never raises for one object: the objects that could not be fetched are returned by
    model, and the others are in step. A snapshot of a model's folder (hard links, so that a
    later sync, which replaces files rather than writing into them, leaves it as it was) is
    what a version's instances run from.
    """

    def __init__(self, location: S3Location, folder: Path | None = None, client=None) -> None:
        self.location = location
        self._folder = folder or mirror_folder(location)
        self.root = self._folder / "repository"
        self._client = client

    def sync(self, model: str | None = None) -> dict[str, str]:
        """Bring the mirror (or one model's folder of it) in step with the bucket. Raises S3Error
        when the bucket cannot be listed (or the mirror's folder is not this user's); returns
        model -> why, for the models some of whose objects could not be fetched."""
        if model is not None:
            _check_model_name(model)
        self._prepare()
        with self._locked():
            manifest = self._read_manifest()
            scope = self.location.key_prefix(model)
            objects = self._list(scope)
            kept = {key: etag for key, etag in manifest.items() if not key.startswith(scope)}
            failures: dict[str, str] = {}
            try:
                # Removed first: a file that became a folder ('a' gone, 'a/b' new) is then free.
                self._remove_missing(model, {key[len(self.location.prefix):] for key in objects})
                for key, etag in objects.items():
                    relative = key[len(self.location.prefix):]
                    try:
                        if manifest.get(key) != etag or not (self.root / relative).exists():
                            self._fetch_object(key, relative)
                        kept[key] = etag
                    except S3Error as exc:
                        failures.setdefault(relative.split("/", 1)[0], str(exc))
            except OSError as exc:
                raise S3Error(f"cannot update the mirror {self.root}: {exc.strerror or exc}") from exc
            finally:
                self._write_manifest(kept)   # what is in step, so that it is not fetched again
            return failures

    def sync_names(self) -> None:
        """Only the model folders' names: an empty folder for each model the bucket has (its
        files are fetched when it loads), and the folders of models it no longer has removed.
        Raises S3Error when the bucket cannot be listed."""
        self._prepare()
        with self._locked():
            names = {entry["Prefix"][len(self.location.prefix):].rstrip("/")
                     for page in self._pages(self.location.prefix, Delimiter="/")
                     for entry in page.get("CommonPrefixes", ())}
            names = {name for name in names if _safe_relative(name) and "/" not in name}
            try:
                for name in names:
                    (self.root / name).mkdir(exist_ok=True)
                gone = [entry for entry in self.root.iterdir() if entry.is_dir() and entry.name not in names]
                for entry in gone:
                    shutil.rmtree(entry)
            except OSError as exc:
                raise S3Error(f"cannot update the mirror {self.root}: {exc.strerror or exc}") from exc
            if gone:
                removed = tuple(f"{self.location.prefix}{entry.name}/" for entry in gone)
                self._write_manifest({key: etag for key, etag in self._read_manifest().items()
                                      if not key.startswith(removed)})

    def snapshot(self, model: str, target: Path) -> Path:
        """The model's folder as it is now, linked into ``target`` (same file system: the mirror's
        own ``snapshots`` folder is one), for instances to run from whatever later syncs do."""
        _check_model_name(model)
        with self._locked():
            shutil.copytree(self.root / model, target, copy_function=_link_or_copy,
                            ignore=shutil.ignore_patterns(_BYTECODE_CACHE))
        return target

    @property
    def snapshots(self) -> Path:
        return self._folder / "snapshots"

    # -- S3 -------------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            self._client = make_client(self.location)
        return self._client

    def _list(self, prefix: str) -> dict[str, str]:
        """key -> ETag of every object under ``prefix`` that stays inside the mirror once
        written as a path; folder markers (keys ending in '/', as consoles make empty folders) too."""
        return {item["Key"]: item["ETag"] for page in self._pages(prefix) for item in page.get("Contents", ())
                if _safe_relative(item["Key"][len(self.location.prefix):].rstrip("/"))}

    def _pages(self, prefix: str, **listing) -> list[dict]:
        """Every page of the bucket's listing under ``prefix``; S3Error when it cannot be listed."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return list(self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix, **listing))
        except (BotoCoreError, ClientError) as exc:
            raise S3Error(f"cannot list {self._url(prefix)}: {exc}") from exc

    def _fetch_object(self, key: str, relative: str) -> None:
        target = self.root / relative
        if key.endswith("/"):   # a folder marker: an empty version folder is a version
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise S3Error(f"cannot make the folder of {self._url(key)}: {exc.strerror or exc}") from exc
            return
        partial = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(handle, "wb") as out:
                self.client.download_fileobj(self.location.bucket, key, out)
            os.replace(partial, target)
        except OSError as exc:   # a key that is also a folder's prefix ('a' and 'a/b'), a full disk
            raise S3Error(f"cannot write {self._url(key)} to {target}: {exc.strerror or exc}") from exc
        except Exception as exc:  # botocore's and s3transfer's errors (retries exhausted, access denied)
            raise S3Error(f"cannot download {self._url(key)}: {exc}") from exc
        finally:
            if partial is not None and os.path.exists(partial):
                os.unlink(partial)

    def _url(self, key: str) -> str:
        server = f"{self.location.endpoint.split('://', 1)[1]}/" if self.location.endpoint else ""
        return f"s3://{server}{self.location.bucket}/{key}"

    # -- the local copy -----------------------------------------------------------------

    def _prepare(self) -> None:
        """The mirror's folders, in a folder only this user may write: anyone else could put
        models there that the server would run."""
        base = self._folder.parent
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(base)
            if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
                raise S3Error(f"the mirror folder {base} is not this user's alone (a link, another owner, "
                              "or writable by others); remove it or set TRITON_AWS_MOUNT_DIRECTORY")
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise S3Error(f"cannot make the mirror folder {self.root}: {exc.strerror or exc}") from exc

    def _remove_missing(self, model: str | None, present: set[str]) -> None:
        """Files whose object is gone, then folders left empty that no marker keeps."""
        markers = {relative.rstrip("/") for relative in present if relative.endswith("/")}
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
            if here != self.root and here.relative_to(self.root).as_posix() not in markers \
                    and os.listdir(here) in ([], [_BYTECODE_CACHE]):
                shutil.rmtree(here, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            lock = open(self._folder / "lock", "a")
        except OSError as exc:
            raise S3Error(f"cannot open the mirror's lock {self._folder / 'lock'}: {exc.strerror or exc}") from exc
        with lock:
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
        try:
            partial = self._folder / f".{_MANIFEST}.partial"
            partial.write_text(json.dumps(manifest))
            os.replace(partial, self._folder / _MANIFEST)
        except OSError:   # the next sync fetches again what this one could not record
            log.warning("cannot write the manifest of the mirror %s", self._folder, exc_info=True)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:   # another file system, or one without hard links
        shutil.copy2(source, target)


def _check_model_name(model: str) -> None:
    if not _safe_relative(model) or "/" in model:
        raise S3Error(f"'{model}' is not a model folder's name")


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
    the credential whose name is the longest prefix of the location (``""`` matches every
    one); without the variable, boto3's own chain."""
    path = os.environ.get(CREDENTIAL_PATH_VARIABLE)
    if not path:
        return S3Credential()
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise S3Error(f"cannot read the credentials in {path} ({CREDENTIAL_PATH_VARIABLE}): {exc}") from exc
    named = document.get("s3", {}) if isinstance(document, dict) else None
    if not isinstance(named, dict):
        raise S3Error(f"the credentials in {path} ({CREDENTIAL_PATH_VARIABLE}) are not a JSON object of objects")
    for name in sorted(named, key=len, reverse=True):
        if location.url.startswith(name) and isinstance(named[name], dict):
            fields = named[name]
            return S3Credential(**{key: str(fields.get(key, "")) for key in
                                   ("key_id", "secret_key", "session_token", "region", "profile")})
    raise S3Error(f"Cannot match credential for path  {location.url}")
