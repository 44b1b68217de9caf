"""Ensembles checked against the models they compose: unknown models, unmapped tensors, cycles."""

from __future__ import annotations

import pytest

from tritium.repo import ModelRepository
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, config_fails_model, write_model


def tensor(name: str, dims: str = "[ 16 ]", data_type: str = "TYPE_FP32") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: {dims} }}'


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps} }}'


def ensemble(steps: list[str], inputs=("A", "B"), outputs=("SUM",), max_batch_size: int = 4,
             extra: str = "") -> str:
    return (f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {", ".join(tensor(n) for n in inputs)} ]\n'
            f'output [ {", ".join(tensor(n) for n in outputs)} ]\n'
            f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n{extra}')


def write_ensemble(root, name: str, text: str):
    """An ensemble folder as Triton wants it: config.pbtxt and an empty version folder."""
    model_dir = write_model(root, name, text)
    (model_dir / "1").mkdir(exist_ok=True)
    return model_dir


ADD = step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})


@pytest.fixture
def root(tmp_path):
    write_model(tmp_path, "add_sub", None, {"1/model.onnx": add_sub()})  # max_batch_size 4
    return tmp_path


def scan(root):
    return ModelRepository([root]).load_all().models


def error_of(root, name: str = "ens") -> str:
    entry = scan(root)[name]
    assert not entry.ok, f"{name} loaded"
    assert entry.error.startswith(f"ensemble '{name}': "), entry.error
    return entry.error.removeprefix(f"ensemble '{name}': ")


def test_valid_ensemble(root):
    write_ensemble(root, "ens", ensemble([ADD]))
    entry = scan(root)["ens"]
    assert entry.ok, entry.error
    config = entry.definition.config
    assert (config.platform, config.backend) == ("ensemble", "")
    assert len(config.instance_group) == 0
    assert entry.definition.loadable_versions == (1,)
    json_config = entry.definition.config_json()
    assert json_config["instance_group"] == []
    assert "optimization" not in json_config
    assert json_config["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_chained_steps_and_nested_ensembles(root):
    write_ensemble(root, "ens", ensemble([
        step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "T"}),
        step("add_sub", {"INPUT0": "T", "INPUT1": "B"}, {"OUTPUT0": "SUM"}),
    ]))
    write_ensemble(root, "outer", ensemble([step("ens", {"A": "X", "B": "Y"}, {"SUM": "Z"})],
                                        inputs=("X", "Y"), outputs=("Z",)))
    models = scan(root)
    assert models["ens"].ok, models["ens"].error
    assert models["outer"].ok, models["outer"].error


def test_unknown_model(root):
    write_ensemble(root, "ens", ensemble([step("nope", {"INPUT0": "A"}, {"OUTPUT0": "SUM"})]))
    assert error_of(root) == "step 0 (model 'nope') names model 'nope', which is not in the model repository"


def test_step_without_model_name(root):
    write_ensemble(root, "ens", ensemble(['{ model_version: -1 }']))
    assert error_of(root) == "step 0 must name a model in 'model_name'"


def test_step_naming_the_ensemble_itself(root):
    write_ensemble(root, "ens", ensemble([step("ens", {"A": "A"}, {"SUM": "SUM"})]))
    assert error_of(root) == "step 0 (model 'ens') names the ensemble itself"


def test_failed_member_is_reported_with_its_error(root):
    write_model(root, "broken", 'backend: "python"\nbogus: 1', {"1/model.py": PLAIN_PY_MODEL})
    write_ensemble(root, "ens", ensemble([step("broken", {"X": "A"}, {"Y": "SUM"})]))
    message = error_of(root)
    assert message.startswith("step 0 (model 'broken'): model 'broken' failed to load: ")
    assert 'has no field named "bogus"' in message


