"""Model repositories in Azure Storage (``as://account/container/path``): the location, the
container and the credentials; repo/cloud_mirror.py keeps the copy on this host that the
repository is read from.

Locations and credentials as Triton reads them: the account is the location's first part
(``account`` or ``account.blob.core.windows.net``) unless the credential names one; the key is
``AZURE_STORAGE_KEY`` (and ``AZURE_STORAGE_ACCOUNT`` the account), or the ``"as"`` entry of the
file ``TRITON_CLOUD_CREDENTIAL_PATH`` names (``account_str``, ``account_key``); without a key
the container is read anonymously (a public one). The service is the account's
``https://ACCOUNT.blob.core.windows.net``, or, tritium's own, the URL
``TRITIUM_AZURE_BLOB_ENDPOINT`` gives (another cloud's, or an emulator's).
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from typing import BinaryIO

from tritium.repo.cloud_mirror import Bucket, StorageError, client_errors, named_credential

SCHEME = "as://"
# Triton's pattern: the account (or its host), the container, the path, and a query it ignores.
_LOCATION = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)?")
_AZURE_HOST = ".blob.core.windows.net"
# Where the mirrors are kept: Triton's variable for where it copies Azure models to.
MOUNT_DIRECTORY_VARIABLE = "TRITON_AZURE_MOUNT_DIRECTORY"
ENDPOINT_VARIABLE = "TRITIUM_AZURE_BLOB_ENDPOINT"
# How long one call may take: a connection, each read of an answer, and the retries of a call
# (waiting about 2, 4 and 8 s before them, each give or take 3 s; the client's own waits are
# 18, 24 and 42 s).
CONNECTION_TIMEOUT_S = 20
READ_TIMEOUT_S = 60
RETRIES = 3
RETRY_FIRST_WAIT_S = 0
RETRY_WAIT_BASE = 2


@dataclass(frozen=True)
class AzureLocation:
    url: str        # as given
    account: str    # the location's first part, without .blob.core.windows.net
    bucket: str     # the container
    prefix: str     # the repository's key prefix: "" or "path/to/repo/"


def parse_location(url: str) -> AzureLocation:
    matched = _LOCATION.fullmatch(url)
    if matched is None:
        raise StorageError(f"Invalid azure storage path: {url}")
    host, container, path = matched.group(1), matched.group(2), (matched.group(3) or "").strip("/")
    account = host[:-len(_AZURE_HOST)] if host.endswith(_AZURE_HOST) else host
    path = re.sub(r"/+", "/", path)
    return AzureLocation(url, account, container, f"{path}/" if path else "")


@dataclass(frozen=True)
class AzureCredential:
    account: str = ""   # overrides the location's
    key: str = ""


class AzureBucket(Bucket[AzureLocation]):
    """A repository's container in Azure Storage, read with azure-storage-blob."""

    scheme = "as"
    mount_variable = MOUNT_DIRECTORY_VARIABLE
    store, client_module, client_package, extra = "Azure Storage", "azure.storage.blob", "azure-storage-blob", "azure"

    def make_client(self):
        return make_client(self.location)

    def identity(self) -> str:
        # (not the credential's account: a credentials file that cannot be read fails the fetch, not this)
        endpoint = os.environ.get(ENDPOINT_VARIABLE, "")
        return f"{endpoint}|{self.location.account}|{self.location.bucket}|{self.prefix}"

    def objects(self, prefix: str) -> dict[str, str]:
        with _reading(f"cannot list {self.url_of(prefix)}"):
            return listed(self.client.list_blobs(name_starts_with=prefix, include=["metadata"]))

    def folders(self, prefix: str) -> set[str]:
        from azure.storage.blob import BlobPrefix

        with _reading(f"cannot list {self.url_of(prefix)}"):
            return {item.name for item in self.client.walk_blobs(name_starts_with=prefix, delimiter="/")
                    if isinstance(item, BlobPrefix)}

    def download(self, key: str, out: BinaryIO) -> None:
        with _reading(f"cannot download {self.url_of(key)}", writing=True):
            self.client.download_blob(key).readinto(out)

    def url_of(self, key: str) -> str:
        return f"as://{self.location.account}/{self.location.bucket}/{key}"


def listed(blobs) -> dict[str, str]:
    """key -> ETag of a listing's blobs. An account with a hierarchical namespace (Data Lake
    Storage) lists each directory as an empty blob named without the final '/', marked
    ``hdi_isfolder``: it is a folder marker, not a file that would stand where its folder goes."""
    found = {}
    for blob in blobs:
        folder = (blob.metadata or {}).get("hdi_isfolder") == "true"
        found[blob.name.rstrip("/") + "/" if folder else blob.name] = blob.etag
    return found


def _reading(what: str, writing: bool = False):
    """The client's errors as StorageError (``client_errors``: azure-core's AzureError, HTTP
    answers, connections, retries exhausted), each said in one line."""
    return client_errors(what, writing, said=_said)


def _said(error: Exception) -> str:
    """The service's answer in one line and its error code (its message repeats itself, with the
    request's id, time and XML body, over several lines)."""
    first = str(error).split("\n", 1)[0]
    code = getattr(error, "error_code", None)
    return f"{first} ({code})" if code else first


def credential_for(location: AzureLocation) -> AzureCredential:
    """The ``"as"`` entry of Triton's credentials file for the location, else AZURE_STORAGE_ACCOUNT
    and AZURE_STORAGE_KEY."""
    entry = named_credential("as", location.url, dict, "a JSON object")
    if entry is None:
        return AzureCredential(os.environ.get("AZURE_STORAGE_ACCOUNT", ""), os.environ.get("AZURE_STORAGE_KEY", ""))
    return AzureCredential(str(entry.get("account_str", "")), str(entry.get("account_key", "")))


def service_url(account: str) -> str:
    return os.environ.get(ENDPOINT_VARIABLE) or f"https://{account}{_AZURE_HOST}"


def make_client(location: AzureLocation):
    """A client of the location's container: with the account's key, or anonymous without one."""
    from azure.storage.blob import ContainerClient

    credential = credential_for(location)
    account = credential.account or location.account
    if credential.key:
        try:
            base64.b64decode(credential.key, validate=True)
        except ValueError:
            raise StorageError(f"the account key for {location.url} is not base64 (an Azure Storage account's "
                               "key is)") from None
    key = {"account_name": account, "account_key": credential.key} if credential.key else None
    return ContainerClient(service_url(account), location.bucket, credential=key, connection_timeout=CONNECTION_TIMEOUT_S,
                           read_timeout=READ_TIMEOUT_S, retry_total=RETRIES, initial_backoff=RETRY_FIRST_WAIT_S,
                           increment_base=RETRY_WAIT_BASE)
