"""Repositories in cloud storage: the mirror kept in step with a real S3 server (moto's), a real
Google Cloud Storage server (an emulator of its JSON API) and a real Azure Storage server
(Azurite), each over HTTP, as objects are added, replaced and deleted; and the repository read
through it."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

from tests.azure_server import azure_server
from tests.gcs_server import gcs_server
from tests.s3_server import CREDENTIALS, s3_server
from tritium.broker.model_reads import ModelReader
from tritium.repo import ModelRepository
from tritium.repo.cloud_mirror import CloudMirror, StorageError, bucket_for

CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n' \
         'input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]\n' \
         'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'


class Store:
    """One storage server, as these tests use it: the same calls for S3, GCS and Azure."""

    def __init__(self, server, environment: dict[str, str], mount_variable: str) -> None:
        self.server = server
        self.environment = environment
        self.mount_variable = mount_variable

    def location(self, bucket: str, path: str = "") -> str:
        return self.server.location(bucket, path)

    def url(self, path: str) -> str:
        """An object's or a prefix's location as messages show it ('bucket/key')."""
        return self.location(path.split("/", 1)[0]).rstrip("/") + "/" + path.split("/", 1)[1]

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.server.put(bucket, key, body)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        self.server.delete_prefix(bucket, prefix)


@pytest.fixture(scope="module", params=["s3", "gs", "as"])
def server(request):
    if request.param == "s3":
        with s3_server("models") as running:
            yield Store(running, CREDENTIALS, "TRITON_AWS_MOUNT_DIRECTORY")
    elif request.param == "gs":
        with gcs_server("models") as running:
            yield Store(running, running.environment, "TRITON_GCS_MOUNT_DIRECTORY")
    else:
        with azure_server("models") as running:
            yield Store(running, running.environment, "TRITON_AZURE_MOUNT_DIRECTORY")


@pytest.fixture
def mirror(server, tmp_path, monkeypatch):
    for name, value in server.environment.items():
        monkeypatch.setenv(name, value)
    prefix = f"repo-{os.urandom(4).hex()}"
    return CloudMirror(bucket_for(server.location("models", prefix)), tmp_path / "mirror"), prefix


def put_files(server, prefix: str, files: dict[str, str]) -> None:
    for relative, body in files.items():
        server.put("models", f"{prefix}/{relative}", body)


def files_of(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


@pytest.mark.parametrize("url", ["s3://b/models", "gs://b/models", "as://account/b/models"])
def test_a_mirror_folder_another_user_could_write_is_refused(url, tmp_path):
    base = tmp_path / "shared"
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    mirror = CloudMirror(bucket_for(url), base / "mirror")
    with pytest.raises(StorageError, match=f"the mirror folder {base} is not this user's alone"):
        mirror.sync()
    assert not (base / "mirror").exists()


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
    if server.mount_variable != "TRITON_AWS_MOUNT_DIRECTORY":
        pytest.skip("only S3's client sends such names as they are (the GCS emulator refuses them, Azure's client "
                    "resolves the '..')")
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "kept", "m/../../escaped.txt": "outside", "m/./x": "dot"})
    mirror.sync()
    assert files_of(mirror.root) == {"m/config.pbtxt": b"kept"}
    assert not (mirror.root.parent / "escaped.txt").exists()


def test_keys_that_cannot_be_a_path_here_are_not_written_and_the_rest_is(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "kept", f"m/{'n' * 252}.txt": "a name too long for a file system",
                               f"m/{'n' * 251}.txt": "the longest name a file can have"})
    assert mirror.sync() == {}
    assert files_of(mirror.root) == {"m/config.pbtxt": b"kept", f"m/{'n' * 251}.txt": b"the longest name a file can have"}


def test_a_bucket_that_does_not_exist_is_an_error_naming_it(server, mirror, tmp_path):
    missing = CloudMirror(bucket_for(server.location("no-such-bucket", "repo")), tmp_path / "missing")
    with pytest.raises(StorageError, match=f"cannot list {server.url('no-such-bucket/repo/')}: "
                                           ".*(NoSuchBucket|404|ContainerNotFound)"):
        missing.sync()


def test_a_repository_in_a_bucket_is_discovered_and_loaded_after_a_fetch(server, mirror, monkeypatch, tmp_path):
    _, prefix = mirror
    monkeypatch.setenv(server.mount_variable, str(tmp_path))
    put_files(server, prefix, {"add/config.pbtxt": CONFIG.replace("{name}", "add"),
                               "add/1/model.py": "class TritonPythonModel:\n    pass\n"})
    repository = ModelRepository([server.location("models", prefix)])
    assert repository.remote
    assert repository.fetch() is None
    found, errors = repository.discover()
    assert (list(found), errors) == (["add"], ())
    assert repository.load("add").config.max_batch_size == 4


def test_a_repository_that_cannot_be_fetched_says_so_by_its_location(server, mirror, monkeypatch, tmp_path):
    monkeypatch.setenv(server.mount_variable, str(tmp_path))
    location = server.location("no-such-bucket")
    repository = ModelRepository([location])
    failure = repository.fetch()
    assert failure.startswith(f"model repository '{location}' cannot be read: "
                              f"cannot list {server.url('no-such-bucket/')}: ")
    found, errors = repository.discover()
    assert found == {} and errors == (failure,)


def test_a_model_whose_objects_were_not_all_fetched_does_not_load(server, mirror, monkeypatch, tmp_path):
    _, prefix = mirror
    monkeypatch.setenv(server.mount_variable, str(tmp_path))
    put_files(server, prefix, {"m/config.pbtxt": CONFIG.replace("{name}", "m"), "m/1": "a file",
                               "m/1/model.py": "and a folder"})
    repository = ModelRepository([server.location("models", prefix)])
    assert repository.fetch() is None   # the repository itself is read
    failure = repository.model_failure("m")
    assert failure.startswith(f"cannot write {server.url(f'models/{prefix}/m/1/model.py')} to ")
    assert repository.fetch("m") == failure
    assert repository.load_all().models["m"].error == f"failed to load 'm': {failure}"
    assert repository.fetch("..") is None and repository.fetch("") is None   # names left to the load to refuse


def test_an_object_that_cannot_be_written_fails_its_model_alone(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"bad/1": "a file", "bad/1/model.py": "and a folder", "good/config.pbtxt": "fine"})
    failures = mirror.sync()
    assert list(failures) == ["bad"]
    assert failures["bad"].startswith(f"cannot write {server.url(f'models/{prefix}/bad/1/model.py')} to ")
    assert files_of(mirror.root) == {"bad/1": b"a file", "good/config.pbtxt": b"fine"}
    server.delete_prefix("models", f"{prefix}/bad/1")   # both keys
    put_files(server, prefix, {"bad/1/model.py": "now a folder"})
    assert mirror.sync("bad") == {}
    assert files_of(mirror.root) == {"bad/1/model.py": b"now a folder", "good/config.pbtxt": b"fine"}


def test_a_folder_marker_is_an_empty_folder_as_an_ensemble_s_version_folder_is(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"ens/config.pbtxt": "ensemble", "ens/1/": ""})
    mirror.sync()
    assert (mirror.root / "ens" / "1").is_dir() and files_of(mirror.root) == {"ens/config.pbtxt": b"ensemble"}
    mirror.sync()   # a marker keeps its folder
    assert (mirror.root / "ens" / "1").is_dir()
    server.delete_prefix("models", f"{prefix}/ens/1/")
    mirror.sync()
    assert not (mirror.root / "ens" / "1").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "../other", "a/b"])
def test_a_name_that_is_no_model_folder_s_is_refused_before_anything_is_removed(server, mirror, name):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "kept"})
    mirror.sync()
    (mirror.root.parent / "beside.txt").write_text("beside the mirror")
    with pytest.raises(StorageError, match="is not a model folder's name"):
        mirror.sync(name)
    assert files_of(mirror.root) == {"m/config.pbtxt": b"kept"}
    assert (mirror.root.parent / "beside.txt").exists()


def test_a_snapshot_keeps_the_files_a_later_sync_replaces_or_removes(server, mirror, tmp_path):
    mirror, prefix = mirror
    put_files(server, prefix, {"m/config.pbtxt": "one", "m/1/model.py": "first"})
    mirror.sync()
    snapshot = mirror.snapshot("m", mirror.snapshots / "1" / "m")
    put_files(server, prefix, {"m/config.pbtxt": "two"})
    server.delete_prefix("models", f"{prefix}/m/1/")
    mirror.sync()
    assert files_of(snapshot) == {"config.pbtxt": b"one", "1/model.py": b"first"}
    assert files_of(mirror.root) == {"m/config.pbtxt": b"two"}


def test_a_bucket_that_cannot_be_read_fails_no_model_of_a_folder_repository(server, monkeypatch, tmp_path):
    for name, value in server.environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(server.mount_variable, str(tmp_path))
    (tmp_path / "local" / "here").mkdir(parents=True)
    location = server.location("no-such-bucket")
    repository = ModelRepository([location, str(tmp_path / "local")])
    assert repository.fetch("here") is None
    assert repository.fetch("elsewhere").startswith(f"model repository '{location}' cannot be read: ")
    assert list(repository.discover()[0]) == ["here"]


def test_names_only_gives_an_empty_folder_per_model_and_removes_the_gone_ones(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"a/config.pbtxt": "a", "a/1/model.py": "code", "b/config.pbtxt": "b"})
    mirror.sync("b")
    mirror.sync_names()
    assert sorted(path.name for path in mirror.root.iterdir()) == ["a", "b"]
    assert not any((mirror.root / "a").iterdir())   # its files come with its own fetch
    assert files_of(mirror.root) == {"b/config.pbtxt": b"b"}   # a fetched model keeps its files
    server.delete_prefix("models", f"{prefix}/b/")
    mirror.sync_names()
    assert sorted(path.name for path in mirror.root.iterdir()) == ["a"]
    server.delete_prefix("models", f"{prefix}/a/")
    put_files(server, prefix, {"b/config.pbtxt": "b again"})
    mirror.sync("b")   # the manifest forgot b's old object when its folder went: fetched again
    assert files_of(mirror.root) == {"b/config.pbtxt": b"b again"}


def test_a_stopped_mirror_ends_the_download_under_way_and_fetches_nothing_more(server, mirror):
    mirror, prefix = mirror
    put_files(server, prefix, {"a/config.pbtxt": "small", "z/config.pbtxt": "after"})
    server.put("models", f"{prefix}/m/1/model.bin", os.urandom(64 << 20))   # gigabytes, as far as the test can tell
    outcome: list = []
    syncing = threading.Thread(target=lambda: outcome.append(_raised(mirror.sync)), daemon=True)
    syncing.start()
    deadline = time.monotonic() + 60
    while not list((mirror.root / "m" / "1").glob(".tritium-download-*")) and syncing.is_alive():
        assert time.monotonic() < deadline, "the download never began"
        time.sleep(0.001)
    mirror.stop()   # the server is stopping
    syncing.join(timeout=30)
    assert not syncing.is_alive()
    assert isinstance(outcome[0], StorageError) and "was stopped: the server is stopping" in str(outcome[0])
    assert files_of(mirror.root) == {"a/config.pbtxt": b"small"}   # no partial file left, nothing after it
    with pytest.raises(StorageError, match="was stopped"):   # and a later sync ends at once
        mirror.sync()


def _raised(call):
    try:
        call()
    except Exception as exc:
        return exc
    return None


def test_the_broker_s_reader_stops_the_repository_s_fetches_when_it_closes(server, mirror, monkeypatch, tmp_path):
    _, prefix = mirror
    monkeypatch.setenv(server.mount_variable, str(tmp_path))
    repository = ModelRepository([server.location("models", prefix)])
    ModelReader(repository, threads=1).close()   # the broker stops: its exit would wait for the pool's threads
    assert "was stopped: the server is stopping" in repository.fetch()


def test_a_stopped_mirror_does_not_wait_for_the_lock_another_process_s_download_holds(tmp_path):
    mirror = CloudMirror(bucket_for("s3://b/models"), tmp_path / "mirror")   # (never listed: it waits first)
    (tmp_path / "mirror").mkdir()
    with open(tmp_path / "mirror" / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)   # as another process's sync holds it
        outcome: list = []
        syncing = threading.Thread(target=lambda: outcome.append(_raised(mirror.sync)), daemon=True)
        syncing.start()
        syncing.join(timeout=0.5)
        assert syncing.is_alive()   # waiting for the lock
        mirror.stop()
        syncing.join(timeout=10)
        assert not syncing.is_alive()
    assert isinstance(outcome[0], StorageError) and "was stopped: the server is stopping" in str(outcome[0])


@pytest.mark.parametrize("url, expected", [
    ("s3://b/m", "reading a model repository from S3 needs boto3: pip install 'tritium[s3]'"),
    ("gs://b/m", "reading a model repository from Google Cloud Storage needs google-cloud-storage: "
                 "pip install 'tritium[gcs]'"),
    ("as://a/c/m", "reading a model repository from Azure Storage needs azure-storage-blob: "
                   "pip install 'tritium[azure]'"),
])
def test_a_store_whose_client_library_is_not_installed_says_what_to_install(url, expected):
    bucket = bucket_for(url)
    bucket.require_client()   # (installed here)
    bucket.client_module = "tritium_tests_absent_module"   # as on a host without the extra
    with pytest.raises(StorageError, match=f"^{expected.replace('[', '.').replace(']', '.')}$"):
        bucket.require_client()