def test_a_member_whose_versions_all_failed_is_reported_with_their_reason(root):
    write_model(root, "pm", 'backend: "python"', {"1/model.py": config_fails_model("no tokenizer")})
    write_ensemble(root, "ens", ensemble([step("pm", {"X": "A"}, {"Y": "SUM"})]))
    assert error_of(root).startswith("step 0 (model 'pm'): model 'pm' failed to load: version 1: "
                                     "Internal: ValueError: no tokenizer\n\nAt:\n")


def test_unmapped_input(root):
    write_ensemble(root, "ens", ensemble([step("add_sub", {"INPUT0": "A"}, {"OUTPUT0": "SUM"})]))
    assert error_of(root) == "input 'INPUT1' of step 0 (model 'add_sub') is not mapped to any ensemble tensor"


def test_optional_inputs_may_stay_unmapped(root):
    write_model(root, "opt", """
        backend: "python"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "MASK" data_type: TYPE_FP32 dims: [ 16 ] optional: true } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.py": PLAIN_PY_MODEL})
    write_ensemble(root, "ens", ensemble([step("opt", {"X": "A"}, {"Y": "SUM"})], inputs=("A",)))
    assert scan(root)["ens"].ok


def test_mapping_a_tensor_the_model_does_not_have(root):
    write_ensemble(root, "ens", ensemble([step("add_sub", {"INPUT0": "A", "INPUT1": "B", "INPUT9": "B"},
                                            {"OUTPUT0": "SUM"})]))
    assert error_of(root) == ("step 0 (model 'add_sub') maps input 'INPUT9', which model 'add_sub' "
                              "does not have (its inputs: ['INPUT0', 'INPUT1'])")
    write_ensemble(root, "ens", ensemble([step("add_sub", {"INPUT0": "A", "INPUT1": "B"},
                                            {"OUTPUT7": "SUM"})]))
    assert error_of(root) == ("step 0 (model 'add_sub') maps output 'OUTPUT7', which model 'add_sub' "
                              "does not have (its outputs: ['OUTPUT0', 'OUTPUT1'])")


def test_reading_a_tensor_nobody_produces(root):
    write_ensemble(root, "ens", ensemble([step("add_sub", {"INPUT0": "A", "INPUT1": "C"},
                                            {"OUTPUT0": "SUM"})]))
    assert error_of(root) == ("step 0 (model 'add_sub') reads ensemble tensor 'C', which no ensemble "
                              "input or step output produces")


def test_output_nobody_produces(root):
    write_ensemble(root, "ens", ensemble([ADD], outputs=("SUM", "DIFF")))
    assert error_of(root) == "ensemble output 'DIFF' is not produced by any step"


def test_tensor_produced_twice(root):
    write_ensemble(root, "ens", ensemble([
        ADD, step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT1": "SUM"})]))
    assert error_of(root) == ("ensemble tensor 'SUM' is produced by step 0 (model 'add_sub') and by "
                              "step 1 (model 'add_sub')")
    write_ensemble(root, "ens", ensemble([step("add_sub", {"INPUT0": "A", "INPUT1": "B"},
                                            {"OUTPUT0": "A"})], outputs=()))
    assert error_of(root) == "ensemble tensor 'A' is produced by ensemble input and by step 0 (model 'add_sub')"


def test_datatype_mismatch(root):
    text = ensemble([ADD]).replace('name: "A" data_type: TYPE_FP32', 'name: "A" data_type: TYPE_INT32')
    write_ensemble(root, "ens", text)
    assert error_of(root) == ("ensemble tensor 'A' is TYPE_INT32 from ensemble input but input "
                              "'INPUT0' of step 0 (model 'add_sub') expects TYPE_FP32")


def test_shape_mismatch(root):
    text = ensemble([ADD]).replace('name: "SUM" data_type: TYPE_FP32 dims: [ 16 ]',
                                   'name: "SUM" data_type: TYPE_FP32 dims: [ 8 ]')
    write_ensemble(root, "ens", text)
    assert error_of(root) == ("ensemble tensor 'SUM' has shape [-1, 16] from step 0 (model 'add_sub') "
                              "but ensemble output 'SUM' expects shape [-1, 8]")


def test_variable_dims_are_compatible(root):
    text = ensemble([ADD]).replace('name: "A" data_type: TYPE_FP32 dims: [ 16 ]',
                                   'name: "A" data_type: TYPE_FP32 dims: [ -1 ]')
    write_ensemble(root, "ens", text)
    assert scan(root)["ens"].ok


def test_max_batch_size_larger_than_a_member_allows(root):
    write_ensemble(root, "ens", ensemble([ADD], max_batch_size=8))
    assert error_of(root) == "allows max_batch_size 8, but step 0 (model 'add_sub') only allows 4"


def test_steps_forming_a_cycle(root):
    write_ensemble(root, "ens", ensemble([
        step("add_sub", {"INPUT0": "A", "INPUT1": "U"}, {"OUTPUT0": "T"}),
        step("add_sub", {"INPUT0": "T", "INPUT1": "B"}, {"OUTPUT0": "U", "OUTPUT1": "SUM"}),
    ]))
    assert error_of(root) == ("steps form a cycle: step 0 (model 'add_sub') -> step 1 (model "
                              "'add_sub') -> step 0 (model 'add_sub')")


def test_ensembles_forming_a_cycle(root):
    write_ensemble(root, "ens", ensemble([step("other", {"A": "A", "B": "B"}, {"SUM": "SUM"})]))
    write_ensemble(root, "other", ensemble([step("ens", {"A": "A", "B": "B"}, {"SUM": "SUM"})]))
    models = scan(root)
    assert not models["ens"].ok and not models["other"].ok
    assert "ensembles form a cycle: ens -> other -> ens" in models["ens"].error
    assert "ensembles form a cycle: other -> ens -> other" in models["other"].error


def test_failure_propagates_to_ensembles_of_ensembles(root):
    write_ensemble(root, "ens", ensemble([step("nope", {"X": "A"}, {"Y": "SUM"})]))
    write_ensemble(root, "outer", ensemble([step("ens", {"A": "A", "B": "B"}, {"SUM": "SUM"})]))
    models = scan(root)
    assert models["outer"].error.startswith(
        "ensemble 'outer': step 0 (model 'ens'): model 'ens' failed to load: ensemble 'ens': step 0")


def test_an_ensemble_refused_over_a_model_it_lacks_keeps_its_definition_to_be_tried_again(root):
    """Missing or failed: it may load once that model does (poll mode). Refused for its own
    mistakes (a tensor the model does not have), it has nothing to wait for."""
    write_ensemble(root, "lacking", ensemble([step("nope", {"X": "A"}, {"Y": "SUM"})]))
    write_ensemble(root, "wrong", ensemble([step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"NOPE": "SUM"})]))
    models = scan(root)
    assert not models["lacking"].ok and models["lacking"].definition is not None
    assert not models["wrong"].ok and models["wrong"].definition is None


def test_no_steps(root):
    write_ensemble(root, "ens", ensemble([]))
    assert error_of(root) == "must have at least one step in 'ensemble_scheduling'"


def test_ensemble_with_instance_group_fails_at_load(root):
    write_ensemble(root, "ens", ensemble([ADD], extra="instance_group [ { kind: KIND_CPU } ]"))
    entry = scan(root)["ens"]
    assert entry.error.endswith("ensemble 'ens' must not specify 'instance_group'")
    assert str(root / "ens" / "config.pbtxt") in entry.error


def test_ensemble_platform_from_ensemble_scheduling_alone(root):
    write_ensemble(root, "ens", ensemble([ADD]).replace('platform: "ensemble"', ""))
    entry = scan(root)["ens"]
    assert entry.ok, entry.error
    assert entry.definition.config.platform == "ensemble"


def test_ensemble_needs_a_version_folder_too(root):
    write_model(root, "ens", ensemble([ADD]))  # no 1/: Triton refuses it as well
    entry = scan(root)["ens"]
    assert "model 'ens' has no version folder that its version policy selects" in entry.error


def write_python_model(root, name: str, max_batch_size: int, dims: str, extra: str = ""):
    write_model(root, name, f"""
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "X" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: {dims} }} ]
        {extra}
    """, {"1/model.py": PLAIN_PY_MODEL})


def test_a_model_that_does_not_batch_may_serve_a_batching_ensemble(root):
    """As Triton: its full shape [-1, 16] matches the ensemble's [16] with the batch dimension."""
    write_python_model(root, "whole", 0, "[ -1, 16 ]")
    write_ensemble(root, "ens", ensemble([ADD, step("whole", {"X": "SUM"}, {"Y": "OUT"})],
                                         outputs=("OUT",), max_batch_size=4))
    entry = scan(root)["ens"]
    assert entry.ok, entry.error


