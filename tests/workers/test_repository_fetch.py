"""The worker agent's fetch of S3 models: off its loop, with the broker's later messages held
behind it in the order they came, against a real S3 server (moto's, over HTTP)."""

from __future__ import annotations

import os
import select
import time

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


def assign(model: str, files: dict | None = None, epoch: int = 7) -> Assign:
    return Assign((Assignment(model, 1, epoch, {}, files=files),))


def files_of(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def completed_after_wake(fetcher: RepositoryFetcher) -> list:
    readable, _, _ = select.select([fetcher.wake_fd], [], [], 30)
    assert readable, "the fetch never finished"
    return fetcher.completed()


def test_a_folder_repository_hands_every_message_back_at_once(tmp_path):
    fetcher = RepositoryFetcher((str(tmp_path),))
    message = assign("m")
    assert fetcher.arrived(message) == [message]
    assert fetcher.wake_fd is None and fetcher.roots == (tmp_path,)


def test_loads_scalings_and_unloads_wait_for_a_fetch_in_order_and_the_rest_is_handled_at_once(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    load, unload, heartbeat = assign("m"), Unassign((LoadRef("m", 1, 7),)), Heartbeat(boot=1)
    scale = Scale(Assignment("m", 1, 7, {}), count=2)
    assert fetcher.arrived(load) == []
    assert fetcher.arrived(scale) == []
    assert fetcher.arrived(heartbeat) == [heartbeat]   # the broker's liveness is not held up
    assert fetcher.arrived(unload) == []
    assert completed_after_wake(fetcher) == [load, scale, unload]   # the load's snapshot serves the scaling
    snapshot = fetcher.model_dir(load.models[0])
    assert files_of(snapshot) == {"config.pbtxt": b"config", "1/model.py": b"code"}
    assert snapshot.parent.parent.parent.name == "snapshots"   # snapshots/agent-*/*/m


def test_a_load_s_instances_run_from_its_snapshot_whatever_the_bucket_does_next(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    first, second = assign("m", epoch=1), assign("m", epoch=2)
    assert fetcher.arrived(first) == [] and completed_after_wake(fetcher) == [first]
    s3.put("models", "repo/m/1/model.py", "new code")
    assert fetcher.arrived(second) == [] and completed_after_wake(fetcher) == [second]
    first_dir, second_dir = fetcher.model_dir(first.models[0]), fetcher.model_dir(second.models[0])
    assert (first_dir / "1" / "model.py").read_text() == "code"
    assert (second_dir / "1" / "model.py").read_text() == "new code"
    fetcher.release(1)   # the first load unloaded
    fetcher.collect({second_dir})
    assert not first_dir.exists() and second_dir.exists()
    fetcher.close()   # the agent stops
    assert not second_dir.exists() and list(second_dir.parents[2].iterdir()) == []


def test_a_load_with_shipped_files_fetches_nothing(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    shipped = assign("m", files={"config.pbtxt": "c2FtZQ=="})
    assert fetcher.arrived(shipped) == [shipped]


def test_a_fetch_that_failed_fails_its_load_until_one_succeeds(s3, mount):
    fetcher = RepositoryFetcher((s3.location("made-later", "repo"),))
    load, again = assign("m"), assign("m", epoch=8)
    assert fetcher.arrived(load) == []
    assert completed_after_wake(fetcher) == [load]
    with pytest.raises(LookupError, match=f"cannot list s3://{s3.host_port}/made-later/repo/m/: "):
        fetcher.model_dir(load.models[0])
    s3.client.create_bucket(Bucket="made-later")
    s3.put("made-later", "repo/m/config.pbtxt", "config")
    assert fetcher.arrived(again) == []
    assert completed_after_wake(fetcher) == [again]
    assert files_of(fetcher.model_dir(again.models[0])) == {"config.pbtxt": b"config"}


def test_a_broker_that_forgot_the_host_gets_the_held_unloads_and_not_the_held_loads(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    first = assign("m", epoch=3)
    assert fetcher.arrived(first) == [] and completed_after_wake(fetcher) == [first]
    load, unload = assign("m", epoch=4), Unassign((LoadRef("m", 1, 3),))
    assert fetcher.arrived(load) == [] and fetcher.arrived(unload) == []
    fetcher.broker_is(1)
    assert fetcher.reset() == [unload]
    assert completed_after_wake(fetcher) == []   # the fetch started before the reset ends unheard
    with pytest.raises(LookupError):
        fetcher.model_dir(load.models[0])
    abandoned = [path for path in fetcher.model_dir(first.models[0]).parents[1].glob("*/m")
                 if path != fetcher.model_dir(first.models[0])]
    assert len(abandoned) == 1   # what the abandoned fetch took: retired, removed when unused
    fetcher.collect(set())
    assert not abandoned[0].exists()
    fetcher.broker_is(1)
    kept = fetcher.model_dir(first.models[0])
    assert kept.is_dir()   # the same broker: its loads keep their snapshots
    fetcher.broker_is(2)   # another broker process (a heartbeat's or a reset's boot): its epochs are its own
    with pytest.raises(LookupError):
        fetcher.model_dir(first.models[0])
    fetcher.collect({kept})   # an adopted instance still runs from it
    assert kept.is_dir()
    fetcher.collect(set())
    assert not kept.exists()


def test_an_unloaded_load_s_snapshot_goes_once_no_instance_runs_from_it(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    load = assign("m", epoch=5)
    assert fetcher.arrived(load) == [] and completed_after_wake(fetcher) == [load]
    snapshot = fetcher.model_dir(load.models[0])
    fetcher.release(5)
    fetcher.collect({snapshot})   # its instances are still stopping
    assert snapshot.is_dir()
    fetcher.collect(set())
    assert not snapshot.exists()


def test_a_model_in_a_folder_repository_beside_a_bucket_is_read_where_it_is(s3, mount, tmp_path):
    local = tmp_path / "local"
    (local / "here").mkdir(parents=True)
    fetcher = RepositoryFetcher((s3.location("models", "repo"), str(local)))
    load = assign("here")
    assert fetcher.arrived(load) == [] and completed_after_wake(fetcher) == [load]
    assert fetcher.model_dir(load.models[0]) is None   # the agent reads its roots
    unreadable = RepositoryFetcher((s3.location("no-such-bucket", "repo"), str(local)))
    assert unreadable.arrived(load) == [] and completed_after_wake(unreadable) == [load]
    assert unreadable.model_dir(load.models[0]) is None   # the bucket's failure is not the folder's model's


@pytest.mark.parametrize("name", ["..", ".", "", "a/b"])
def test_a_name_that_is_no_model_folder_s_fails_its_load_and_links_nothing(s3, mount, name):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    load = assign(name)
    assert fetcher.arrived(load) == [] and completed_after_wake(fetcher) == [load]
    with pytest.raises(LookupError, match=f"cannot place model '{name}': "):
        fetcher.model_dir(load.models[0])
    assert not list(mount.rglob("snapshots/*/*"))


def test_a_draining_host_gets_its_held_messages_back_and_fetches_nothing_more(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    load, unload, later = assign("m"), Unassign((LoadRef("m", 1, 2),)), assign("m", epoch=9)
    assert fetcher.arrived(load) == [] and fetcher.arrived(unload) == []
    assert fetcher.start_draining() == [load, unload]
    assert fetcher.arrived(later) == [later]
    assert completed_after_wake(fetcher) == []   # the fetch the drain stopped waiting for ends unheard


def test_an_agent_s_abandoned_snapshots_are_removed_and_a_live_agent_s_kept(s3, mount):
    first = RepositoryFetcher((s3.location("models", "repo"),))
    load = assign("m")
    assert first.arrived(load) == [] and completed_after_wake(first) == [load]
    live = first.model_dir(load.models[0])
    snapshots = live.parents[2]
    abandoned = snapshots / "agent-killed"
    (abandoned / "tmp1" / "m").mkdir(parents=True)
    (abandoned / ".lock").touch()
    long_ago = time.time() - 3600
    for path in (abandoned, live.parents[1]):   # both old enough; only the first has no agent
        os.utime(path, (long_ago, long_ago))
    second = RepositoryFetcher((s3.location("models", "repo"),))
    again = assign("m", epoch=8)
    assert second.arrived(again) == [] and completed_after_wake(second) == [again]
    assert not abandoned.exists()
    assert live.is_dir() and second.model_dir(again.models[0]).is_dir()


def test_a_closed_fetcher_stops_its_fetches(s3, mount):
    fetcher = RepositoryFetcher((s3.location("models", "repo"),))
    fetcher.close()   # the agent stops: a fetch under way (or a later one) ends at once
    load = assign("m")
    assert fetcher.arrived(load) == []
    assert completed_after_wake(fetcher) == [load]
    with pytest.raises(LookupError, match="was stopped: the server is stopping"):
        fetcher.model_dir(load.models[0])
