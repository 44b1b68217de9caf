"""ModelLifecycle on a real repository, with the messages it sends recorded.

Agents and instances are played by the test (PLACED, HELLO), so every ordering of
events can be driven: loads answered exactly once, reloads that publish their config
only when they serve, unloads ordered after the load in progress, late host errors.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import replace

import pytest

from tritium.broker.registry import VersionState
from tritium.broker.startup_hold import StartupHold
from tests.repo.helpers import PLAIN_PY_MODEL, write_model
from tritium.errors import InvalidArgument, TritiumError, Unavailable
from tritium.protocol import Infer, Kind, Placed
from tests.broker.lifecycle_world import CONFIG, World


@pytest.fixture
def world(tmp_path):
    made = World(tmp_path)
    yield made
    made.lifecycle.close()


def test_a_load_is_answered_once_when_its_instances_are_ready(world):
    world.write()
    world.load()
    assert world.replies == []                         # still loading
    world.instance_ready(world.loading())
    assert world.replies == [{}]
    assert world.registry.versions[("m", 1)].state == VersionState.READY


def test_a_reload_publishes_its_config_only_once_it_serves(world):
    world.write(batch=8)
    world.load()
    world.instance_ready(world.loading())
    world.write(batch=4)
    world.load()
    new = world.loading()
    assert world.table_config()["max_batch_size"] == 8   # the old load serves, with its config
    world.instance_ready(new)
    assert world.table_config()["max_batch_size"] == 4
    assert world.registry.versions[("m", 1)] is new
    assert world.replies == [{}, {}]


@pytest.mark.parametrize("failure", ["its instance", "its version folder"])
def test_a_failed_reload_keeps_the_old_config_and_version(world, failure):
    world.write(batch=8)
    world.load()
    old = world.loading()
    world.instance_ready(old)
    world.write(batch=4)
    if failure == "its version folder":   # the version fails as it is read, the old one kept
        (world.root / "m" / "1" / "model.py").unlink()
    world.load()
    if failure == "its instance":
        world.lifecycle.version_failed(world.loading(), "boom")
        assert "boom" in world.replies[-1].message
    assert isinstance(world.replies[-1], TritiumError)
    assert world.table_config()["max_batch_size"] == 8
    assert world.registry.versions[("m", 1)] is old and old.state == VersionState.READY


@pytest.fixture
def retrying(tmp_path):
    """A lifecycle with --model-load-retry-count 2."""
    made = World(tmp_path, load_retries=2)
    yield made
    made.lifecycle.close()


def sent_of(world, kind: Kind) -> list[int]:
    """The epochs of the ASSIGN or UNASSIGN messages sent to agents, in order."""
    return [load["e"] for message in world.sent if message["k"] == kind for load in message["models"]]


def test_a_failed_load_is_loaded_again_until_a_try_succeeds(retrying):
    world = retrying
    world.write()
    world.load()
    first = world.loading()
    world.lifecycle.version_failed(first, "boom 1")
    second = world.loading()
    world.lifecycle.version_failed(second, "boom 2")
    third = world.loading()
    assert [first.load_attempt, second.load_attempt, third.load_attempt] == [0, 1, 2]
    assert len({first.epoch, second.epoch, third.epoch}) == 3
    assert sent_of(world, Kind.ASSIGN) == [first.epoch, second.epoch, third.epoch]
    assert sent_of(world, Kind.UNASSIGN) == [first.epoch, second.epoch]   # a failed try's instances stop
    assert world.replies == []   # the load is answered once, by the try that settles it
    world.instance_ready(third)
    assert world.replies == [{}]
    assert world.registry.versions[("m", 1)] is third and third.state == VersionState.READY


def test_a_request_held_for_a_loading_version_is_answered_when_a_try_fails_and_the_load_tries_again(retrying):
    world = retrying
    world.write()
    world.load()
    first = world.loading()
    scheduler = world.lifecycle.scheduler
    scheduler.hold = StartupHold(10.0, time.monotonic_ns)   # a new broker process, taking over
    request = Infer(5, "m", [["INPUT0", "FP32", [1, 4], 16, False]], version=1, batch_size=1)
    scheduler.submit(b"gw", request.encode([bytes(16)]), request, [])
    assert len(first.batcher) == 1 and not [m for m in world.sent if m["k"] == Kind.RESPONSE]
    world.lifecycle.version_failed(first, "boom 1")
    (answer,) = [m for m in world.sent if m["k"] == Kind.RESPONSE]
    assert answer["rid"] == 5 and answer["err"]["message"] == "model 'm' version 1 failed to load: boom 1"
    assert world.loading() is not first and len(first.batcher) == 0


@pytest.mark.parametrize("from_backend, message", [
    (False, "Request for unknown model: 'm' version 1 is not at ready state"),
    (True, "Model m - Error when running inference: Request for unknown model: 'm' version 1 is not at ready state"),
])
def test_a_request_still_held_when_the_takeover_ends_is_answered_as_on_arrival(world, from_backend, message):
    """A model's BLS call gets the words Triton's Python backend gives a call refused on arrival."""
    world.write()
    world.load()
    version = world.loading()
    scheduler = world.lifecycle.scheduler
    scheduler.hold = StartupHold(10.0, time.monotonic_ns)
    request = Infer(5, "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1)
    scheduler.submit(b"caller", request.encode([bytes(16)]), request, [], from_backend=from_backend)
    assert len(version.batcher) == 1
    scheduler.hold_ended()
    (answer,) = [m for m in world.sent if m["k"] == Kind.RESPONSE]
    assert answer["rid"] == 5 and answer["err"]["message"] == message


def test_the_server_has_started_once_its_startup_loads_settled_and_a_later_load_does_not_undo_it(world):
    world.write()
    world.write("n")
    assert not world.registry.started()   # the startup loads have not begun
    world.load()
    world.registry.startup_begun = True
    assert not world.registry.started()   # m is loading
    world.instance_ready(world.loading())
    assert world.registry.started()
    world.load("n")
    assert world.loading("n") and world.registry.started()
    assert world.registry.table().started


def test_a_load_that_fails_every_try_fails_with_the_last_error(retrying):
    world = retrying
    world.write()
    world.load()
    for attempt in range(3):
        world.lifecycle.version_failed(world.loading(), f"boom {attempt}")
    (reply,) = world.replies
    assert isinstance(reply, InvalidArgument)
    assert reply.message == "load failed for model 'm': version 1 is at UNAVAILABLE state: boom 2;\n"
    version = world.registry.versions[("m", 1)]
    assert (version.state, version.reason) == (VersionState.UNAVAILABLE, "boom 2")
    assert not any(v.state == VersionState.LOADING for v in world.registry.epochs.values())


@pytest.mark.parametrize("how", ["lost", "draining"])
def test_a_load_whose_only_host_went_away_fails_at_once_instead_of_waiting_for_a_host(retrying, how):
    world = retrying
    world.write()
    world.load()
    version = world.loading()
    world.lifecycle.placed(Placed("m", 1, version.epoch, None, instances=["i0"]), b"agent")
    if how == "lost":
        del world.registry.agents[b"agent"]   # as the broker drops a lost host, before telling the lifecycle
    else:
        world.membership.drain_agent(world.registry.agents[b"agent"])   # as Peers.drain does, first
    world.lifecycle.host_gone(b"agent", f"host host {how} while the model was loading")
    (reply,) = world.replies
    assert isinstance(reply, InvalidArgument) and f"{how} while the model was loading" in reply.message
    assert not any(v.state == VersionState.LOADING for v in world.registry.epochs.values())


def test_a_load_unloaded_while_loading_is_not_tried_again(retrying):
    world = retrying
    world.write()
    world.load()
    world.lifecycle.unload_now("m")
    assert isinstance(world.replies[-1], InvalidArgument) and "unloaded while loading" in world.replies[-1].message
    assert not any(v.state == VersionState.LOADING for v in world.registry.epochs.values())


def test_a_missing_model_file_on_reload_keeps_the_serving_version(world):
    world.write()
    world.load()
    old = world.loading()
    world.instance_ready(old)
    (world.root / "m" / "1" / "model.py").unlink()
    world.load()
    assert isinstance(world.replies[-1], TritiumError)
    assert world.registry.versions[("m", 1)] is old and old.state == VersionState.READY
    assert world.registry.models["m"].version_errors == {}
    assert world.registry.table().ready          # gateways still see it ready
    assert [e["state"] for e in world.lifecycle.index(False) if e["name"] == "m"] == ["READY"]


def test_an_unload_asked_during_a_load_runs_after_it(world):
    world.write()
    world.lifecycle.load("m", {}, world.replies.append)
    world.lifecycle.unload("m")                       # while the folder is still being read
    world.finish_reads()
    assert not world.registry.models["m"].unloaded
    world.instance_ready(world.loading())
    assert world.replies == [{}]                      # the load is answered...
    assert world.registry.models["m"].unloaded        # ...then the unload runs
    assert world.kinds()[-1] == Kind.UNASSIGN


def test_a_late_host_error_does_not_fail_a_serving_version(world):
    world.write()
    world.load()
    version = world.loading()
    world.instance_ready(version)
    world.lifecycle.placed(Placed(version.name, version.version, version.epoch, None,
                                  error=InvalidArgument("model 'm' is not in this host's model repositories")))
    assert version.state == VersionState.READY
    assert Kind.UNASSIGN not in world.kinds()


def test_file_overrides_that_cannot_be_written_fail_the_load_only(world):
    config = '{"backend": "python", "max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", ' \
             '"dims": [1]}], "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]}'
    world.lifecycle.load("m", {"config": config, "file:1/a": b"x", "file:1/a/b": b"y"}, world.replies.append)
    world.finish_reads()
    assert isinstance(world.replies[0], TritiumError)
    assert "cannot write the files of the load request" in world.replies[0].message
    world.write("other")
    world.load("other")                               # the lifecycle goes on
    world.instance_ready(world.loading("other"))
    assert world.replies[-1] == {}


@pytest.mark.parametrize("name", ["../../victim", "/abs/victim", "a/b", "..", "x\0y", ""])
def test_a_model_name_that_is_a_path_is_refused_before_any_file_is_written(tmp_path, name):
    """The only check of the name of a load or unload (from HTTP, gRPC or a model's own call)."""
    world = World(tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    world.lifecycle.load(name, {"config": "{}", "file:1/model.py": b"x"}, world.replies.append)
    (error,) = world.replies
    assert isinstance(error, TritiumError)
    assert error.message.startswith(f"failed to load '{name}', failed to poll from model repository: ")
    with pytest.raises(TritiumError):
        world.lifecycle.unload(name)
    assert not (tmp_path / "victim").exists() and not (tmp_path / "abs").exists()
    assert world.lifecycle.reader.completed.empty() and world.sent == []


@pytest.mark.parametrize("name", ["../../victim", ""])
def test_outside_explicit_mode_a_load_or_unload_is_refused_for_the_mode_before_its_name(tmp_path, name):
    world = World(tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    world.lifecycle.settings = replace(world.lifecycle.settings, mode="poll")
    world.lifecycle.load(name, {"config": "{}", "file:1/model.py": b"x"}, world.replies.append)
    (error,) = world.replies
    assert (type(error), error.message) == (Unavailable, "explicit model load / unload is not allowed if polling is enabled")
    with pytest.raises(Unavailable):
        world.lifecycle.unload(name)
    assert world.lifecycle.reader.completed.empty() and world.sent == []   # nothing read, nothing sent


ENSEMBLE = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "comp" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
"""


def loaded_ensemble(world, config: str = ENSEMBLE) -> None:
    world.write("comp")
    write_model(world.root, "ens", config, {"1/.keep": ""})
    world.lifecycle.load("ens", {}, world.replies.append)
    # The ens read asks for comp first, then comp is read (both may finish before either is applied).
    while not any(v.name == "comp" and v.state == VersionState.LOADING for v in world.registry.epochs.values()):
        world.finish_reads()
    world.instance_ready(world.loading("comp"))
    world.lifecycle.reader.run_completed()         # ens waits for comp's version to be READY
    assert world.registry.versions[("ens", 1)].state == VersionState.READY


def index_states(world) -> dict:
    return {e["name"]: (e.get("state"), e.get("reason")) for e in world.lifecycle.index(False)}


def test_an_ensemble_with_max_inflight_requests_says_so_in_tritons_words(world, caplog):
    caplog.set_level(logging.INFO)
    loaded_ensemble(world, ENSEMBLE.replace("ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 4"))
    assert "Ensemble model 'ens' configured with max_inflight_requests: 4" in caplog.text


def test_loading_back_a_composing_model_restores_its_ensemble(world):
    loaded_ensemble(world)
    world.lifecycle.unload("comp")
    assert index_states(world)["ens"] == ("UNAVAILABLE", "unloaded")   # it goes with its model
    world.load("comp")
    world.instance_ready(world.loading("comp"))
    while getattr(world.registry.versions.get(("ens", 1)), "state", None) != VersionState.READY:
        world.finish_reads()                # then ens is read again, as Triton does (after comp's own reads)
    assert index_states(world)["ens"] == ("READY", None)


def test_an_ensemble_unloaded_on_purpose_stays_unloaded(world):
    loaded_ensemble(world)
    world.lifecycle.unload("ens")
    world.lifecycle.unload("comp")
    world.load("comp")
    world.instance_ready(world.loading("comp"))
    time.sleep(0.2)
    world.lifecycle.reader.run_completed()
    assert world.lifecycle.reader.completed.empty() and "ens" not in world.lifecycle._loads
    assert index_states(world)["ens"] == ("UNAVAILABLE", "unloaded")


def test_an_ensemble_that_no_longer_fits_a_reloaded_model_waits_unloaded(world):
    loaded_ensemble(world)
    write_model(world.root, "comp", CONFIG.format(batch=8).replace('"Y"', '"Z"'), {"1/model.py": PLAIN_PY_MODEL})
    world.load("comp")
    world.instance_ready(world.loading("comp"))
    assert index_states(world)["ens"] == ("UNAVAILABLE", "unloaded")
    world.write("comp")                     # fits again: the ensemble comes back
    world.load("comp")
    world.instance_ready(world.loading("comp"))
    world.finish_reads()
    assert index_states(world)["ens"] == ("READY", None)


def test_a_policy_change_that_adds_a_version_beside_a_kept_one_shows_the_new_policy_once_it_serves(world):
    write_model(world.root, "m", CONFIG.format(batch=8), {"1/model.py": PLAIN_PY_MODEL, "2/model.py": PLAIN_PY_MODEL})
    world.load()
    kept = world.loading()
    world.instance_ready(kept)
    write_model(world.root, "m", CONFIG.format(batch=8) + "version_policy: { all { } }\n")
    world.load()
    added = world.loading()
    assert added.version == 1 and world.table_config()["version_policy"] != {"all": {}}
    world.instance_ready(added)
    assert world.table_config()["version_policy"] == {"all": {}}


# -- how a failed model shows: the stage its load failed at (checked side by side with Triton 2.51) --------

def test_a_config_refused_after_a_failed_load_leaves_that_failure_standing(world):
    """Triton falls back to the state a model had before a poll whose config it refuses: a model its
    lifecycle holds without versions stays so (not ready, not indexed), it does not become unknown."""
    write_model(world.root, "m", CONFIG.format(batch=8), {"notes/.keep": ""})   # no version folder
    world.load()
    assert not world.registry.server_ready() and "m" not in index_states(world)
    (world.root / "m" / "config.pbtxt").write_text("max_batch_size: [")
    world.load()
    assert isinstance(world.replies[-1], TritiumError) and "Couldn't parse integer" in world.replies[-1].message
    assert not world.registry.server_ready() and "m" not in index_states(world)
    assert world.registry.knows("m") and any(row.name == "m" for row in world.registry.table().models)


def test_a_config_refused_on_first_load_leaves_the_server_ready_and_the_model_unknown(world):
    world.write("good")
    world.load("good")
    world.instance_ready(world.loading("good"))
    write_model(world.root, "m", 'backend: "python"\nmax_batch_size: -1', {"1/model.py": PLAIN_PY_MODEL})
    world.load()
    assert isinstance(world.replies[-1], TritiumError)
    assert world.registry.server_ready()
    assert index_states(world) == {"good": ("READY", None), "m": (None, None)}
    assert not world.registry.knows("m") and [row.name for row in world.registry.table().models] == ["good"]


def test_an_ensemble_of_a_refused_model_is_left_out_as_its_model_is(world):
    """Triton never lets such an ensemble into its lifecycle: it does not hold the server back either."""
    write_model(world.root, "comp", CONFIG.format(batch=-1), {"1/model.py": PLAIN_PY_MODEL})
    write_model(world.root, "ens", ENSEMBLE, {"1/.keep": ""})
    world.lifecycle.load("ens", {}, world.replies.append)
    while not world.replies:
        world.finish_reads()
    assert isinstance(world.replies[-1], TritiumError)
    assert world.registry.server_ready()
    assert index_states(world) == {"comp": (None, None), "ens": (None, None)}
    assert not world.registry.knows("ens") and not world.registry.knows("comp")


def test_a_model_without_a_backend_to_tell_is_refused_while_polling(world):
    """Triton's poll refuses a config naming no backend whose folder holds no model file it knows:
    the name alone in the index, unknown to requests, the server ready."""
    world.write("good")
    world.load("good")
    world.instance_ready(world.loading("good"))
    write_model(world.root, "nob", CONFIG.format(batch=0).replace('backend: "python"', ""), {"1/.keep": ""})
    world.load("nob")
    assert isinstance(world.replies[-1], TritiumError) and "cannot tell which backend" in world.replies[-1].message
    assert world.registry.server_ready()
    assert index_states(world) == {"good": ("READY", None), "nob": (None, None)}
    assert not world.registry.knows("nob")


@pytest.fixture
def two_repositories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    made = World(tmp_path / "a", more_roots=(tmp_path / "b",))
    yield made
    made.lifecycle.close()


DUPLICATE = ("UNAVAILABLE", "model appears in two or more repositories")


def test_a_model_in_two_repositories_is_never_loaded_and_indexed_as_tritons_duplicate(two_repositories):
    world = two_repositories
    world.write("good")
    world.load("good")
    world.instance_ready(world.loading("good"))
    world.write("m")
    write_model(world.root.parent / "b", "m", CONFIG.format(batch=8), {"1/model.py": PLAIN_PY_MODEL})
    assert index_states(world) == {"good": ("READY", None), "m": DUPLICATE}
    world.load("m")
    assert isinstance(world.replies[-1], TritiumError)
    assert "'m' appears in more than one model repository" in world.replies[-1].message
    assert world.registry.server_ready() and not world.registry.knows("m")
    assert index_states(world) == {"good": ("READY", None), "m": DUPLICATE}


def test_polling_unloads_a_model_that_appears_in_a_second_repository_and_loads_it_once_unique(two_repositories):
    """As Triton's poll: a folder no longer unique is not kept loaded; unique again, it loads."""
    world = two_repositories
    world.write("m")
    world.load("m")
    world.instance_ready(world.loading("m"))
    write_model(world.root.parent / "b", "m", CONFIG.format(batch=8), {"1/model.py": PLAIN_PY_MODEL})
    world.lifecycle.poller.poll()
    assert index_states(world) == {"m": DUPLICATE}
    assert not any(v.state is VersionState.READY for v in world.registry.epochs.values() if v.name == "m")
    shutil.rmtree(world.root.parent / "b" / "m")
    world.lifecycle.poller.poll()
    world.finish_reads()
    world.instance_ready(world.loading("m"))
    assert index_states(world) == {"m": ("READY", None)}


BAD_DIMS = CONFIG.replace("dims: [ 4 ] }} ]\noutput", "dims: [ -2 ] }} ]\noutput")


def test_inputs_triton_refuses_as_a_version_loads_fail_each_version_and_publish_no_config(world):
    assert "dims: [ -2 ]" in BAD_DIMS
    write_model(world.root, "m", BAD_DIMS.format(batch=8), {"1/model.py": PLAIN_PY_MODEL})
    world.load()
    assert isinstance(world.replies[-1], TritiumError)
    assert world.replies[-1].message.startswith("load failed for model 'm': version 1 is at UNAVAILABLE state: ")
    assert "dimension -2" in world.replies[-1].message and world.replies[-1].message.endswith(";\n")
    state, reason = index_states(world)["m"]
    assert state == "UNAVAILABLE" and "dimension -2" in reason
    assert world.lifecycle.index(False) == [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": reason}]
    assert world.table_config("m") is None and not world.registry.server_ready()


def test_a_reload_with_inputs_triton_refuses_keeps_the_serving_version_and_its_config(world):
    world.write(batch=8)
    world.load()
    world.instance_ready(world.loading())
    write_model(world.root, "m", BAD_DIMS.format(batch=4), {"1/model.py": PLAIN_PY_MODEL})
    world.load()
    assert isinstance(world.replies[-1], TritiumError) and "dimension -2" in world.replies[-1].message
    assert world.registry.versions[("m", 1)].state == VersionState.READY and world.registry.server_ready()
    assert world.table_config("m")["max_batch_size"] == 8


def test_a_failed_version_the_policy_no_longer_selects_is_unloaded(world):
    write_model(world.root, "m", CONFIG.format(batch=8) + "version_policy { all { } }",
                {"1/model.py": PLAIN_PY_MODEL, "2/notes.txt": "no model.py"})
    world.load()
    world.instance_ready(world.loading())   # version 1 ready, version 2 failed: the load fails, 1 is undone
    assert not world.registry.server_ready()
    (world.root / "m" / "config.pbtxt").write_text(
        CONFIG.format(batch=8) + "version_policy { specific { versions: [ 1 ] } }")
    world.load()
    world.instance_ready(world.loading())
    entries = {entry["version"]: entry for entry in world.lifecycle.index(False)}
    assert entries["1"]["state"] == "READY" and entries["2"] == {
        "name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert world.registry.server_ready()
