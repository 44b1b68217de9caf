"""The scheduler under the rate limiter: batches start only with their instance's resources free,
instances take turns by executions times priority, and a version waiting for resources holds
back those ranked after it."""

from __future__ import annotations

from tests.broker.scheduler_world import CONFIG, Clock, definition, done, lose, sent_batch, submit
from tritium.broker.liveness import PeerLiveness
from tritium.broker.membership import Membership
from tritium.broker.rate_limiter import RateLimiter, ResourceFlag
from tritium.broker.registry import InstanceRecord, ModelRecord, ModelVersion, Registry, VersionState
from tritium.broker.scheduler import Scheduler


class World:
    """Models that do not batch (one request, one batch), instances registered with the limiter."""

    def __init__(self, *flags: ResourceFlag) -> None:
        self.registry = Registry()
        self.to_instances: list[list] = []
        self.limiter = RateLimiter(flags)
        self.scheduler = Scheduler(self.registry, self.to_instances.append, [].append, Clock(),
                                   rate_limiter=self.limiter)
        self._epochs = 0

    def model(self, name: str, groups: str, sequence: bool = False) -> ModelVersion:
        self._epochs += 1
        text = CONFIG.replace('name: "m"', f'name: "{name}"') + groups
        if sequence:
            text += "sequence_batching { }"
        version = ModelVersion(name, 1, definition(text), epoch=self._epochs)
        version.state = VersionState.READY
        record = ModelRecord(name)
        record.versions[1] = version
        self.registry.models[name] = record
        self.registry.versions[version.key] = version
        self.registry.epochs[version.epoch] = version
        return version

    def instance(self, version: ModelVersion, name: str, group: int = 0, credit: int = 2) -> InstanceRecord:
        instance = InstanceRecord(name.encode(), b"agent", version.name, 1, name, credit, epoch=version.epoch,
                                  group=group)
        self.limiter.register_from_config(instance, version.definition.config)
        self.registry.instances[instance.iid] = instance
        version.instances.append(instance)
        return instance

    def serve(self, name: str, groups: str, *instances: str, sequence: bool = False) -> None:
        """A model and its instances (all of its first group)."""
        version = self.model(name, groups, sequence)
        for instance in instances:
            self.instance(version, instance)

    def submit(self, model: str, rid: int, **kwargs) -> None:
        submit(self.scheduler, b"gw", rid, model=model, **kwargs)

    def started(self) -> list[tuple[bytes, list[int]]]:
        """(instance, request ids) of every batch sent so far, in order."""
        return [(iid, rids) for iid, _, rids in map(sent_batch, self.to_instances)]

    def finish(self, index: int) -> None:
        """The ``index``-th batch sent is done."""
        iid, header, rids = sent_batch(self.to_instances[index])
        self.scheduler.batch_done(iid, *done(header["b"], rids))


def group(resources: str = "", priority: int = 0, count: int = 1) -> str:
    return f"{{ kind: KIND_CPU count: {count} rate_limiter {{ {resources} priority: {priority} }} }}"


def resource(name: str, count: int, shared: bool = False) -> str:
    return f'resources [ {{ name: "{name}" count: {count} global: {"true" if shared else "false"} }} ]'


def two_models_sharing_one_resource(world: World) -> None:
    """Models a and b, an instance each (a0, b0), each needing one R; request 1 to a, then 2 to b."""
    for name in ("a", "b"):
        world.serve(name, f"instance_group [ {group(resource('R', 1))} ]", f"{name}0")
    world.submit("a", 1)
    world.submit("b", 2)


def test_two_models_needing_the_one_resource_run_one_batch_at_a_time():
    world = World(ResourceFlag("R", 1))
    two_models_sharing_one_resource(world)
    assert world.started() == [(b"a0", [1])]   # b waits, though its instance is idle
    assert world.limiter.in_use("R") == 1
    world.finish(0)
    assert world.started() == [(b"a0", [1]), (b"b0", [2])]


def test_an_instance_runs_one_batch_at_a_time_even_with_credit_for_two():
    world = World()
    m = world.model("m", f"instance_group [ {group(resource('R', 1))} ]")
    world.instance(m, "i0", credit=2)
    for rid in (1, 2):
        world.submit("m", rid)
    assert world.started() == [(b"i0", [1])]
    world.finish(0)
    assert world.started() == [(b"i0", [1]), (b"i0", [2])]


def test_instances_without_resources_are_not_held_back():
    world = World()
    m = world.model("m", f"instance_group [ {group(count=2)} ]")
    world.instance(m, "i0")
    world.instance(m, "i1")
    for rid in (1, 2):
        world.submit("m", rid)
    assert world.started() == [(b"i0", [1]), (b"i1", [2])]


def test_a_priority_of_two_gets_half_the_turns_of_a_priority_of_one():
    world = World()
    m = world.model("m", f"instance_group [ {group(resource('R', 1), priority=1)}, "
                         f"{group(resource('R', 1), priority=2)} ]")
    world.instance(m, "one", group=0)
    world.instance(m, "two", group=1)
    for rid in range(1, 13):
        world.submit("m", rid)
    for index in range(12):   # R: 1, so one batch at a time; each done in turn
        world.finish(index)
    picks = [iid for iid, _ in world.started()]
    assert len(picks) == 12 and (picks.count(b"one"), picks.count(b"two")) == (8, 4)


