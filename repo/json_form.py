"""The config as JSON, exactly as Triton's ``GET /v2/models/{m}/config`` prints it.

protobuf's JSON printer does most of it (snake_case names, enum names, every scalar,
repeated and map field printed at its default, unset messages omitted); two fixes
follow, as in Triton's ``ModelConfigToJson``: 64-bit integers become JSON numbers
instead of strings, and keys keep the proto's declaration order.
"""

from __future__ import annotations

from google.protobuf import descriptor, json_format

from tritium.repo.config_file import ModelConfig

_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def config_to_json_dict(config: ModelConfig) -> dict:
    raw = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _fix(raw, config.DESCRIPTOR)


def _fix(value: dict, message_descriptor) -> dict:
    fixed = {}
    for field in message_descriptor.fields:  # declaration order
        if field.name not in value:
            continue
        fixed[field.name] = _fix_field(value[field.name], field)
    return fixed


def _fix_field(value, field):
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: _fix_field(item, value_field) for key, item in value.items()}
    if field.is_repeated:  # protobuf 6 deprecates field.label
        return [_fix_single(item, field) for item in value]
    return _fix_single(value, field)


def _fix_single(value, field):
    if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        return _fix(value, field.message_type)
    if field.type in _INT64_TYPES:
        return int(value)
    return value