def test_a_model_that_does_not_batch_still_needs_a_matching_shape(root):
    write_python_model(root, "whole", 0, "[ -1, 8 ]")
    write_ensemble(root, "ens", ensemble([ADD, step("whole", {"X": "SUM"}, {"Y": "OUT"})],
                                         outputs=("OUT",), max_batch_size=4))
    assert error_of(root) == ("ensemble tensor 'SUM' has shape [-1, 16] from step 0 (model 'add_sub') but "
                              "input 'X' of step 1 (model 'whole') expects shape [-1, 8]")


def test_a_decoupled_step_makes_the_ensemble_decoupled_as_in_triton(root):
    write_python_model(root, "stream", 4, "[ 16 ]", "model_transaction_policy { decoupled: true }")
    write_ensemble(root, "ens", ensemble([step("stream", {"X": "A"}, {"Y": "MID"}),
                                          step("add_sub", {"INPUT0": "MID", "INPUT1": "MID"}, {"OUTPUT0": "SUM"})],
                                         inputs=("A",)))
    write_ensemble(root, "outer", ensemble([step("ens", {"A": "X"}, {"SUM": "SUM"})], inputs=("X",)))
    models = scan(root)
    assert models["ens"].ok and models["outer"].ok, (models["ens"].error, models["outer"].error)
    for name in ("ens", "outer"):   # a nested decoupled ensemble makes its parent decoupled too
        assert models[name].definition.config_json()["model_transaction_policy"] == {"decoupled": True}


