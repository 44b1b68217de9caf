"""The worker agent's fetch of S3 models: off its loop, with the broker's later messages held
behind it in the order they came, against a real S3 server (moto's, over HTTP)."""

from __future__ import annotations

import select

import pytest

from tests.s3_server import CREDENTIALS, s3_server
from tritium.protocol import Assign, Assignment, Heartbeat, LoadRef, Scale, Unassign
from tritium.workers.repository_fetch import RepositoryFetcher


@pytest.fixture(scope="module")
def s3():
    with pytest.MonkeyPatch.context() as patch, s3_server("models") as server:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)
        server.put("models", "repo/m/config.pbtxt", "config")
        server.put("models", "repo/m/1/model.py", "code")
        yield server


@pytest.fixture
def mount(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path))
    return tmp_path


def assign(model: str, files: dict | None = None) -> Assign:
    return Assign((Assignment(model, 1, 7, {}, files=files),))


def completed_after_wake(fetcher: RepositoryFetcher) -> list:
    readable, _, _ = select.select([fetcher.wake_fd], [], [], 30)
    assert readable, "the fetch never finished"
    return fetcher.completed()


def test_a_folder_repository_hands_every_message_back_at_once(tmp_path):
    fetcher = RepositoryFetcher((str(tmp_path),))
    message = assign("m")
    assert fetcher.arrived(message) == [message]
    assert fetcher.wake_fd is None and fetcher.roots == (tmp_path,)


def test_messages_after_a_load_wait_for_its_fetch_and_keep_their_order(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    before, load, unload, heartbeat = Heartbeat(boot=1), assign("m"), Unassign((LoadRef("m", 1, 7),)), Heartbeat(boot=1)
    try:
        assert fetcher.arrived(before) == [before]   # nothing to fetch for it
        assert fetcher.arrived(load) == []
        assert fetcher.arrived(unload) == []
        assert fetcher.arrived(heartbeat) == []
        assert completed_after_wake(fetcher) == [load, unload, heartbeat]
        model = fetcher.roots[0] / "m"
        assert (model / "config.pbtxt").read_text() == "config" and (model / "1" / "model.py").read_text() == "code"
        assert fetcher.failure("m") is None
    finally:
        fetcher.close()


def test_a_load_with_shipped_files_fetches_nothing_and_a_scale_fetches_its_model(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    shipped = assign("m", files={"config.pbtxt": "c2FtZQ=="})
    scale = Scale(Assignment("m", 1, 7, {}), count=2)
    try:
        assert fetcher.arrived(shipped) == [shipped]
        assert fetcher.arrived(scale) == []
        assert completed_after_wake(fetcher) == [scale]
    finally:
        fetcher.close()


def test_a_fetch_that_fails_is_remembered_for_its_model_until_one_succeeds(s3, mount):
    fetcher = RepositoryFetcher((s3.location("no-such-bucket", "repo"),))
    load = assign("m")
    try:
        assert fetcher.arrived(load) == []
        assert completed_after_wake(fetcher) == [load]
        assert "cannot list s3://no-such-bucket/repo/m/: " in fetcher.failure("m")
        assert fetcher.failure("other") is None
    finally:
        fetcher.close()
