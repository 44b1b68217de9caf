"""Azure Storage repositories: locations parsed as Triton parses them, each its own mirror
folder, and the credentials Triton reads (tests/repo/test_cloud_mirror.py has the mirror kept
in step with Azurite)."""

from __future__ import annotations

import json
import os

import pytest

from tritium.repo.azure import (AzureBucket, AzureCredential, AzureLocation, _reading, credential_for, listed,
                                make_client, parse_location, service_url)
from tritium.repo.cloud_mirror import StorageError, mirror_folder


@pytest.mark.parametrize("url, expected", [
    ("as://account/container/path/to/repo", AzureLocation("as://account/container/path/to/repo", "account",
                                                           "container", "path/to/repo/")),
    ("as://account/container", AzureLocation("as://account/container", "account", "container", "")),
    ("as://account.blob.core.windows.net/c/models", AzureLocation("as://account.blob.core.windows.net/c/models",
                                                                  "account", "c", "models/")),
    ("as://account/c//models///?sv=2020", AzureLocation("as://account/c//models///?sv=2020", "account", "c",
                                                        "models/")),
])
def test_a_location_is_parsed_as_triton_parses_it(url, expected):
    assert parse_location(url) == expected


@pytest.mark.parametrize("url", ["as://", "as://account", "as://account/", "as:///container/models"])
def test_a_location_without_an_account_and_a_container_is_refused_in_triton_s_words(url):
    with pytest.raises(StorageError, match=f"^Invalid azure storage path: {url}$"):
        parse_location(url)


def test_each_location_has_its_own_mirror_folder_under_triton_s_mount_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_AZURE_MOUNT_DIRECTORY", str(tmp_path))
    for name in ("TRITIUM_AZURE_BLOB_ENDPOINT", "TRITON_CLOUD_CREDENTIAL_PATH", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    one, other = AzureBucket(parse_location("as://a/c/models")), AzureBucket(parse_location("as://a/c/other"))
    assert mirror_folder(one).parent == tmp_path / f"tritium-as-{os.geteuid()}"   # this user's alone
    assert mirror_folder(one) == mirror_folder(AzureBucket(parse_location("as://a.blob.core.windows.net/c/models")))
    assert mirror_folder(one) != mirror_folder(other)
    azure_s = mirror_folder(one)
    monkeypatch.setenv("TRITIUM_AZURE_BLOB_ENDPOINT", "http://127.0.0.1:10000/a")
    assert mirror_folder(one) != azure_s   # another service's container of the same name


def test_the_service_is_the_account_s_unless_tritium_s_variable_names_another(monkeypatch):
    monkeypatch.delenv("TRITIUM_AZURE_BLOB_ENDPOINT", raising=False)
    assert service_url("account") == "https://account.blob.core.windows.net"
    monkeypatch.setenv("TRITIUM_AZURE_BLOB_ENDPOINT", "http://127.0.0.1:10000/devstoreaccount1")
    assert service_url("account") == "http://127.0.0.1:10000/devstoreaccount1"


CREDENTIALS_FILE = {"as": {"": {"account_str": "everywhere", "account_key": "k0"},
                           "as://account/models": {"account_key": "k1"},
                           "as://account/models/private": {"account_str": "other", "account_key": "k2"}}}


@pytest.mark.parametrize("url, expected", [
    ("as://account/models/private/repo", AzureCredential("other", "k2")),
    ("as://account/models/repo", AzureCredential("", "k1")),
    ("as://elsewhere/c", AzureCredential("everywhere", "k0")),
])
def test_triton_s_credentials_file_gives_the_longest_matching_name_s_credential(url, expected, monkeypatch, tmp_path):
    (tmp_path / "credentials.json").write_text(json.dumps(CREDENTIALS_FILE))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "credentials.json"))
    monkeypatch.setenv("AZURE_STORAGE_KEY", "not this one")
    assert credential_for(parse_location(url)) == expected


def test_without_the_credentials_file_azure_s_variables_give_the_account_and_key(monkeypatch):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "named")
    monkeypatch.setenv("AZURE_STORAGE_KEY", "secret")
    assert credential_for(parse_location("as://account/c")) == AzureCredential("named", "secret")


def test_a_location_no_credential_matches_or_an_entry_that_is_no_object_is_an_error(monkeypatch, tmp_path):
    path = tmp_path / "credentials.json"
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    path.write_text(json.dumps({"as": {"as://account/c": {"account_key": "k"}}}))
    with pytest.raises(StorageError, match="^Cannot match credential for path  as://elsewhere/c$"):
        credential_for(parse_location("as://elsewhere/c"))
    path.write_text(json.dumps({"as": {"as://account/c": "k"}}))
    with pytest.raises(StorageError, match="the credential for as://account/c in TRITON_CLOUD_CREDENTIAL_PATH's "
                                           "file is not a JSON object"):
        credential_for(parse_location("as://account/c"))


def test_with_a_key_the_client_signs_with_the_account_s_key_and_without_one_reads_anonymously(monkeypatch):
    for name in ("TRITON_CLOUD_CREDENTIAL_PATH", "TRITIUM_AZURE_BLOB_ENDPOINT", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_KEY", "c2VjcmV0")
    keyed = make_client(parse_location("as://account/models"))
    assert (keyed.url, keyed.credential.account_name) == ("https://account.blob.core.windows.net/models", "account")
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    assert make_client(parse_location("as://account/models")).credential is None


def test_a_key_that_is_not_base64_is_an_error_naming_the_location(monkeypatch):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_KEY", "secret")
    with pytest.raises(StorageError, match="^the account key for as://account/models is not base64"):
        make_client(parse_location("as://account/models"))


def blob(name: str, etag: str, metadata: dict | None = None):
    from azure.storage.blob import BlobProperties

    properties = BlobProperties()
    properties.name, properties.etag, properties.metadata = name, etag, metadata or {}
    return properties


def test_a_data_lake_directory_listed_as_a_blob_is_a_folder_marker():
    # An account with a hierarchical namespace lists its directories as empty blobs, without a final '/'.
    listing = [blob("p/m", "d1", {"hdi_isfolder": "true"}), blob("p/m/1", "d2", {"hdi_isfolder": "true"}),
               blob("p/m/1/model.py", "f1"), blob("p/m/config.pbtxt", "f2"), blob("p/m/2/", "marker")]
    assert listed(listing) == {"p/m/": "d1", "p/m/1/": "d2", "p/m/1/model.py": "f1", "p/m/config.pbtxt": "f2",
                               "p/m/2/": "marker"}


def test_whatever_the_client_raises_is_a_storage_error_but_a_failed_write_of_the_copy():
    from azure.core.exceptions import ServiceRequestError

    for raised in (ServiceRequestError("Connection refused"), OSError(111, "Connection refused")):
        with pytest.raises(StorageError, match="^cannot list as://a/c/p/: "):
            with _reading("cannot list as://a/c/p/"):
                raise raised
    with pytest.raises(OSError, match="No space left"):
        with _reading("cannot download as://a/c/k", writing=True):
            raise OSError(28, "No space left on device")
