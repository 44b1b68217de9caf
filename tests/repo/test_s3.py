"""S3 repositories: locations parsed as Triton parses them, and the mirror kept in step with a
real S3 server (moto's, over HTTP) as objects are added, replaced and deleted."""

from __future__ import annotations

import os

import pytest

from tests.s3_server import CREDENTIALS, s3_server
from tritium.repo import ModelRepository
from tritium.repo.s3 import S3Error, S3Location, S3Mirror, mirror_folder, parse_location

CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n' \
         'input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]\n' \
         'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'


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
    with pytest.raises(S3Error, match=f"Invalid bucket name: '{url}'"):
        parse_location(url)


def test_each_location_has_its_own_mirror_folder_under_triton_s_mount_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    one, other = parse_location("s3://b/models"), parse_location("s3://b/other")
    assert mirror_folder(one).parent == tmp_path
    assert mirror_folder(one) == mirror_folder(parse_location("s3://b//models/"))
    assert mirror_folder(one) != mirror_folder(other)


@pytest.fixture(scope="module")
def server():
    with s3_server("models") as running:
        yield running


@pytest.fixture
def mirror(server, tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    prefix = f"repo-{os.urandom(4).hex()}"
    return S3Mirror(parse_location(server.location("models", prefix)), tmp_path / "mirror"), prefix


def put_files(server, prefix: str, files: dict[str, str]) -> None:
    for relative, body in files.items():
        server.put("models", f"{prefix}/{relative}", body)


def files_of(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def test_a_sync_copies_the_objects_under_the_prefix_and_nothing_else(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"add/config.pbtxt": "config", "add/1/model.py": "code",
                               "add/1/": ""})   # (a folder marker, as consoles make them)
    server.put("models", f"{prefix}-other/add/config.pbtxt", "not this repository")
    mirror.sync()
    assert files_of(mirror.root) == {"add/config.pbtxt": b"config", "add/1/model.py": b"code"}


def test_a_replaced_object_is_downloaded_again_and_a_deleted_one_removed_with_its_folder(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "one", "m/2/model.py": "two"})
    mirror.sync()
    (mirror.root / "m" / "2" / "__pycache__").mkdir()   # as a Python model running from the mirror leaves
    (mirror.root / "m" / "2" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"compiled")
    before = (mirror.root / "m" / "config.pbtxt").stat().st_mtime_ns
    server.put("models", f"{prefix}/m/config.pbtxt", "three")
    server.delete_prefix("models", f"{prefix}/m/2/")
    mirror.sync()
    assert files_of(mirror.root) == {"m/config.pbtxt": b"three"}
    assert not (mirror.root / "m" / "2").exists()
    assert (mirror.root / "m" / "config.pbtxt").stat().st_mtime_ns != before   # the poll's fingerprint sees it


def test_an_unchanged_object_is_not_downloaded_again(server, mirror):
    mirror, prefix = mirror
    server.put("models", f"{prefix}/m/config.pbtxt", "same")
    mirror.sync()
    stat = (mirror.root / "m" / "config.pbtxt").stat()
    mirror.sync()
    again = (mirror.root / "m" / "config.pbtxt").stat()
    assert (again.st_ino, again.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)


def test_a_model_s_sync_touches_only_its_folder(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"a/config.pbtxt": "a1", "b/config.pbtxt": "b1"})
    mirror.sync()
    server.put("models", f"{prefix}/a/config.pbtxt", "a2")
    server.delete_prefix("models", f"{prefix}/b/")
    server.put("models", f"{prefix}/c/config.pbtxt", "c1")
    mirror.sync("a")
    assert files_of(mirror.root) == {"a/config.pbtxt": b"a2", "b/config.pbtxt": b"b1"}
    mirror.sync()
    assert files_of(mirror.root) == {"a/config.pbtxt": b"a2", "c/config.pbtxt": b"c1"}


def test_keys_that_would_leave_the_mirror_are_not_written(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "kept", "m/../../escaped.txt": "outside", "m/./x": "dot"})
    mirror.sync()
    assert files_of(mirror.root) == {"m/config.pbtxt": b"kept"}
    assert not (mirror.root.parent / "escaped.txt").exists()


def test_a_bucket_that_does_not_exist_is_an_error_naming_it(server, mirror, tmp_path):
    missing = S3Mirror(parse_location(server.location("no-such-bucket", "repo")), tmp_path / "missing")
    with pytest.raises(S3Error, match="cannot list s3://no-such-bucket/repo/: .*NoSuchBucket"):
        missing.sync()


def test_a_repository_in_s3_is_discovered_and_loaded_after_a_fetch(server, mirror, monkeypatch, tmp_path):
    _, prefix = mirror
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    put_files(server, prefix, {"add/config.pbtxt": CONFIG.replace("{name}", "add"),
                               "add/1/model.py": "class TritonPythonModel:\n    pass\n"})
    repository = ModelRepository([server.location("models", prefix)])
    assert repository.remote
    assert repository.fetch() is None
    found, errors = repository.discover()
    assert (list(found), errors) == (["add"], ())
    assert repository.load("add").config.max_batch_size == 4


def test_a_repository_that_cannot_be_fetched_says_so_by_its_location(server, mirror, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    location = server.location("no-such-bucket")
    repository = ModelRepository([location])
    failure = repository.fetch()
    assert failure.startswith(f"model repository '{location}' cannot be read: cannot list s3://no-such-bucket/: ")
    found, errors = repository.discover()
    assert found == {} and errors == (failure,)


def test_a_key_that_is_also_a_folder_fails_the_sync_naming_it(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/1": "a file", "m/1/model.py": "and a folder"})
    with pytest.raises(S3Error, match=f"cannot write s3://models/{prefix}/m/1/model.py to .*/m/1/model.py: "):
        mirror.sync()
    assert files_of(mirror.root) == {"m/1": b"a file"}
