"""Model repositories in Google Cloud Storage (``gs://bucket/path``): the location, the bucket
and the credentials; repo/cloud_mirror.py keeps the copy on this host that the repository is
read from.

Credentials as Triton's client finds them: the JSON key file the entry of
``TRITON_CLOUD_CREDENTIAL_PATH`` names (under ``"gs"``), else the one
``GOOGLE_APPLICATION_CREDENTIALS`` names (a service account's or a user's), else the host's
(the metadata server of a Google Cloud machine), else none (a public bucket). A storage server
other than Google's (an emulator) is named by ``CLOUD_STORAGE_EMULATOR_ENDPOINT``, as for
Triton, or ``STORAGE_EMULATOR_HOST``; it is read without credentials.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tritium.repo.cloud_mirror import Bucket, StorageError, client_errors, named_credential

SCHEME = "gs://"
# Where the mirrors are kept: Triton's variable for where it copies GCS models to.
MOUNT_DIRECTORY_VARIABLE = "TRITON_GCS_MOUNT_DIRECTORY"
EMULATOR_VARIABLES = ("CLOUD_STORAGE_EMULATOR_ENDPOINT", "STORAGE_EMULATOR_HOST")
_READ_ONLY = ("https://www.googleapis.com/auth/devstorage.read_only",)
REQUEST_TIMEOUT_S = 60   # one request's connection and each read of its answer
RETRY_TIMEOUT_S = 20     # the retries of one call, for the errors the client retries (503, connection refused)


@dataclass(frozen=True)
class GcsLocation:
    url: str      # as given
    bucket: str
    prefix: str   # the repository's key prefix: "" or "path/to/repo/"


def parse_location(url: str) -> GcsLocation:
    """``gs://bucket[/path]``, extra slashes ignored (as Triton's CleanPath)."""
    rest = re.sub(r"/+", "/", url[len(SCHEME):]).strip("/")
    bucket, _, path = rest.partition("/")
    if not bucket:
        raise StorageError(f"No bucket name found in path: {url}")
    return GcsLocation(url, bucket, f"{path}/" if path else "")


class GcsBucket(Bucket[GcsLocation]):
    """A repository's bucket in Google Cloud Storage, read with google-cloud-storage."""

    scheme = "gs"
    mount_variable = MOUNT_DIRECTORY_VARIABLE
    store, client_module, client_package, extra = "Google Cloud Storage", "google.cloud.storage", "google-cloud-storage", "gcs"

    def make_client(self):
        return make_client(self.location)

    def identity(self) -> str:
        return f"{emulator_endpoint()}|{self.location.bucket}|{self.prefix}"

    def objects(self, prefix: str) -> dict[str, str]:
        with _reading(f"cannot list {self.url_of(prefix)}"):
            return {blob.name: str(blob.generation or blob.etag)
                    for blob in self.client.list_blobs(self.location.bucket, prefix=prefix, **_patience())}

    def folders(self, prefix: str) -> set[str]:
        with _reading(f"cannot list {self.url_of(prefix)}"):
            listing = self.client.list_blobs(self.location.bucket, prefix=prefix, delimiter="/", **_patience())
            for _ in listing.pages:   # the folders come with the pages
                pass
            return set(listing.prefixes)

    def download(self, key: str, out: BinaryIO) -> None:
        with _reading(f"cannot download {self.url_of(key)}", writing=True):
            self.client.bucket(self.location.bucket).blob(key).download_to_file(out, **_patience())

    def url_of(self, key: str) -> str:
        return f"gs://{self.location.bucket}/{key}"


def _reading(what: str, writing: bool = False):
    """The client's errors as StorageError (``client_errors``); requests' are its connection's."""
    try:
        from requests.exceptions import RequestException
    except ImportError:
        return client_errors(what, writing)
    return client_errors(what, writing, connection=(RequestException,))


def _patience() -> dict:
    """How long one call of the client may take, retries included: the client's own default
    retries for two minutes, which a sync of many objects, holding the mirror's lock, would pay
    for each object while the server is away."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return {"timeout": REQUEST_TIMEOUT_S, "retry": DEFAULT_RETRY.with_timeout(RETRY_TIMEOUT_S)}


def emulator_endpoint() -> str | None:
    """The storage server to read instead of Google's, as ``http(s)://host:port``."""
    for variable in EMULATOR_VARIABLES:
        value = os.environ.get(variable)
        if value:
            return value if "://" in value else f"http://{value}"
    return None


def make_client(location: GcsLocation):
    """A google-cloud-storage client for the location, with the credentials Triton's would use."""
    from google.cloud import storage

    endpoint = emulator_endpoint()
    if endpoint is not None:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=None, credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint})
    return storage.Client(project=None, credentials=credentials_for(location))


def credentials_for(location: GcsLocation):
    """The key file of Triton's credentials file's entry, else of GOOGLE_APPLICATION_CREDENTIALS,
    else the host's credentials, else none (a public bucket reads without)."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    path = key_file_for(location)
    if path:
        return _key_file_credentials(path)
    try:
        credentials, _ = google.auth.default(scopes=_READ_ONLY)
    except DefaultCredentialsError:
        return AnonymousCredentials()
    return credentials


def _key_file_credentials(path: str):
    """A service account's key or a user's (``gcloud auth application-default login``), the
    two kinds of JSON key file Triton's client reads."""
    from google.auth.exceptions import GoogleAuthError
    from google.oauth2 import credentials as user, service_account

    try:
        kind = json.loads(Path(path).read_text()).get("type")
        if kind == "service_account":
            return service_account.Credentials.from_service_account_file(path, scopes=_READ_ONLY)
        if kind == "authorized_user":
            return user.Credentials.from_authorized_user_file(path, scopes=_READ_ONLY)
    except (GoogleAuthError, OSError, ValueError, AttributeError) as exc:
        raise StorageError(f"cannot read the Google Cloud credentials in {path}: {exc}") from exc
    raise StorageError(f"cannot read the Google Cloud credentials in {path}: its type is {kind!r}, not a service "
                       "account's key ('service_account') or a user's ('authorized_user')")


def key_file_for(location: GcsLocation) -> str | None:
    """The JSON key file for the location: the entry of Triton's credentials file (a path, under
    ``"gs"``), else GOOGLE_APPLICATION_CREDENTIALS's; None for the host's own credentials."""
    entry = named_credential("gs", location.url, str, "a key file's path")
    if entry is not None:
        return entry
    return os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or None
