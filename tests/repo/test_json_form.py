"""The config as GET /v2/models/{m}/config prints it (reference 2.3): compared with Triton's output."""

from __future__ import annotations

import json

from tritium.repo.config_file import parse_config_text
from tritium.repo.json_form import config_to_json_dict
from tests.repo.helpers import FLOAT, identity, load, onnx_io, write_model

# Triton's answer for an ONNX model on CPU with no config.pbtxt (TRITON_REFERENCE.md 2.3).
TRITON_DENSENET_JSON = """
{"name":"densenet_onnx","platform":"onnxruntime_onnx","backend":"onnxruntime","runtime":"",
"version_policy":{"latest":{"num_versions":1}},"max_batch_size":0,
"input":[{"name":"data_0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[1,3,224,224],
"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],
"output":[{"name":"fc6_1","data_type":"TYPE_FP32","dims":[1,1000,1,1],"label_filename":"",
"is_shape_tensor":false,"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],
"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},
"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},
"instance_group":[{"name":"densenet_onnx","kind":"KIND_CPU","count":2,"gpus":[],
"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],
"default_model_filename":"model.onnx","cc_model_filenames":{},"metric_tags":{},"parameters":{},
"model_warmup":[]}
"""

TRITON_AUTOCOMPLETED_DYNAMIC_BATCHING = {
    "preferred_batch_size": [4], "max_queue_delay_microseconds": 0, "preserve_ordering": False,
    "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {}}


def densenet(tmp_path):
    build = onnx_io([("data_0", FLOAT, [1, 3, 224, 224])], [("fc6_1", FLOAT, [1, 1000, 1, 1])])
    write_model(tmp_path, "densenet_onnx", None, {"1/model.onnx": build})
    return load(tmp_path, "densenet_onnx", gpus=()).config_json()


def test_minimal_onnx_model_matches_triton_field_by_field(tmp_path):
    ours = densenet(tmp_path)
    triton = json.loads(TRITON_DENSENET_JSON)
    for key, value in triton.items():
        assert key in ours, f"missing top-level field {key}"
        assert ours[key] == value, f"field {key}: {ours[key]!r} != Triton's {value!r}"
    assert set(ours) == set(triton)
    assert list(ours) == list(triton)  # the proto's declaration order, as Triton prints
    for ours_tensor, triton_tensor in zip(ours["input"] + ours["output"],
                                          triton["input"] + triton["output"]):
        assert list(ours_tensor) == list(triton_tensor)


def test_value_types_are_json_native(tmp_path):
    ours = densenet(tmp_path)
    assert all(type(d) is int for d in ours["input"][0]["dims"])  # int64 as numbers, not "1"
    assert type(ours["max_batch_size"]) is int
    assert type(ours["input"][0]["optional"]) is bool  # perf_analyzer reads it with GetBool()
    assert ours["instance_group"][0]["kind"] == "KIND_CPU"  # enum names
    assert json.loads(json.dumps(ours)) == ours


def test_unset_messages_are_omitted(tmp_path):
    ours = densenet(tmp_path)
    for absent in ("model_transaction_policy", "response_cache", "sequence_batching",
                   "dynamic_batching", "ensemble_scheduling", "model_operations",
                   "model_repository_agents", "model_metrics"):
        assert absent not in ours
    assert "reshape" not in ours["input"][0]
    assert "rate_limiter" not in ours["instance_group"][0]
    assert set(ours["optimization"]) == {"priority", "input_pinned_memory", "output_pinned_memory",
                                         "gather_kernel_buffer_threshold", "eager_batching"}


def test_auto_completed_batching_model(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=(-1, 8))})
    ours = load(tmp_path, "m").config_json()
    assert ours["max_batch_size"] == 4
    assert ours["dynamic_batching"] == TRITON_AUTOCOMPLETED_DYNAMIC_BATCHING
    keys = list(ours)
    # The scheduler sits where the proto declares its oneof: after optimization.
    assert keys.index("optimization") + 1 == keys.index("dynamic_batching") == keys.index("instance_group") - 1
    assert ours["input"][0]["dims"] == [8]


