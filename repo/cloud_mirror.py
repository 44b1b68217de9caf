"""Model repositories in cloud storage (``s3://``, ``gs://``, ``as://``), read through a copy on this host.

Everything that reads a repository reads folders, so a repository in a bucket is copied into a
folder of this host and kept in step with the bucket: ``CloudMirror.sync`` lists the objects
under the repository's prefix (or under one model's), downloads those whose version changed
and removes the files whose objects are gone. A download lands in a temporary file that then
replaces the old one, so a reader sees either file whole, and the poll's fingerprints (mtime,
size) see the change. The processes of one host (the broker and the worker agent of ``tritium
serve``) share a mirror: it is named after the location, and a lock file keeps two syncs apart.

What differs between the stores (the location's syntax, the client, the credentials) is a
``Bucket``: repo/s3.py for S3 and the servers that speak its protocol, repo/gcs.py for Google
Cloud Storage, repo/azure.py for Azure Storage (a container is its bucket).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Generic, Protocol, TypeVar, cast

# Triton's file of credentials per location:
# {"s3": {"s3://bucket": {...}}, "gs": {"gs://bucket": "key.json"}, "as": {"as://account/container": {...}}}.
CREDENTIAL_PATH_VARIABLE = "TRITON_CLOUD_CREDENTIAL_PATH"
SCHEMES = ("s3://", "gs://", "as://")
_MANIFEST = "manifest.json"
_NAME_MAX = 255   # bytes in one file name (Linux's file systems)
_LOCK_CHECK_S = 0.1   # how often a sync waiting for the mirror's lock looks whether its process is stopping
_BYTECODE_CACHE = "__pycache__"
log = logging.getLogger(__name__)


class StorageError(Exception):
    """The repository cannot be read from its bucket (a bad location, no access, the server down)."""


class Location(Protocol):
    @property
    def url(self) -> str: ...      # as given

    @property
    def bucket(self) -> str: ...

    @property
    def prefix(self) -> str: ...   # the repository's key prefix: "" or "path/to/repo/"


L = TypeVar("L", bound=Location)


class Bucket(Generic[L]):
    """One repository's bucket, as the mirror reads it; repo/s3.py, repo/gcs.py and repo/azure.py say how."""

    scheme = ""            # "s3", "gs", "as": the mirrors' folder is tritium-<scheme>-<uid>
    mount_variable = ""    # Triton's variable for where it copies the store's models to
    store = ""             # as messages name the store
    client_module = ""     # its client library, an optional dependency,
    client_package = ""    # the package that has it,
    extra = ""             # and tritium's extra that installs it

    def __init__(self, location: L, client: Any = None) -> None:
        self.location = location
        self._client = client

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def prefix(self) -> str:
        return self.location.prefix

    @property
    def client(self) -> Any:
        """The store's client, made on first use (the repository may never be fetched)."""
        if self._client is None:
            self.require_client()
            self._client = self.make_client()
        return self._client

    def require_client(self) -> None:
        """StorageError saying what to install when the store's client library is not installed."""
        try:
            importlib.import_module(self.client_module)
        except ImportError as exc:
            raise StorageError(f"reading a model repository from {self.store} needs {self.client_package}: "
                               f"pip install 'tritium[{self.extra}]'") from exc

    def make_client(self) -> Any:
        raise NotImplementedError

    def identity(self) -> str:
        """What tells this repository from every other of the store (server, bucket, prefix)."""
        raise NotImplementedError

    def objects(self, prefix: str) -> dict[str, str]:
        """key -> its version (ETag, generation) of every object under ``prefix``, folder
        markers (keys ending in '/') included; StorageError when the bucket cannot be listed."""
        raise NotImplementedError

    def folders(self, prefix: str) -> set[str]:
        """The keys of the folders right under ``prefix`` (``prefix + name + '/'``)."""
        raise NotImplementedError

    def download(self, key: str, out: BinaryIO) -> None:
        """The object's bytes written to ``out``; StorageError when it cannot be read."""
        raise NotImplementedError

    def url_of(self, key: str) -> str:
        """The object's location as a user writes it, for messages."""
        raise NotImplementedError


def is_cloud(location: str | Path) -> bool:
    return str(location).startswith(SCHEMES)


def bucket_for(url: str) -> Bucket[Any]:
    """The bucket an ``s3://``, ``gs://`` or ``as://`` location names (StorageError for a malformed one)."""
    if url.startswith("gs://"):
        from tritium.repo.gcs import GcsBucket, parse_location as parse_gcs

        return GcsBucket(parse_gcs(url))
    if url.startswith("as://"):
        from tritium.repo.azure import AzureBucket, parse_location as parse_azure

        return AzureBucket(parse_azure(url))
    from tritium.repo.s3 import S3Bucket, parse_location as parse_s3

    return S3Bucket(parse_s3(url))


