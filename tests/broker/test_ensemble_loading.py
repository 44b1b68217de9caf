"""Loading ensembles: READY when their models are, composing models loaded first, no agent involved."""

from __future__ import annotations

import shutil
import time

import pytest

from tritium.broker.lifecycle import ControlSettings, ModelLifecycle
from tritium.broker.registry import VersionState
from tests.broker.lifecycle_world import CONFIG, World
from tests.repo.helpers import PLAIN_PY_MODEL, config_fails_model, write_model
from tritium.errors import TritiumError
from tritium.protocol import Kind


def ensemble_config(steps: list[str], max_batch_size: int = 8) -> str:
    """A chain X -> step 0 -> step 1 ... -> Y."""
    tensors = ["X", *[f"t{i}" for i in range(1, len(steps))], "Y"]
    maps = ", ".join(f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "X" value: "{tensors[i]}" }} '
                     f'output_map {{ key: "Y" value: "{tensors[i + 1]}" }} }}' for i, m in enumerate(steps))
    return f"""
        platform: "ensemble"
        max_batch_size: {max_batch_size}
        input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 4 ] }} ]
        ensemble_scheduling {{ step [ {maps} ] }}
    """


def write_ensemble(world: World, name: str, steps: list[str]) -> None:
    (write_model(world.root, name, ensemble_config(steps)) / "1").mkdir()


