"""Normalization defaults and instance groups resolved per host (reference 4.5 and 4.9)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritium.repo import ModelLoadError
from tritium.repo.config_file import parse_config_text
from tritium.repo.instance_groups import instance_kind_name, resolve_instance_groups
from tritium.repo.normalize import SEQUENCE_IDLE_DEFAULT_US, normalize
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, load, load_error, minimal_io, write_model

Group = mc.ModelInstanceGroup
CPU, GPU, AUTO, MODEL = Group.KIND_CPU, Group.KIND_GPU, Group.KIND_AUTO, Group.KIND_MODEL


def groups(config):
    return [(g.name, Group.Kind.Name(g.kind), g.count, list(g.gpus)) for g in config.instance_group]


def resolved(text: str, gpus=(), backend: str = "onnxruntime", name: str = "m"):
    config = parse_config_text(name, text)
    config.name, config.backend = name, backend
    resolve_instance_groups(config, gpus)
    return config


# -- normalization -------------------------------------------------------------------------

def test_defaults_filled_by_normalize():
    config = parse_config_text("m", "max_batch_size: 8\ndynamic_batching { }")
    normalize(config)
    assert config.version_policy.latest.num_versions == 1
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.optimization.input_pinned_memory.enable is True
    assert config.optimization.output_pinned_memory.enable is True


def test_explicit_values_are_kept():
    config = parse_config_text("m", """
        max_batch_size: 8
        version_policy { all { } }
        dynamic_batching { preferred_batch_size: [ 2, 6 ] }
        optimization { input_pinned_memory { enable: false } }
    """)
    normalize(config)
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 6]
    assert config.optimization.input_pinned_memory.enable is False
    assert config.optimization.output_pinned_memory.enable is True


def test_no_preferred_batch_size_without_batching():
    config = parse_config_text("m", "dynamic_batching { }")
    normalize(config)
    assert list(config.dynamic_batching.preferred_batch_size) == []


def test_sequence_batching_defaults():
    config = parse_config_text("m", "max_batch_size: 4\nsequence_batching { oldest { } }")
    normalize(config)
    assert config.sequence_batching.max_sequence_idle_microseconds == SEQUENCE_IDLE_DEFAULT_US == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]
    kept = parse_config_text("m", "sequence_batching { max_sequence_idle_microseconds: 5 }")
    normalize(kept)
    assert kept.sequence_batching.max_sequence_idle_microseconds == 5


def test_ensembles_get_no_pinned_memory_defaults():
    config = parse_config_text("e", 'platform: "ensemble"')
    normalize(config)
    assert not config.HasField("optimization")


def test_normalized_config_of_a_loaded_model(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" sequence_batching { }', {"1/model.py": PLAIN_PY_MODEL})
    config = load(tmp_path, "m").config
    assert config.version_policy.latest.num_versions == 1
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert config.optimization.output_pinned_memory.enable is True


# -- instance groups -----------------------------------------------------------------------

def test_default_group_onnx_on_cpu_host_has_two_instances():
    assert groups(resolved("")) == [("m", "KIND_CPU", 2, [])]


def test_default_group_python_and_pytorch_on_cpu_host_have_one_instance():
    assert groups(resolved("", backend="python")) == [("m", "KIND_CPU", 1, [])]
    assert groups(resolved("", backend="pytorch")) == [("m", "KIND_CPU", 1, [])]


def test_default_group_on_gpu_host_is_one_instance_on_every_gpu():
    assert groups(resolved("", gpus=(0, 1))) == [("m", "KIND_GPU", 1, [0, 1])]
    assert groups(resolved("", gpus=(0, 1), backend="python")) == [("m", "KIND_GPU", 1, [0, 1])]


def test_kind_auto_with_listed_gpus():
    # All listed GPUs exist: GPU.
    assert groups(resolved("instance_group [ { gpus: [ 1 ] } ]", gpus=(0, 1))) == [
        ("m_0", "KIND_GPU", 1, [1])]


def test_kind_auto_with_a_gpu_the_host_lacks_becomes_cpu_and_then_fails():
    # Triton: KIND_AUTO -> KIND_CPU, and a CPU group with GPUs listed is invalid.
    with pytest.raises(ModelLoadError) as info:
        resolved("instance_group [ { gpus: [ 3 ] } ]", gpus=(0, 1))
    assert "instance group 'm_0' of model 'm' has kind KIND_CPU but specifies one or more GPUs" \
        in info.value.message


def test_explicit_groups_get_indexed_names_and_default_counts():
    config = resolved("""
        instance_group [ { kind: KIND_CPU }, { name: "fast" kind: KIND_CPU count: 3 },
                         { kind: KIND_MODEL } ]
    """)
    assert groups(config) == [("m_0", "KIND_CPU", 2, []), ("fast", "KIND_CPU", 3, []),
                              ("m_2", "KIND_MODEL", 1, [])]


def test_count_below_one_takes_the_default_as_in_triton():
    config = resolved("instance_group [ { kind: KIND_CPU count: -3 } ]", backend="python")
    assert groups(config) == [("m_0", "KIND_CPU", 1, [])]


def test_gpu_group_without_gpus_gets_all_of_them():
    assert groups(resolved("instance_group [ { kind: KIND_GPU count: 2 } ]", gpus=(0, 1))) == [
        ("m_0", "KIND_GPU", 2, [0, 1])]


def test_gpu_group_on_a_host_without_gpus():
    with pytest.raises(ModelLoadError) as info:
        resolved("instance_group [ { kind: KIND_GPU } ]")
    assert info.value.message == "instance group 'm_0' of model 'm' has kind KIND_GPU but no GPUs are available"


def test_gpu_group_naming_a_missing_gpu():
    with pytest.raises(ModelLoadError) as info:
        resolved("instance_group [ { name: \"g\" kind: KIND_GPU gpus: [ 0, 5 ] } ]", gpus=(0, 1))
    assert info.value.message == ("instance group 'g' of model 'm' specifies GPU 5, which this host "
                                  "does not have (GPUs here: 0, 1)")


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_MODEL"])
def test_cpu_and_model_groups_must_not_list_gpus(kind):
    with pytest.raises(ModelLoadError) as info:
        resolved(f"instance_group [ {{ kind: {kind} gpus: [ 0 ] }} ]", gpus=(0,))
    assert info.value.message == (f"instance group 'm_0' of model 'm' has kind {kind} but "
                                  "specifies one or more GPUs")


def test_profile_is_tensorrt_only():
    with pytest.raises(ModelLoadError) as info:
        resolved('instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]')
    assert "instance group 'm_0' of model 'm' specifies 'profile'" in info.value.message


def test_duplicate_group_names():
    with pytest.raises(ModelLoadError) as info:
        resolved('instance_group [ { name: "g" kind: KIND_CPU }, { name: "g" kind: KIND_CPU } ]')
    assert "instance group 'g' of model 'm': the name is used by more than one instance group" \
        in info.value.message


def test_ensembles_get_no_groups_and_must_not_have_any():
    config = parse_config_text("e", 'platform: "ensemble"')
    config.name = "e"
    resolve_instance_groups(config, (0,))
    assert len(config.instance_group) == 0
    bad = parse_config_text("e", 'name: "e" platform: "ensemble" instance_group [ { count: 1 } ]')
    with pytest.raises(ModelLoadError) as info:
        resolve_instance_groups(bad, ())
    assert info.value.message == "ensemble 'e' must not specify 'instance_group'"


def test_instance_kind_name():
    config = resolved("instance_group [ { kind: KIND_CPU }, { kind: KIND_MODEL } ]", gpus=())
    assert [instance_kind_name(g) for g in config.instance_group] == ["CPU", "MODEL"]
    assert instance_kind_name(resolved("", gpus=(0,)).instance_group[0]) == "GPU"


def test_portable_config_keeps_kind_auto_for_worker_hosts(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    cpu_host = load(tmp_path, "m", gpus=())
    gpu_host = load(tmp_path, "m", gpus=(0, 1))
    assert groups(cpu_host.config) == [("m", "KIND_CPU", 2, [])]
    assert groups(gpu_host.config) == [("m", "KIND_GPU", 1, [0, 1])]
    # The config a worker host receives has the group unresolved; it resolves it itself.
    assert cpu_host.portable_config == gpu_host.portable_config
    assert groups(cpu_host.portable_config) == []
    worker = type(cpu_host.portable_config)()
    worker.CopyFrom(cpu_host.portable_config)
    resolve_instance_groups(worker, (3,))
    assert groups(worker) == [("m", "KIND_GPU", 1, [3])]


def test_instance_group_errors_fail_the_load_naming_the_file(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]',
                {"1/model.py": PLAIN_PY_MODEL})
    message = load_error(tmp_path, "m", gpus=(0,))
    assert message.startswith(f"{tmp_path / 'm' / 'config.pbtxt'}: instance group 'm_0'")
    assert "specifies GPU 1" in message


def test_torchscript_cpu_count_default(tmp_path):
    write_model(tmp_path, "ts", 'platform: "pytorch_libtorch"' + minimal_io(), {"1/model.pt": b"x"})
    assert groups(load(tmp_path, "ts").config) == [("ts", "KIND_CPU", 1, [])]