def mirror_folder(bucket: Bucket[Any]) -> Path:
    """The folder this host keeps the repository's mirror in: the same for each process of one
    user, in a folder of that user's alone (checked by ``CloudMirror``)."""
    base = Path(os.environ.get(bucket.mount_variable) or tempfile.gettempdir())
    digest = hashlib.sha256(bucket.identity().encode()).hexdigest()[:16]
    return base / f"tritium-{bucket.scheme}-{os.geteuid()}" / digest


@contextmanager
def client_errors(what: str, writing: bool = False, connection: tuple[type, ...] = (),
                  said: Callable[[Exception], str] = str) -> Iterator[None]:
    """Whatever a store's client raises (the service's answers, credentials, the connection, a
    checksum that does not match) as StorageError, ``what`` failed. While ``writing`` the
    mirror's file an OSError passes, for the mirror to say, unless it is one of the client's
    ``connection`` errors (requests' and botocore's are OSErrors too)."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        if writing and not isinstance(exc, connection):
            raise
        raise StorageError(f"{what}: {said(exc)}") from exc
    except Exception as exc:
        raise StorageError(f"{what}: {said(exc)}") from exc


def named_credential(store: str, url: str, kind: type, described: str) -> Any:
    """The entry of Triton's credentials file for the location, as Triton picks it: under
    ``store`` ("s3", "gs", "as"), the one whose name is the longest prefix of the location (``""``
    matches every one), which must be a ``kind`` (``described`` in the error that says it is
    not). None without the variable: the store's own default chain."""
    path = os.environ.get(CREDENTIAL_PATH_VARIABLE)
    if not path:
        return None
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StorageError(f"cannot read the credentials in {path} ({CREDENTIAL_PATH_VARIABLE}): {exc}") from exc
    named = document.get(store, {}) if isinstance(document, dict) else None
    if not isinstance(named, dict):
        raise StorageError(f"the credentials in {path} ({CREDENTIAL_PATH_VARIABLE}) are not a JSON object of objects")
    for name in sorted(named, key=len, reverse=True):
        if url.startswith(name):
            if not isinstance(named[name], kind):
                raise StorageError(f"the credential for {url} in {CREDENTIAL_PATH_VARIABLE}'s file is not {described}")
            return named[name]
    raise StorageError(f"Cannot match credential for path  {url}")


