"""Google Cloud Storage repositories: locations parsed as Triton parses them, each its own mirror
folder, and the credentials Triton's client would use (tests/repo/test_cloud_mirror.py has the
mirror kept in step with a GCS server)."""

from __future__ import annotations

import json
import os

import pytest

from tritium.repo.cloud_mirror import StorageError, mirror_folder
from tritium.repo.gcs import (GcsBucket, GcsLocation, _reading, credentials_for, emulator_endpoint, key_file_for,
                              parse_location)


@pytest.mark.parametrize("url, expected", [
    ("gs://bucket/path/to/repo", GcsLocation("gs://bucket/path/to/repo", "bucket", "path/to/repo/")),
    ("gs://bucket", GcsLocation("gs://bucket", "bucket", "")),
    ("gs://bucket//models///", GcsLocation("gs://bucket//models///", "bucket", "models/")),
])
def test_a_location_is_parsed_as_triton_parses_it(url, expected):
    assert parse_location(url) == expected


@pytest.mark.parametrize("url", ["gs://", "gs:///"])
def test_a_location_without_a_bucket_is_refused_in_triton_s_words(url):
    with pytest.raises(StorageError, match=f"^No bucket name found in path: {url}$"):
        parse_location(url)


def test_each_location_has_its_own_mirror_folder_under_triton_s_mount_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_GCS_MOUNT_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    one, other = GcsBucket(parse_location("gs://b/models")), GcsBucket(parse_location("gs://b/other"))
    assert mirror_folder(one).parent == tmp_path / f"tritium-gs-{os.geteuid()}"   # this user's alone
    assert mirror_folder(one) == mirror_folder(GcsBucket(parse_location("gs://b//models/")))
    assert mirror_folder(one) != mirror_folder(other)
    google_s = mirror_folder(one)
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", "http://127.0.0.1:9023")
    assert mirror_folder(one) != google_s   # another server's bucket of the same name


@pytest.mark.parametrize("variables, expected", [
    ({"CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:9023"}, "http://127.0.0.1:9023"),   # Triton's client's
    ({"STORAGE_EMULATOR_HOST": "localhost:9023"}, "http://localhost:9023"),   # the Python client's
    ({}, None),
])
def test_a_storage_server_other_than_google_s_is_named_as_for_triton_or_the_python_client(variables, expected,
                                                                                         monkeypatch):
    for name in ("CLOUD_STORAGE_EMULATOR_ENDPOINT", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert emulator_endpoint() == expected


CREDENTIALS_FILE = {"gs": {"": "/keys/everywhere.json", "gs://bucket": "/keys/bucket.json",
                           "gs://bucket/private": "/keys/private.json"},
                    "s3": {"s3://bucket": {"key_id": "k", "secret_key": "s"}}}


@pytest.mark.parametrize("url, expected", [
    ("gs://bucket/private/models", "/keys/private.json"),
    ("gs://bucket/models", "/keys/bucket.json"),
    ("gs://other/models", "/keys/everywhere.json"),
])
def test_triton_s_credentials_file_gives_the_longest_matching_name_s_key_file(url, expected, monkeypatch, tmp_path):
    (tmp_path / "credentials.json").write_text(json.dumps(CREDENTIALS_FILE))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "credentials.json"))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/not-this-one.json")
    assert key_file_for(parse_location(url)) == expected


def test_without_the_credentials_file_google_application_credentials_names_the_key_file(monkeypatch):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/sa.json")
    assert key_file_for(parse_location("gs://bucket/models")) == "/keys/sa.json"
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    assert key_file_for(parse_location("gs://bucket/models")) is None


