"""The autoscaler's decisions with a fake clock: placement, cold starts, room, hosts leaving, reloads."""

from __future__ import annotations

import pytest

from tritium.repo.autoscale import AutoscalePolicy
from tritium.broker.registry import InstanceRecord, ModelVersion, VersionState
from tritium.broker.startup_hold import StartupHold
from tests.broker.scheduler_world import definition, lose, submit
from tritium.protocol import BatchDone, decode
from tests.broker.autoscale_world import SCALED, World

COOLDOWN_S = AutoscalePolicy().cooldown_s


def errors(world: World) -> list[str]:
    return [decode(p[1])[0]["err"]["message"] for p in world.to_gateways]


def test_the_minimum_goes_to_the_host_with_the_most_room():
    world = World("min=2,max=4", {b"a": 1, b"b": 3})
    assert world.autoscaler.start(world.version) is False
    assert world.scales() == [(b"b", 1, []), (b"b", 2, [])]


def test_a_request_to_a_model_at_zero_starts_one_instance_and_counts_the_cold_start():
    world = World("min=0,max=2", {b"a": 2})
    assert world.autoscaler.start(world.version) is True and world.scales() == []
    submit(world.scheduler, b"gw", 1)
    assert world.scales() == [(b"a", 1, [])] and world.to_gateways == []
    world.clock.now += 400_000_000
    world.join(b"a", "m_0")
    assert world.version.scale.cold_starts == 1 and world.version.scale.cold_start_ns_total == 400_000_000


def test_with_no_room_anywhere_a_cold_start_answers_at_once():
    world = World("min=0,max=2", {b"a": 0})
    world.autoscaler.start(world.version)
    submit(world.scheduler, b"gw", 1)
    assert errors(world) == ["no instance of model 'm' version 1 is running"]


def test_the_limit_counts_autoscaled_instances_only():
    world = World("min=1,max=4", {b"a": 1})
    world.registry.instances[b"fixed"] = InstanceRecord(b"fixed", b"a", "other", 1, "other_0", 2, epoch=9)
    world.autoscaler.start(world.version)
    assert world.scales() == [(b"a", 1, [])]


def test_a_lost_host_is_replaced_on_another_below_the_minimum():
    world = World("min=1,max=4", {b"a": 2, b"b": 1})
    world.autoscaler.start(world.version)
    assert world.scales() == [(b"a", 1, [])]
    del world.registry.agents[b"a"]
    world.autoscaler.agent_left(b"a")
    world.clock.now += int(COOLDOWN_S * 1e9)
    world.autoscaler.evaluate()
    assert world.scales()[-1] == (b"b", 1, [])


@pytest.mark.parametrize("setting, cooldown_s", [("", COOLDOWN_S), (",cooldown_s=0.5", 0.5)],
                         ids=["default", "the model's own"])
def test_a_queue_that_waits_too_long_adds_an_instance_then_cools_down(setting, cooldown_s):
    world = World("min=1,max=4,target_queue_ms=20" + setting, {b"a": 4})
    world.autoscaler.start(world.version)
    busy = world.join(b"a", "m_0")
    busy.credit = 0
    submit(world.scheduler, b"gw", 1)
    world.clock.now += int(cooldown_s * 1e9)   # past the cooldown of the first placement
    world.autoscaler.evaluate()
    assert world.scales()[-1] == (b"a", 2, [])
    world.join(b"a", "m_1").credit = 0
    world.clock.now += int(cooldown_s * 1e9) - 100_000_000
    world.autoscaler.evaluate()
    assert len(world.scales()) == 2, "no second step within the cooldown"
    world.clock.now += 100_000_000
    world.autoscaler.evaluate()
    assert world.scales()[-1] == (b"a", 3, [])


def test_idleness_drains_one_idle_instance_and_names_it_in_the_scale_down():
    world = World("min=1,max=4,idle_s=10", {b"a": 4})
    world.autoscaler.start(world.version)
    world.version.scale.targets[b"a"] = 2
    world.join(b"a", "m_0")
    second = world.join(b"a", "m_1")
    world.clock.now += 11_000_000_000
    world.autoscaler.evaluate()
    assert world.scales()[-1] == (b"a", 1, ["m_1"]) and second.draining


