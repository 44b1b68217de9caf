"""S3 repositories: locations parsed as Triton parses them, each its own mirror folder, and the
credentials Triton's file gives (tests/repo/test_cloud_mirror.py has the mirror kept in step)."""

from __future__ import annotations

import json
import os

import pytest

from tests.s3_server import CREDENTIALS, s3_server
from tritium.repo.cloud_mirror import CloudMirror, StorageError, mirror_folder
from tritium.repo.s3 import S3Bucket, S3Credential, S3Location, credential_for, make_client, parse_location


@pytest.mark.parametrize("url, expected", [
    ("s3://bucket/path/to/repo", S3Location("s3://bucket/path/to/repo", "bucket", "path/to/repo/", None)),
    ("s3://bucket", S3Location("s3://bucket", "bucket", "", None)),
    ("s3://bucket//models///", S3Location("s3://bucket//models///", "bucket", "models/", None)),
    ("s3://localhost:9000/bucket/models",
     S3Location("s3://localhost:9000/bucket/models", "bucket", "models/", "http://localhost:9000")),
    ("s3://https://minio.example.com:443/b/a/b",
     S3Location("s3://https://minio.example.com:443/b/a/b", "b", "a/b/", "https://minio.example.com:443")),
    ("s3://http://10.0.0.1:9000/b", S3Location("s3://http://10.0.0.1:9000/b", "b", "", "http://10.0.0.1:9000")),
])
def test_a_location_is_parsed_as_triton_parses_it(url, expected):
    assert parse_location(url) == expected


@pytest.mark.parametrize("url", ["s3://", "s3:///", "s3://http://"])
def test_a_location_without_a_bucket_is_refused(url):
    with pytest.raises(StorageError, match=f"Invalid bucket name: '{url}'"):
        parse_location(url)


def test_each_location_has_its_own_mirror_folder_under_triton_s_mount_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    one, other = S3Bucket(parse_location("s3://b/models")), S3Bucket(parse_location("s3://b/other"))
    assert mirror_folder(one).parent == tmp_path / f"tritium-s3-{os.geteuid()}"   # this user's alone
    assert mirror_folder(one) == mirror_folder(S3Bucket(parse_location("s3://b//models/")))
    assert mirror_folder(one) != mirror_folder(other)


@pytest.mark.parametrize("url", ["s3://https://minio.example.com/models/repo", "s3://http://minio/b",
                                 "s3://localhost:9000/Bucket/models"])
def test_a_server_without_a_port_or_a_bucket_s3_cannot_name_is_refused_not_read_from_aws(url):
    with pytest.raises(StorageError, match="a server's location is s3://\\[http\\(s\\)://\\]host:port/bucket"):
        parse_location(url)


@pytest.fixture(scope="module")
def server():
    with s3_server("models") as running:
        yield running


@pytest.fixture
def mirror(server, tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    prefix = f"repo-{os.urandom(4).hex()}"
    return CloudMirror(S3Bucket(parse_location(server.location("models", prefix))), tmp_path / "mirror"), prefix


def put_files(server, prefix: str, files: dict[str, str]) -> None:
    for relative, body in files.items():
        server.put("models", f"{prefix}/{relative}", body)


def files_of(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


CREDENTIALS_FILE = {"s3": {
    "": {"key_id": "everywhere", "secret_key": "s0"},
    "s3://bucket": {"key_id": "bucket", "secret_key": "s1", "region": "eu-west-1", "session_token": "t"},
    "s3://bucket/private": {"profile": "ops"},
}}


@pytest.mark.parametrize("url, expected", [
    ("s3://bucket/private/models", S3Credential(profile="ops")),
    ("s3://bucket/models", S3Credential("bucket", "s1", "t", "eu-west-1")),
    ("s3://other/models", S3Credential("everywhere", "s0")),
])
def test_triton_s_credentials_file_gives_the_longest_matching_name_s_credential(url, expected, monkeypatch, tmp_path):
    (tmp_path / "credentials.json").write_text(json.dumps(CREDENTIALS_FILE))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "credentials.json"))
    assert credential_for(parse_location(url)) == expected


def test_without_the_credentials_file_boto3_s_own_chain_is_used(monkeypatch):
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    assert credential_for(parse_location("s3://bucket/models")).client_arguments() == {}


def test_a_location_no_credential_matches_or_a_broken_file_is_an_error(monkeypatch, tmp_path):
    path = tmp_path / "credentials.json"
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    path.write_text(json.dumps({"s3": {"s3://bucket": {"key_id": "k", "secret_key": "s"}}}))
    with pytest.raises(StorageError, match="^Cannot match credential for path  s3://elsewhere/m$"):
        credential_for(parse_location("s3://elsewhere/m"))
    path.write_text(json.dumps({"s3": {"s3://bucket": "not an object"}}))
    with pytest.raises(StorageError, match="the credential for s3://bucket/m in TRITON_CLOUD_CREDENTIAL_PATH's file is "
                                           "not a JSON object"):
        credential_for(parse_location("s3://bucket/m"))
    path.write_text("{not json")
    with pytest.raises(StorageError, match=f"cannot read the credentials in {path} \\(TRITON_CLOUD_CREDENTIAL_PATH\\)"):
        credential_for(parse_location("s3://bucket/m"))


def test_a_mirror_reads_the_bucket_with_the_file_s_keys_over_aws_s_variables(server, mirror, monkeypatch, tmp_path):
    mirror, prefix = mirror
    location = parse_location(server.location("models", prefix))
    (tmp_path / "credentials.json").write_text(json.dumps({"s3": {location.url: {
        "key_id": "from-the-file", "secret_key": "secret", "region": "us-east-1"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(tmp_path / "credentials.json"))
    client = make_client(location)
    assert client._request_signer._credentials.access_key == "from-the-file"   # not AWS_ACCESS_KEY_ID's
    put_files(server, prefix, {"m/config.pbtxt": "read"})
    CloudMirror(S3Bucket(location, client), tmp_path / "keyed").sync()
    assert files_of(tmp_path / "keyed" / "repository") == {"m/config.pbtxt": b"read"}