def test_a_location_no_credential_matches_or_an_entry_that_is_no_path_is_an_error(monkeypatch, tmp_path):
    path = tmp_path / "credentials.json"
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    path.write_text(json.dumps({"gs": {"gs://bucket": "/keys/bucket.json"}}))
    with pytest.raises(StorageError, match="^Cannot match credential for path  gs://elsewhere/m$"):
        key_file_for(parse_location("gs://elsewhere/m"))
    path.write_text(json.dumps({"gs": {"gs://bucket": {"key": "inline"}}}))
    with pytest.raises(StorageError, match="the credential for gs://bucket/m in TRITON_CLOUD_CREDENTIAL_PATH's file "
                                           "is not a key file's path"):
        key_file_for(parse_location("gs://bucket/m"))


def service_account_key(folder) -> str:
    """A service account's JSON key file, as Google Cloud's console gives one (its own RSA key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = folder / "service-account.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "tritium-tests", "private_key_id": "k1", "private_key": pem,
        "client_email": "reader@tritium-tests.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    return str(path)


def test_the_key_file_gives_the_service_account_s_read_only_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", service_account_key(tmp_path))
    credentials = credentials_for(parse_location("gs://bucket/models"))
    assert credentials.service_account_email == "reader@tritium-tests.iam.gserviceaccount.com"
    assert list(credentials.scopes) == ["https://www.googleapis.com/auth/devstorage.read_only"]


def test_a_user_s_key_file_gives_the_user_s_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    (tmp_path / "user.json").write_text(json.dumps({   # as `gcloud auth application-default login` writes it
        "type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "user.json"))
    credentials = credentials_for(parse_location("gs://bucket/models"))
    assert (credentials.client_id, credentials.refresh_token) == ("c", "r")


def test_a_key_file_that_cannot_be_read_is_an_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "incomplete.json").write_text('{"type": "service_account"}')
    for path in (tmp_path / "broken.json", tmp_path / "absent.json", tmp_path / "incomplete.json"):
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        with pytest.raises(StorageError, match=f"cannot read the Google Cloud credentials in {path}: "):
            credentials_for(parse_location("gs://bucket/models"))


def test_a_key_file_of_another_kind_is_an_error_saying_which_kinds_are_read(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    (tmp_path / "external.json").write_text('{"type": "external_account"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "external.json"))
    with pytest.raises(StorageError, match="its type is 'external_account', not a service account's key"):
        credentials_for(parse_location("gs://bucket/models"))


def test_without_any_credentials_a_public_bucket_is_read_anonymously(monkeypatch, tmp_path):
    from google.auth.credentials import AnonymousCredentials

    for name in ("TRITON_CLOUD_CREDENTIAL_PATH", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))   # no gcloud login on this host
    # and not a Google Cloud machine (google-auth reads NO_GCE_CHECK=true once, as it is imported)
    monkeypatch.setattr("google.auth.compute_engine._metadata._NO_GCE_CHECK", True)
    assert isinstance(credentials_for(parse_location("gs://public/models")), AnonymousCredentials)


def data_corruption() -> Exception:
    from google.cloud.storage.exceptions import DataCorruption

    return DataCorruption(None, "Checksum mismatch while downloading")


def connection_refused() -> Exception:
    from requests.exceptions import ConnectionError

    return ConnectionError("Connection refused")


@pytest.mark.parametrize("raised", [data_corruption, connection_refused, lambda: ValueError("the client's own")],
                         ids=["checksum", "connection", "other"])
def test_whatever_the_client_raises_is_a_storage_error_that_fails_the_object_alone(raised):
    with pytest.raises(StorageError, match="^cannot download gs://b/k: "):
        with _reading("cannot download gs://b/k"):
            raise raised()


def test_an_error_of_writing_the_mirror_s_file_is_left_to_the_mirror_to_say_and_one_of_listing_is_not():
    with pytest.raises(OSError, match="No space left"):
        with _reading("cannot download gs://b/k", writing=True):
            raise OSError(28, "No space left on device")
    with pytest.raises(StorageError, match="^cannot list gs://b/p/: "):
        with _reading("cannot list gs://b/p/"):
            raise OSError(104, "Connection reset by peer")