def test_a_waiting_version_holds_back_instances_ranked_after_it_so_it_is_not_starved():
    world = World()
    world.serve("big", f"instance_group [ {group(resource('R', 2))} ]", "big0")
    world.serve("small", f"instance_group [ {group(resource('R', 1), count=2)} ]", "s0", "s1")
    world.submit("small", 1)
    world.submit("big", 2)          # needs both units of R: waits for small's batch
    world.submit("small", 3)        # s1 (no executions yet) ranks with big: starts on the free unit
    assert world.started() == [(b"s0", [1]), (b"s1", [3])]
    world.submit("small", 4)
    world.finish(0)                 # s0 ran once: it ranks after big, which still waits for s1
    world.submit("small", 5)
    assert world.started() == [(b"s0", [1]), (b"s1", [3])]
    world.finish(1)
    assert world.started()[2:] == [(b"big0", [2])]
    world.finish(2)
    assert world.started()[3:] == [(b"s0", [4]), (b"s1", [5])]


def test_a_lost_instance_frees_what_it_held():
    world = World()
    two_models_sharing_one_resource(world)
    assert world.started() == [(b"a0", [1])]
    lose(world.scheduler, b"a0", "exited", restart_expected=True)
    assert world.started() == [(b"a0", [1]), (b"b0", [2])]
    assert world.limiter.in_use("R") == 1


def test_an_instance_that_raises_a_default_count_lets_those_waiting_start():
    world = World()
    two_models_sharing_one_resource(world)   # R: 1, the most a or b asks for; b waits
    big = world.model("big", f"instance_group [ {group(resource('R', 2))} ]")
    world.scheduler.instance_ready(world.instance(big, "big0"))   # R: 2 now
    assert world.started() == [(b"a0", [1]), (b"b0", [2])]


def test_a_stopped_version_no_longer_counts_in_the_limits():
    world = World()
    world.serve("big", f"instance_group [ {group(resource('R', 2))} ]", "big0")
    world.serve("small", f"instance_group [ {group(resource('R', 1), count=2)} ]", "s0", "s1")
    world.submit("small", 1)
    world.submit("small", 2)
    assert world.started() == [(b"s0", [1]), (b"s1", [2])]   # R: 2, the most big asks for
    for index in (0, 1):
        world.finish(index)
    big = world.registry.versions[("big", 1)]
    Membership(world.registry, world.scheduler, PeerLiveness(1.0)).remove_stopped(big)   # big was unloaded
    world.submit("small", 3)
    world.submit("small", 4)
    assert world.started()[2:] == [(b"s0", [3])]   # R: 1 now


def test_a_version_whose_best_instance_began_draining_lets_those_now_ahead_of_it_run():
    world = World(ResourceFlag("R", 1))
    y = world.model("y", f"instance_group [ {group(resource('R', 1), priority=1)}, "
                         f"{group(resource('R', 1), priority=10)} ]")
    y0 = world.instance(y, "y0", group=0)
    world.instance(y, "y1", group=1)
    world.serve("z", f"instance_group [ {group(resource('R', 1), priority=3)} ]", "z0")
    world.serve("x", f"instance_group [ {group(resource('R', 1))} ]", "x0")
    for index, (model, rid) in enumerate((("y", 1), ("y", 2), ("z", 3))):   # ranks: y0 1, y1 10, z0 3
        world.submit(model, rid)
        world.finish(index)
    world.submit("x", 10)      # x0 (rank 0) holds R
    world.submit("y", 11)      # y waits with y0's rank, 1
    world.submit("z", 12)      # z waits behind it, with 3
    y0.draining = True         # y0's host begins draining: y's best is now y1, ranked 10
    world.finish(3)
    assert world.started()[4:] == [(b"z0", [12])]
    world.finish(4)
    assert world.started()[5:] == [(b"y1", [11])]


def test_a_stateful_model_takes_its_turn_under_steady_traffic_to_another():
    world = World()
    world.serve("other", f"instance_group [ {group(resource('R', 1))} ]", "o0")
    world.serve("seq", f"instance_group [ {group(resource('R', 1))} ]", "q0", sequence=True)
    world.submit("other", 1)
    world.submit("other", 2)
    world.submit("seq", 100, sequence_id=7, sequence_flags=1)
    for index in range(4):     # one request always queued for "other"
        world.finish(index)
        world.submit("other", 3 + index)
    assert [iid for iid, _ in world.started()][:4] == [b"o0", b"q0", b"o0", b"o0"]


def test_sequences_always_queued_do_not_starve_a_model_that_needs_more():
    world = World()
    world.serve("big", f"instance_group [ {group(resource('R', 2))} ]", "big0")
    world.serve("seq", f"instance_group [ {group(resource('R', 1), count=2)} ]", "q0", "q1", sequence=True)
    world.submit("seq", 1, sequence_id=1, sequence_flags=1)
    world.submit("seq", 2, sequence_id=2, sequence_flags=1)
    world.submit("big", 3)     # needs both units of R: waits
    for index in range(4):     # each sequence has its next request queued whenever it runs
        iid, _ = world.started()[index]
        world.submit("seq", 10 + index, sequence_id=1 if iid == b"q0" else 2)
        world.finish(index)
    assert (b"big0", [3]) in world.started()[:4]


def test_a_stateful_model_waits_for_its_instances_resources():
    world = World()
    world.serve("other", f"instance_group [ {group(resource('R', 1))} ]", "o0")
    world.serve("seq", f"instance_group [ {group(resource('R', 1))} ]", "q0", sequence=True)
    world.serve("plain", f"instance_group [ {group()} ]", "p0")
    world.submit("other", 1)
    world.submit("seq", 2, sequence_id=7, sequence_flags=1)
    world.submit("plain", 3)
    assert world.started() == [(b"o0", [1]), (b"p0", [3])]
    world.finish(0)
    assert world.started()[2:] == [(b"q0", [2])]
