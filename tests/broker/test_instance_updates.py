"""In-place instance updates, driven through the broker's lifecycle with the agent's and the
instances' messages played by hand (the end-to-end tests in tests/e2e/test_instance_updates.py
run them with real processes)."""

from __future__ import annotations

from tritium.broker.registry import InstanceRecord, VersionState
from tests.broker.lifecycle_world import CONFIG, World
from tests.repo.helpers import PLAIN_PY_MODEL, write_model
from tritium.protocol import Kind, Placed


def write_groups(world: World, count: int) -> None:
    """The model's config, its instance groups ``count`` instances (its model.py written only once:
    a model file written again is a reload of the whole model)."""
    config = CONFIG.format(batch=8) + f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    first = not (world.root / "m").exists()
    write_model(world.root, "m", config, {"1/model.py": PLAIN_PY_MODEL} if first else None)


def serving(world: World):
    """Version 1 of ``m`` READY with one instance, m_0_0."""
    write_groups(world, 1)
    world.load()
    version = world.loading()
    world.lifecycle.placed(Placed("m", 1, version.epoch, None, instances=["m_0_0"]), b"agent")
    join(world, version, "m_0_0")
    assert version.state == VersionState.READY and world.replies == [{}]
    world.replies.clear()
    world.sent.clear()
    return version


def join(world: World, version, key: str) -> InstanceRecord:
    iid = f"agent/m/1/{version.epoch}/{key}".encode()
    instance = InstanceRecord(iid, b"agent", "m", 1, key, 2, epoch=version.epoch,
                              draining=world.lifecycle.instance_updates.holds(version, b"agent", key))
    world.registry.instances[iid] = instance
    version.instances.append(instance)
    world.lifecycle.instance_joined(version, key, b"agent")
    return instance


def answer(world: World, version, instances: list[str], kept: list[str], leaving: list[str] = ()) -> None:
    world.lifecycle.placed(Placed("m", 1, version.epoch, None, update=True, instances=instances, kept=kept,
                                  leaving=list(leaving)), b"agent")


def assigned_counts(world: World) -> list[int]:
    return [message["models"][0]["config"]["instance_group"][0]["count"]
            for message in world.sent if message["k"] == Kind.ASSIGN and message["models"][0].get("update")]


def test_a_failed_update_is_undone_by_a_second_round_and_answered_once(tmp_path):
    world = World(tmp_path)
    version = serving(world)
    write_groups(world, 2)
    world.load()
    assert assigned_counts(world) == [2] and world.replies == []
    answer(world, version, ["m_0_0", "m_0_1"], kept=["m_0_0"])
    updates = world.lifecycle.instance_updates
    updates.failed(version, b"agent", "m_0_1", "initialize refused")
    assert world.kinds().count(Kind.UNASSIGN) == 0, "a creation is seen through before its update fails"
    updates.exited(version, b"agent", "m_0_1", "exited with status 3", expected=True)
    # The new instance is stopped, and the hosts get the serving groups again; the load waits for that round.
    assert [m["models"][0]["instances"] for m in world.sent if m["k"] == Kind.UNASSIGN] == [["m_0_1"]]
    assert assigned_counts(world) == [2, 1] and world.replies == []
    world.lifecycle.placed(Placed("m", 1, version.epoch, None, instances=["m_0_0"]), b"agent")   # not an answer
    assert world.replies == []
    answer(world, version, ["m_0_0"], kept=["m_0_0"])
    (reply,) = world.replies
    assert reply.message == ("load failed for model 'm': version 1 is at READY state: initialize refused;\n")
    assert version.state == VersionState.READY and version.reason == "initialize refused"
    assert version.definition.config.instance_group[0].count == 1
    assert world.table_config()["instance_group"][0]["count"] == 1


def test_a_leaving_instance_holding_a_sequence_lets_the_load_answer_and_stops_once_it_ends(tmp_path):
    world = World(tmp_path)
    write_model(world.root, "m", CONFIG.format(batch=8) + """
        sequence_batching { direct { } }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        """, {"1/model.py": PLAIN_PY_MODEL})
    world.load()
    version = world.loading()
    world.lifecycle.placed(Placed("m", 1, version.epoch, None, instances=["m_0_0", "m_0_1"]), b"agent")
    join(world, version, "m_0_0")
    leaving = join(world, version, "m_0_1")
    world.replies.clear()
    slots = version.batcher._slots_of(leaving)   # a sequence bound to the instance that will leave
    slots.sequences[0], slots.free = object(), slots.free[1:]
    config = world.root / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 2", "count: 1"))
    world.load()
    answer(world, version, ["m_0_0"], kept=["m_0_0"], leaving=["m_0_1"])
    assert world.replies == [{}], "answered without waiting for the sequence"
    assert leaving.draining and world.kinds().count(Kind.UNASSIGN) == 0
    assert world.lifecycle.instance_updates.lingering(version)
    slots.sequences[0], slots.free = None, [0, *slots.free]   # the sequence ended
    world.lifecycle.instance_updates.check()
    assert [m["models"][0]["instances"] for m in world.sent if m["k"] == Kind.UNASSIGN] == [["m_0_1"]]
    world.membership.remove_instance(leaving.iid, "exited", restart_expected=False)
    world.lifecycle.instance_updates.check()
    assert not world.lifecycle.instance_updates.lingering(version)
    assert world.replies == [{}], "the load is answered once"


def test_a_config_saved_again_unchanged_keeps_the_load_and_its_identity(tmp_path):
    world = World(tmp_path)
    version = serving(world)
    config = world.root / "m" / "config.pbtxt"
    text = config.read_text()
    config.unlink()
    config.write_text(text)   # a new file, a new time, the same text
    world.load()
    assert world.replies == [{}] and world.sent == [], "nothing is reloaded or updated"
    # A broker started again computes the same identity, so it adopts the running instances.
    again = World(tmp_path)
    again.load()
    assert again.loading().identity == version.identity