def pump(world: World, condition, timeout_s: float = 20.0) -> None:
    """Run what the load threads finish until ``condition()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the loads did not get there"
        world.lifecycle.reader.run_completed()
        time.sleep(0.01)


def state(world: World, name: str) -> VersionState | None:
    version = world.registry.versions.get((name, 1))
    return version.state if version else None


def assigned(world: World) -> set[str]:
    return {m["m"] for message in world.sent if message["k"] == Kind.ASSIGN for m in message["models"]}


@pytest.fixture
def world(tmp_path):
    made = World(tmp_path)
    made.write("m")
    yield made
    made.lifecycle.close()


def load_until_m_loads(world: World, name: str = "ens") -> None:
    world.lifecycle.load(name, {}, world.replies.append)
    pump(world, lambda: state(world, "m") == VersionState.LOADING)


def test_an_explicit_load_loads_the_composing_model_first_and_answers_once(world):
    write_ensemble(world, "ens", ["m"])
    load_until_m_loads(world)
    assert state(world, "ens") is None and world.replies == []
    world.instance_ready(world.loading("m"))
    pump(world, lambda: world.replies)
    assert world.replies == [{}]
    assert state(world, "ens") == VersionState.READY
    assert assigned(world) == {"m"}   # no agent is asked to start anything of the ensemble
    assert world.registry.table().ready


def test_an_ensemble_whose_model_fails_to_start_fails_naming_the_step(world):
    write_ensemble(world, "ens", ["m"])
    load_until_m_loads(world)
    world.lifecycle.version_failed(world.loading("m"), "instance m_0 exited with status 1 before it was ready")
    pump(world, lambda: world.replies)
    (reply,) = world.replies
    assert isinstance(reply, TritiumError)
    assert reply.message == ("load failed for model 'ens': ensemble 'ens': step 0 (model 'm'): model 'm' "
                             "failed to load: version 1: instance m_0 exited with status 1 before it was ready")


def test_an_ensemble_whose_model_s_versions_all_failed_to_load_names_their_reason(world):
    """A model whose auto_complete_config raised is listed with its version failed (Triton's way):
    the ensemble fails with that reason, not over the config the model never completed."""
    write_model(world.root, "pm", 'backend: "python"', {"1/model.py": config_fails_model("no tokenizer")})
    write_ensemble(world, "ens", ["pm"])
    world.lifecycle.load("ens", {}, world.replies.append)
    pump(world, lambda: world.replies)
    (reply,) = world.replies
    assert isinstance(reply, TritiumError)
    assert reply.message.startswith("load failed for model 'ens': ensemble 'ens': step 0 (model 'pm'): model 'pm' "
                                    "failed to load: version 1: Internal: ValueError: no tokenizer\n\nAt:\n")


def test_ensembles_that_use_each_other_fail_to_load_instead_of_waiting_forever(world):
    write_ensemble(world, "a", ["b"])
    write_ensemble(world, "b", ["a"])
    world.lifecycle.load("a", {}, world.replies.append)
    pump(world, lambda: world.replies)
    (reply,) = world.replies
    assert isinstance(reply, TritiumError)
    assert reply.message == ("load failed for model 'a': ensemble 'a': step 0 (model 'b'): model 'b' failed to "
                             "load: ensemble 'b': ensembles form a cycle through model 'a'")


def test_unloading_a_composing_model_unloads_the_ensembles_that_use_it(world):
    write_ensemble(world, "inner", ["m"])
    write_ensemble(world, "outer", ["inner"])
    load_until_m_loads(world, "outer")
    world.instance_ready(world.loading("m"))
    pump(world, lambda: world.replies)
    assert state(world, "outer") == VersionState.READY
    world.lifecycle.unload("m")
    assert world.registry.models["inner"].unloaded and world.registry.models["outer"].unloaded
    assert ("inner", 1) not in world.registry.versions


def test_unload_dependents_leaves_a_model_another_ensemble_uses(world):
    world.write("n")
    write_ensemble(world, "one", ["m", "n"])
    write_ensemble(world, "two", ["m"])
    for name in ("one", "two"):
        world.lifecycle.load(name, {}, world.replies.append)
        pump(world, lambda: state(world, "m") is not None and state(world, "n") is not None)
        for model in ("m", "n"):
            if state(world, model) == VersionState.LOADING:
                world.instance_ready(world.loading(model))
        pump(world, lambda: state(world, name) == VersionState.READY)
    world.lifecycle.unload("one", unload_dependents=True)
    unloaded = {name for name, record in world.registry.models.items() if record.unloaded}
    assert unloaded == {"one", "n"}


def polled_in(world: World, name: str) -> None:
    """A poll picks up ``name``'s files, and its instance comes up."""
    world.lifecycle.poller.poll()
    pump(world, lambda: state(world, name) == VersionState.LOADING)
    world.instance_ready(world.loading(name))


def start_scanning(world: World, mode: str = "none") -> None:
    """What tritium serve does without explicit model control: load the whole repository."""
    write_ensemble(world, "ens", ["m"])
    world.lifecycle.close()
    world.lifecycle = ModelLifecycle(world.registry, world.lifecycle.repository, world.lifecycle.scheduler,
                                     world._record, ControlSettings(mode=mode, poll_seconds=0), world.membership)
    world.lifecycle.start()
    world.lifecycle.reader.run_completed()


def test_at_startup_an_ensemble_is_ready_once_its_models_are(world):
    start_scanning(world)
    assert (state(world, "m"), state(world, "ens")) == (VersionState.LOADING, VersionState.LOADING)
    world.instance_ready(world.loading("m"))
    assert state(world, "ens") == VersionState.READY
    assert world.registry.loading_done() and world.registry.server_ready()


def test_at_startup_an_ensemble_whose_model_fails_is_left_out_as_triton_leaves_it(world):
    """Triton's dependency graph never lets it into the lifecycle (checked side by side): the name
    alone in the index, unknown to requests; the failed model itself keeps the server not ready."""
    start_scanning(world)
    world.lifecycle.version_failed(world.loading("m"), "boom")
    record = world.registry.models["ens"]
    assert not record.versions and record.error == "ensemble 'ens': step 0 (model 'm'): model 'm' is not available: boom"
    assert {e["name"]: e.get("state") for e in world.lifecycle.index(False)} == {"ens": None, "m": "UNAVAILABLE"}
    assert not world.registry.knows("ens") and not world.registry.server_ready()
    assert world.registry.loading_done()
    assert type(record.error) is str and world.registry.table().encode()   # what the gateways are sent


def test_an_ensemble_with_a_history_fails_as_its_versions_do_when_its_model_fails(world):
    """Loaded and unloaded before: its index entry keeps its versions' story, as a failed load of a
    model with versions does."""
    write_ensemble(world, "ens", ["m"])
    load_until_m_loads(world)
    world.instance_ready(world.loading("m"))
    pump(world, lambda: state(world, "ens") == VersionState.READY)
    world.lifecycle.unload("ens")
    world.lifecycle.unload("m")
    world.lifecycle.load("m", {}, world.replies.append)
    pump(world, lambda: state(world, "m") == VersionState.LOADING)
    world.lifecycle.load("ens", {}, world.replies.append)
    pump(world, lambda: state(world, "ens") == VersionState.LOADING)   # waiting for m
    world.lifecycle.version_failed(world.loading("m"), "boom")
    pump(world, lambda: len(world.replies) == 3)
    assert world.replies[-1].message.startswith("load failed for model 'ens': version 1 is at UNAVAILABLE state: ")
    assert world.registry.knows("ens") and world.registry.table().encode()


def test_poll_mode_loads_an_ensemble_left_out_over_its_failed_model_once_the_model_loads(world):
    start_scanning(world, mode="poll")
    world.lifecycle.version_failed(world.loading("m"), "boom")
    assert not world.registry.knows("ens")
    write_model(world.root, "m", CONFIG.format(batch=8), {"1/model.py": PLAIN_PY_MODEL + "# fixed\n"})
    polled_in(world, "m")
    pump(world, lambda: state(world, "ens") == VersionState.READY)
    assert world.registry.knows("ens") and world.registry.server_ready()


def test_poll_mode_checks_a_changed_ensemble_against_the_loaded_models(world):
    start_scanning(world, mode="poll")
    world.instance_ready(world.loading("m"))
    serving = world.registry.versions[("ens", 1)]
    (world.root / "ens" / "config.pbtxt").write_text(ensemble_config(["nope"]))
    world.lifecycle.poller.poll()
    record = world.registry.models["ens"]
    pump(world, lambda: record.last_error)
    assert "step 0 (model 'nope') names model 'nope', which is not in the model repository" in record.last_error
    assert world.registry.versions[("ens", 1)] is serving and serving.state == VersionState.READY
    (world.root / "ens" / "config.pbtxt").write_text(ensemble_config(["m"], max_batch_size=4))
    world.lifecycle.poller.poll()
    pump(world, lambda: world.registry.versions[("ens", 1)] is not serving)
    assert world.registry.versions[("ens", 1)].definition.config.max_batch_size == 4
    assert world.registry.versions[("ens", 1)].state == VersionState.READY


def test_poll_mode_loads_an_ensemble_refused_at_startup_once_the_model_it_lacked_appears(world):
    """As Triton's poll (checked side by side): the ensemble is tried again when its missing model loads."""
    write_ensemble(world, "pair", ["m", "later"])
    start_scanning(world, mode="poll")
    world.instance_ready(world.loading("m"))
    assert state(world, "pair") is None and not world.registry.knows("pair")
    world.write("later")
    polled_in(world, "later")
    pump(world, lambda: state(world, "pair") == VersionState.READY)
    assert world.registry.knows("pair") and world.registry.server_ready()


def test_poll_mode_forgets_a_refused_ensemble_whose_folder_went_away(world):
    write_ensemble(world, "pair", ["m", "later"])
    start_scanning(world, mode="poll")
    world.instance_ready(world.loading("m"))
    shutil.rmtree(world.root / "pair")
    world.lifecycle.poller.poll()
    world.write("later")
    polled_in(world, "later")
    world.lifecycle.reader.run_completed()
    assert "pair" not in world.lifecycle._loads and world.lifecycle.repository_errors == ()


def test_an_ensemble_named_at_explicit_startup_loads_its_models_and_startup_waits_for_it(world):
    write_ensemble(world, "inner", ["m"])
    write_ensemble(world, "outer", ["inner"])
    world.lifecycle.close()
    world.lifecycle = ModelLifecycle(world.registry, world.lifecycle.repository, world.lifecycle.scheduler,
                                     world._record, ControlSettings(mode="explicit", load_models=("outer",)),
                                     world.membership)
    world.lifecycle.start()
    world.lifecycle.reader.run_completed()
    assert {name: state(world, name) for name in ("m", "inner", "outer")} == dict.fromkeys(
        ("m", "inner", "outer"), VersionState.LOADING)
    assert not world.registry.loading_done()
    world.instance_ready(world.loading("m"))
    assert state(world, "outer") == VersionState.READY and world.registry.loading_done()