def test_scalar_reshape_prints_an_empty_shape(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=(-1,))})
    ours = load(tmp_path, "m").config_json()
    assert ours["input"][0]["dims"] == [1]
    assert ours["input"][0]["reshape"] == {"shape": []}


def test_int64_fields_become_numbers_and_map_keys_stay_strings():
    config = parse_config_text("m", """
        name: "m" platform: "ensemble" max_batch_size: 8
        version_policy { specific { versions: [ 1, 3 ] } }
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape { shape: [ 3, -1 ] } } ]
        ensemble_scheduling { step [ { model_name: "a" model_version: -1
                                       input_map { key: "IN" value: "X" } } ] }
        model_warmup [ { name: "w" batch_size: 1
                         inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } } } ]
    """)
    ours = config_to_json_dict(config)
    assert ours["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert ours["input"][0]["dims"] == [-1, 3]
    assert ours["input"][0]["reshape"] == {"shape": [3, -1]}
    step = ours["ensemble_scheduling"]["step"][0]
    assert step["model_version"] == -1
    assert step["input_map"] == {"IN": "X"}
    assert ours["model_warmup"][0]["inputs"]["X"]["dims"] == [2, 3]


def test_batching_int64_fields_and_priority_queue_policy():
    config = parse_config_text("m", """
        max_batch_size: 8
        dynamic_batching {
          max_queue_delay_microseconds: 100 priority_levels: 2 default_priority_level: 1
          default_queue_policy { default_timeout_microseconds: 5000 max_queue_size: 3 }
          priority_queue_policy { key: 2 value { timeout_action: DELAY default_timeout_microseconds: 7 } }
        }
        parameters { key: "K" value { string_value: "V" } }
    """)
    batching = config_to_json_dict(config)["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 1
    assert batching["default_queue_policy"] == {
        "timeout_action": "REJECT", "default_timeout_microseconds": 5000,
        "allow_timeout_override": False, "max_queue_size": 3}
    assert list(batching["priority_queue_policy"]) == ["2"]
    assert batching["priority_queue_policy"]["2"]["timeout_action"] == "DELAY"
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 7
    assert config_to_json_dict(config)["parameters"] == {"K": {"string_value": "V"}}


def test_sequence_batching_int64_fields():
    config = parse_config_text("m", """
        max_batch_size: 2
        sequence_batching {
          max_sequence_idle_microseconds: 3000000
          oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 50 }
          state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ -1, 2 ] } ]
        }
    """)
    batching = config_to_json_dict(config)["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 3000000
    assert batching["oldest"]["max_queue_delay_microseconds"] == 50
    assert batching["state"][0]["dims"] == [-1, 2]
    assert "direct" not in batching


def test_set_messages_with_default_values_are_printed():
    config = parse_config_text("m", "model_transaction_policy { } response_cache { enable: false }")
    ours = config_to_json_dict(config)
    assert ours["model_transaction_policy"] == {"decoupled": False}
    assert ours["response_cache"] == {"enable": False}


def test_64_bit_fields_triton_does_not_fix_stay_strings_as_triton_2_51_prints_them():
    """Seen side by side with Triton 2.51: an initial state's dims print as strings (Triton's fix
    looks for initial_state in the wrong object); so would a secondary device's id."""
    config = parse_config_text("m", """
        max_batch_size: 2
        sequence_batching {
          state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ]
                    initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" } } ]
        }
        instance_group [ { kind: KIND_CPU secondary_devices [ { kind: KIND_NVDLA device_id: 3 } ] } ]
    """)
    ours = config_to_json_dict(config)
    state = ours["sequence_batching"]["state"][0]
    assert state["dims"] == [1]
    assert state["initial_state"][0]["dims"] == ["1"]
    assert ours["instance_group"][0]["secondary_devices"][0]["device_id"] == "3"


def test_an_ensemble_shows_no_field_triton_2_51_does_not_know():
    config = parse_config_text("e", """
        platform: "ensemble" max_batch_size: 8
        ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "IN" value: "X" } } ] }
    """)
    assert list(config_to_json_dict(config)["ensemble_scheduling"]) == ["step"]
