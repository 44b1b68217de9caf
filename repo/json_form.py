"""The config as JSON, exactly as Triton's ``GET /v2/models/{m}/config`` prints it.

protobuf's JSON printer does most of it (snake_case names, enum names, every scalar,
repeated and map field printed at its default, unset messages omitted); then, as in
Triton's ``ModelConfigToJson``, keys keep the proto's declaration order and the 64-bit
integers of the fields Triton fixes become JSON numbers. Other 64-bit integers stay
strings, as protobuf prints them and Triton 2.51 shows them (an initial state's dims,
which Triton means to fix but looks up in the wrong object; a secondary device's id;
a CUDA graph's shapes).
"""

from __future__ import annotations

from google.protobuf import descriptor, json_format

from tritium.repo.config_file import ModelConfig

_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


# The 64-bit fields Triton's ModelConfigToJson turns into numbers, by their path of field
# names (a repeated field's items and a map's values share its name).
_NUMBERS = frozenset({
    "input.dims", "input.reshape.shape", "output.dims", "output.reshape.shape",
    "version_policy.specific.versions",
    "dynamic_batching.max_queue_delay_microseconds", "dynamic_batching.priority_levels",
    "dynamic_batching.default_priority_level", "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    "dynamic_batching.priority_queue_policy.default_timeout_microseconds",
    "sequence_batching.max_sequence_idle_microseconds", "sequence_batching.oldest.max_queue_delay_microseconds",
    "sequence_batching.direct.max_queue_delay_microseconds", "sequence_batching.state.dims",
    "ensemble_scheduling.step.model_version",
    "model_warmup.inputs.dims",
})

# Fields of the installed proto that Triton 2.51's has not: left out while unset.
_NEWER_FIELDS = ("ensemble_scheduling.max_inflight_requests",)


def config_to_json_dict(config: ModelConfig) -> dict:
    raw = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _fix(raw, config.DESCRIPTOR, "")


def _fix(value: dict, message_descriptor, path: str) -> dict:
    fixed = {}
    for field in message_descriptor.fields:  # declaration order
        if field.name not in value:
            continue
        field_path = path + field.name
        if field_path in _NEWER_FIELDS and not value[field.name]:
            continue
        fixed[field.name] = _fix_field(value[field.name], field, field_path)
    return fixed


def _fix_field(value, field, path: str):
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: _fix_single(item, value_field, path) for key, item in value.items()}
    if field.is_repeated:  # protobuf 6 deprecates field.label
        return [_fix_single(item, field, path) for item in value]
    return _fix_single(value, field, path)


def _fix_single(value, field, path: str):
    if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        return _fix(value, field.message_type, path + ".")
    if field.type in _INT64_TYPES and path in _NUMBERS:
        return int(value)
    return value