def test_an_ensemble_made_decoupled_by_its_step_may_not_cache_as_in_triton(root):
    write_python_model(root, "stream", 4, "[ 16 ]", "model_transaction_policy { decoupled: true }")
    write_ensemble(root, "ens", ensemble([step("stream", {"X": "A"}, {"Y": "SUM"})], inputs=("A",))
                   + "response_cache { enable: true }\n")
    entry = scan(root)["ens"]
    assert not entry.ok
    assert entry.error == ("Response Cache does not currently support model ens with 'decoupled' transaction "
                           "policy. Please disable the response cache.")


def test_a_step_reading_responses_of_different_decoupled_models_is_refused(root):
    write_python_model(root, "stream", 4, "[ 16 ]", "model_transaction_policy { decoupled: true }")
    write_ensemble(root, "ens", ensemble([step("stream", {"X": "A"}, {"Y": "MID"}),
                                          step("add_sub", {"INPUT0": "MID", "INPUT1": "B"}, {"OUTPUT0": "SUM"})]))
    assert error_of(root) == ("step 1 (model 'add_sub') receives inputs originated from different decoupled models")


def test_an_ensemble_input_is_checked_with_its_reshape(root):
    text = ensemble([ADD]).replace('name: "A" data_type: TYPE_FP32 dims: [ 16 ]',
                                   'name: "A" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] }')
    write_ensemble(root, "ens", text)
    assert scan(root)["ens"].ok


def test_an_ensemble_is_never_decoupled_in_its_config(root):
    write_ensemble(root, "ens", ensemble([ADD]))
    assert scan(root)["ens"].definition.config_json()["model_transaction_policy"] == {"decoupled": False}
