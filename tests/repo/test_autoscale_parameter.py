"""The tritium.autoscale model parameter: defaults, every key, and errors that name the setting."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.repo.autoscale import AutoscalePolicy, autoscale_policy
from tritium.repo.errors import ModelLoadError


def config(value: str | None, extra: str = ""):
    text = 'name: "m" backend: "python" max_batch_size: 4 ' + extra
    if value is not None:
        text += f' parameters {{ key: "tritium.autoscale" value: {{ string_value: "{value}" }} }}'
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_without_the_parameter_instances_stay_fixed():
    assert autoscale_policy(config(None)) is None


def test_every_key_is_optional_and_read_with_its_type():
    assert autoscale_policy(config("")) == AutoscalePolicy()
    assert autoscale_policy(config("min=0, max=8,idle_s=2.5,target_queue_ms=15,cooldown_s=0.5")) == \
        AutoscalePolicy(0, 8, 2.5, 15.0, 0.5)


@pytest.mark.parametrize("value, message", [
    ("min=one", "parameter 'tritium.autoscale': 'min' must be an integer, got 'one'"),
    ("idle_s=soon", "parameter 'tritium.autoscale': 'idle_s' must be a number, got 'soon'"),
    ("mni=1", "parameter 'tritium.autoscale': unknown setting 'mni=1'"),
    ("min=3,max=2", "need 0 <= min <= max and max >= 1, got min=3, max=2"),
    ("max=0", "need 0 <= min <= max and max >= 1, got min=1, max=0"),
    ("idle_s=0", "'idle_s' must be a positive number"),
    ("idle_s=nan", "'idle_s' must be a positive number"),
    ("cooldown_s=-1", "'cooldown_s' one from 0 to 86400"),
    ("cooldown_s=inf", "'cooldown_s' one from 0 to 86400"),
    ("target_queue_ms=nan", "'target_queue_ms' a number not negative"),
])
def test_a_malformed_value_fails_the_load_naming_the_setting(value, message):
    with pytest.raises(ModelLoadError) as failed:
        autoscale_policy(config(value))
    assert message in str(failed.value)


def test_decoupled_models_cannot_scale():
    with pytest.raises(ModelLoadError, match="sequence and decoupled models cannot scale"):
        autoscale_policy(config("", "model_transaction_policy { decoupled: true }"))