class CloudMirror:
    """One repository's copy on this host: ``root`` is the folder to read as the repository.

    A sync never raises for one object: the objects that could not be fetched are returned by
    model, and the others are in step. A snapshot of a model's folder (hard links, so that a
    later sync, which replaces files rather than writing into them, leaves it as it was) is
    what a version's instances run from.
    """

    def __init__(self, bucket: Bucket[Any], folder: Path | None = None) -> None:
        self.bucket = bucket
        self._folder = folder or mirror_folder(bucket)
        self.root = self._folder / "repository"
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Its process is stopping: a sync under way ends at the next object or the next chunk of
        the one being downloaded (so that the process need not wait for gigabytes), and later ones
        end at once. What was not fetched is fetched by the next process."""
        self._stopping.set()

    def sync(self, model: str | None = None) -> dict[str, str]:
        """Bring the mirror (or one model's folder of it) in step with the bucket. Raises
        StorageError when the bucket cannot be listed (or the mirror's folder is not this
        user's); returns model -> why, for the models some of whose objects could not be fetched."""
        if model is not None:
            _check_model_name(model)
        self._go_on()
        self._prepare()
        prefix = self.bucket.prefix
        with self._locked():
            manifest = self._read_manifest()
            scope = prefix if model is None else f"{prefix}{model}/"
            objects = self._list(scope)
            kept = {key: version for key, version in manifest.items() if not key.startswith(scope)}
            failures: dict[str, str] = {}
            try:
                # Removed first: a file that became a folder ('a' gone, 'a/b' new) is then free.
                self._remove_missing(model, {key[len(prefix):] for key in objects})
                for key, version in objects.items():
                    self._go_on()
                    relative = key[len(prefix):]
                    try:
                        if manifest.get(key) != version or not (self.root / relative).exists():
                            self._fetch_object(key, relative)
                        kept[key] = version
                    except StorageError as exc:
                        failures.setdefault(relative.split("/", 1)[0], str(exc))
            except OSError as exc:
                raise StorageError(f"cannot update the mirror {self.root}: {exc.strerror or exc}") from exc
            finally:
                self._write_manifest(kept)   # what is in step, so that it is not fetched again
            return failures

    def sync_names(self) -> None:
        """Only the model folders' names: an empty folder for each model the bucket has (its
        files are fetched when it loads), and the folders of models it no longer has removed.
        Raises StorageError when the bucket cannot be listed."""
        self._prepare()
        prefix = self.bucket.prefix
        with self._locked():
            names = {key[len(prefix):].rstrip("/") for key in self.bucket.folders(prefix)}
            names = {name for name in names if _safe_relative(name) and "/" not in name}
            try:
                for name in names:
                    (self.root / name).mkdir(exist_ok=True)
                gone = [entry for entry in self.root.iterdir() if entry.is_dir() and entry.name not in names]
                for entry in gone:
                    shutil.rmtree(entry)
            except OSError as exc:
                raise StorageError(f"cannot update the mirror {self.root}: {exc.strerror or exc}") from exc
            if gone:
                removed = tuple(f"{prefix}{entry.name}/" for entry in gone)
                self._write_manifest({key: version for key, version in self._read_manifest().items()
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

    # -- the bucket -----------------------------------------------------------------------

    def _list(self, prefix: str) -> dict[str, str]:
        """The objects under ``prefix`` that stay inside the mirror once written as a path."""
        return {key: version for key, version in self.bucket.objects(prefix).items()
                if _safe_relative(key[len(self.bucket.prefix):].rstrip("/"))}

    def _fetch_object(self, key: str, relative: str) -> None:
        target = self.root / relative
        if key.endswith("/"):   # a folder marker: an empty version folder is a version
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot make the folder of {self.bucket.url_of(key)}: "
                                   f"{exc.strerror or exc}") from exc
            return
        partial = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # (a short name of its own: the object's may be as long as a file's name can be)
            handle, partial = tempfile.mkstemp(dir=target.parent, prefix=".tritium-download-")
            with os.fdopen(handle, "wb") as out:
                self.bucket.download(key, cast(BinaryIO, _StoppableFile(out, self._stopping)))
            os.replace(partial, target)
        except OSError as exc:   # a key that is also a folder's prefix ('a' and 'a/b'), a full disk
            raise StorageError(f"cannot write {self.bucket.url_of(key)} to {target}: {exc.strerror or exc}") from exc
        finally:
            if partial is not None and os.path.exists(partial):
                os.unlink(partial)

    def _go_on(self) -> None:
        if self._stopping.is_set():
            raise StorageError(f"the fetch of {self.bucket.url} was stopped: the server is stopping")

    # -- the local copy -----------------------------------------------------------------

    def _prepare(self) -> None:
        """The mirror's folders, in a folder only this user may write: anyone else could put
        models there that the server would run."""
        base = self._folder.parent
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(base)
            if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
                raise StorageError(f"the mirror folder {base} is not this user's alone (a link, another owner, "
                                   f"or writable by others); remove it or set {self.bucket.mount_variable}")
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot make the mirror folder {self.root}: {exc.strerror or exc}") from exc

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
        """The mirror to this sync alone: the lock file keeps the host's processes apart (and the
        threads of one, on a local file system); the thread lock keeps threads apart where a
        network file system makes flock a process's lock."""
        try:
            lock = open(self._folder / "lock", "a")
        except OSError as exc:
            raise StorageError(f"cannot open the mirror's lock {self._folder / 'lock'}: "
                               f"{exc.strerror or exc}") from exc
        threads = _thread_lock(self._folder)
        with lock:
            self._wait_for(lambda: threads.acquire(timeout=_LOCK_CHECK_S))
            try:
                self._wait_for(lambda: _flocked(lock))
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
            finally:
                threads.release()

    def _wait_for(self, took: Callable[[], bool]) -> None:
        """Until ``took()`` has the lock, which another process's download may hold for long: a
        stopping process does not wait for it."""
        while not took():
            if self._stopping.wait(_LOCK_CHECK_S):
                self._go_on()

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


class FetchStopped(Exception):
    """Raised into the store's client by a write once the mirror is stopped: it ends the download
    as any error of the client's does (not an OSError, which would read as the disk's)."""


class _StoppableFile:
    """The download's file, which refuses the next chunk once the mirror is stopped."""

    def __init__(self, out: BinaryIO, stopping: threading.Event) -> None:
        self._out = out
        self._stopping = stopping

    def write(self, chunk) -> int:
        if self._stopping.is_set():
            raise FetchStopped("the server is stopping")
        return self._out.write(chunk)

    def __getattr__(self, name: str):   # seek, tell, flush: as the file's own
        return getattr(self._out, name)


_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_THREAD_LOCKS_LOCK = threading.Lock()


def _thread_lock(folder: Path) -> threading.Lock:
    with _THREAD_LOCKS_LOCK:
        return _THREAD_LOCKS.setdefault(folder, threading.Lock())


def _flocked(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:   # another file system, or one without hard links
        shutil.copy2(source, target)


def _check_model_name(model: str) -> None:
    if not _safe_relative(model) or "/" in model:
        raise StorageError(f"'{model}' is not a model folder's name")


def _safe_relative(relative: str) -> bool:
    """A key that stays inside the mirror once written as a path (no '..', no absolute part)
    and can be one (no NUL, no name longer than a file system takes)."""
    parts = relative.split("/")
    return bool(relative) and "\0" not in relative and all(
        part not in ("", ".", "..") and len(part.encode("utf-8", "surrogateescape")) <= _NAME_MAX for part in parts)