def test_an_instance_still_answering_a_decoupled_request_after_its_execute_is_not_the_one_drained():
    """Its execute returned, so no batch is in flight, but its threads or coroutines still answer."""
    world = World("min=1,max=4,idle_s=10", {b"a": 4})
    world.autoscaler.start(world.version)
    world.version.scale.targets[b"a"] = 2
    first = world.join(b"a", "m_0")
    second = world.join(b"a", "m_1")
    first.credit = 0
    submit(world.scheduler, b"gw", 1)
    (number,) = second.inflight
    world.scheduler.batch_done(second.iid, BatchDone(number, [True], [], (1, 2, 3), still_open=[]), [])
    assert not second.inflight and world.scheduler.holds_work([second])
    world.clock.now += 11_000_000_000
    world.autoscaler.evaluate()
    assert world.scales()[-1] == (b"a", 1, ["m_0"]) and first.draining and not second.draining


def test_a_reload_may_use_the_slots_of_the_load_it_replaces():
    world = World("min=1,max=1", {b"a": 1})
    world.autoscaler.start(world.version)
    reload = ModelVersion("m", 1, definition(SCALED % "min=1,max=1"), epoch=2, replaces=world.version)
    world.registry.epochs[2] = reload
    assert world.autoscaler.start(reload) is False
    assert world.scales()[-1] == (b"a", 1, [])
    assert reload.scale.targets == {b"a": 1}


def test_losing_the_last_instance_changes_what_gateways_see():
    world = World("min=1,max=1", {b"a": 1})
    world.autoscaler.start(world.version)
    instance = world.join(b"a", "m_0")
    generation = world.registry.generation
    lose(world.scheduler, instance.iid, "was killed by signal 9")
    assert world.registry.generation > generation


def test_a_request_held_while_a_new_broker_process_takes_the_version_over_counts_as_traffic():
    """Its idle time counts from that request (not from the load), and nothing is placed for it."""
    world = World("min=1,max=4,idle_s=10", {b"a": 4})
    world.autoscaler.start(world.version)
    placed = world.scales()
    world.version.state = VersionState.LOADING
    world.scheduler.hold = StartupHold(10.0, world.clock)
    world.clock.now += 5_000_000_000
    submit(world.scheduler, b"gw", 1)
    assert len(world.version.batcher) == 1, "held for the version"
    assert world.version.scale.last_request_ns == world.clock.now and world.scales() == placed



def test_a_minimum_loaded_before_any_host_registered_is_placed_whole_once_one_does():
    """Not one instance per cooldown after a failed placement: nothing is tried until a host is there."""
    world = World("min=2,max=4", {}, hold_s=10.0)
    world.version.state = VersionState.LOADING
    assert world.autoscaler.start(world.version) is False
    world.autoscaler.evaluate()
    assert world.scales() == [] and world.version.scale.next_step_ns == 0
    world.clock.now += 1_000_000_000
    world.host_registers(b"a", 4)
    world.autoscaler.evaluate()
    assert world.scales() == [(b"a", 1, []), (b"a", 2, [])]


def test_a_request_before_any_host_registered_waits_and_its_wait_counts_in_the_cold_start():
    world = World("min=0,max=2", {}, hold_s=10.0)
    world.autoscaler.start(world.version)
    submit(world.scheduler, b"gw", 1)
    assert len(world.version.batcher) == 1 and world.to_gateways == [] and world.scales() == []
    world.clock.now += 1_000_000_000
    world.host_registers(b"a", 2)
    world.autoscaler.evaluate()
    assert world.scales() == [(b"a", 1, [])]
    world.clock.now += 400_000_000
    world.join(b"a", "m_0")
    assert world.version.scale.cold_starts == 1 and world.version.scale.cold_start_ns_total == 1_400_000_000


def test_a_takeover_awaits_every_host_before_placing_a_minimum_so_that_kept_instances_are_not_stopped():
    """Two hosts each still run one instance of a min=2,max=2 model: placing the minimum when the
    first registered would leave no room (max) for the second one's instance."""
    world = World("min=2,max=2", {}, hold_s=10.0)
    world.version.state = VersionState.LOADING
    world.autoscaler.start(world.version)
    world.host_registers(b"a", 4, keeps=1)
    world.autoscaler.evaluate()
    assert world.scales() == [], "the other hosts have a heartbeat and a reconnection to register"
    world.clock.now += 500_000_000
    world.host_registers(b"b", 4, keeps=1)
    world.clock.now += 600_000_000   # past rejoin_s after the first
    world.autoscaler.evaluate()
    assert world.scales() == [] and world.version.scale.targets == {b"a": 1, b"b": 1}


def test_a_takeover_places_a_missing_minimum_once_the_hosts_had_their_time_to_register():
    world = World("min=2,max=2", {}, hold_s=10.0)
    world.version.state = VersionState.LOADING
    world.autoscaler.start(world.version)
    world.host_registers(b"a", 4, keeps=1)
    world.clock.now += 1_100_000_000
    world.autoscaler.evaluate()
    assert world.scales() == [(b"a", 2, [])]
