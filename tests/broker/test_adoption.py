"""Which running instances a restarted broker keeps, and the autoscaled counts it takes over."""

from __future__ import annotations

from tritium.broker.adoption import Adoption
from tritium.broker.registry import ModelVersion, load_identity
from tests.broker.autoscale_world import World
from tests.broker.scheduler_world import CONFIG, definition
from tritium.protocol import Assignment, Reset, RunningInstance


def loaded(epoch: int = 4, config: str = CONFIG, identity: str = "abc") -> ModelVersion:
    version = ModelVersion("m", 1, definition(config), epoch=epoch)
    version.identity = identity
    return version


def running(iid: str, identity: str = "abc", model: str = "m", version: int = 1,
            scaled: bool = False) -> RunningInstance:
    return RunningInstance(iid, model, version, identity, iid.rsplit("/", 1)[-1], "m_0", "CPU", 0, 1, scaled, 1)


def test_only_instances_of_the_same_model_version_and_load_identity_are_offered():
    adoption = Adoption()
    adoption.announce(b"a", [running("a/m_0"), running("a/m_1", identity="changed"), running("a/x", model="x"),
                             running("a/v2", version=2), running("a/s", scaled=True)])
    adoption.announce(b"b", [running("b/m_0")])
    offered = adoption.offer(Assignment("m", 1, 4, {}), loaded(), b"a")
    assert offered.adopt == ("a/m_0",)
    assert adoption.offer(Assignment("m", 1, 4, {}), loaded(identity=""), b"a").adopt == ()


def test_a_kept_instance_is_told_the_new_boot_and_epoch_until_it_says_hello():
    adoption = Adoption()
    adoption.announce(b"a", [running("a/m_0"), running("a/m_1")])
    assert adoption.pending(b"a/m_0") and adoption.rejoin(b"a/m_0", 77) is None
    version = loaded(epoch=9)
    assert adoption.placed(version, {"m_0": "a/m_0", "bogus": "a/unknown"}) == [b"a/m_0"]
    assert adoption.rejoin(b"a/m_0", 77) == Reset(77, 9)
    assert not adoption.pending(b"a/m_0") and adoption.pending(b"a/m_1")
    adoption.forget(b"a/m_0")
    assert adoption.rejoin(b"a/m_0", 77) is None


def test_an_agent_registering_again_or_lost_takes_its_offers_with_it():
    adoption = Adoption()
    adoption.announce(b"a", [running("a/m_0"), running("a/m_1")])
    adoption.placed(loaded(), {"m_0": "a/m_0"})
    adoption.announce(b"a", [])
    assert not adoption.pending(b"a/m_1") and adoption.rejoin(b"a/m_0", 1) is None


def test_shipped_files_are_never_adopted():
    adoption = Adoption()
    adoption.announce(b"a", [running("a/m_0")])
    version = loaded()
    version.files = {"1/model.py": b"x"}
    assert adoption.candidates(version, b"a") == []


def test_the_load_identity_follows_config_files_and_folder_contents():
    base = load_identity({"name": "m"}, None, (("1/model.py", 10, 1),))
    assert base == load_identity({"name": "m"}, None, (("1/model.py", 10, 1),))
    assert base != load_identity({"name": "m", "max_batch_size": 2}, None, (("1/model.py", 10, 1),))
    assert base != load_identity({"name": "m"}, {"1/model.py": b"x"}, (("1/model.py", 10, 1),))
    assert base != load_identity({"name": "m"}, None, (("1/model.py", 11, 2),))


def test_an_autoscaled_model_keeps_the_count_its_host_still_runs_within_its_maximum():
    world = World("min=1,max=3", {b"a": 4, b"b": 4})
    world.version.scale = None
    assert world.autoscaler.adopt(world.version, b"a", 2) == 0   # not started by the autoscaler: nothing
    world.autoscaler.start(world.version)                        # min=1: one instance asked of a host
    first = next(iter(world.version.scale.targets))
    other = b"b" if first == b"a" else b"a"
    assert world.autoscaler.adopt(world.version, other, 5) == 2   # 1 + 2 = max
    assert world.version.scale.total == 3
