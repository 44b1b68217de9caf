"""config.pbtxt parsing: protobuf text format rules, names, custom config files, bad files."""

from __future__ import annotations

import os

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritium.repo import ModelLoadError
from tritium.repo.config_file import MAX_CONFIG_BYTES, config_path, parse_config_text, read_config
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, load, load_error, write_model

PY_FILES = {"1/model.py": PLAIN_PY_MODEL}


def test_bracket_list_style_and_repeated_blocks_give_the_same_config():
    bracketed = parse_config_text("m", """
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] },
                { name: "B" data_type: TYPE_INT64 dims: [ -1 ] } ]
    """)
    repeated = parse_config_text("m", """
        input { name: "A" data_type: TYPE_FP32 dims: 2 dims: 3 }
        input { name: "B" data_type: TYPE_INT64 dims: [ -1 ] }
    """)
    assert bracketed == repeated
    assert [t.name for t in bracketed.input] == ["A", "B"]
    assert list(bracketed.input[0].dims) == [2, 3]
    assert bracketed.input[1].data_type == mc.TYPE_INT64


def test_comments_optional_colons_and_separators():
    config = parse_config_text("m", """
        # a comment line
        name: "m"  # trailing comment
        max_batch_size: 8;
        dynamic_batching: { preferred_batch_size: [ 2, 4 ], max_queue_delay_microseconds: 100 }
        instance_group { kind: KIND_CPU, count: 3 }
    """)
    assert config.name == "m"
    assert config.max_batch_size == 8
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 3


def test_maps_as_blocks_and_as_lists():
    config = parse_config_text("m", """
        parameters { key: "A" value: { string_value: "1" } }
        parameters: { key: "B", value { string_value: "two" } }
        metric_tags [ { key: "team" value: "ml" } ]
        cc_model_filenames { key: "8.0" value: "model_a100.onnx" }
    """)
    assert {k: v.string_value for k, v in config.parameters.items()} == {"A": "1", "B": "two"}
    assert dict(config.metric_tags) == {"team": "ml"}
    assert dict(config.cc_model_filenames) == {"8.0": "model_a100.onnx"}


def test_unknown_field_is_an_error_with_line_and_column(tmp_path):
    write_model(tmp_path, "m", 'name: "m"\nbogus_field: 1\n', PY_FILES)
    message = load_error(tmp_path, "m")
    path = tmp_path / "m" / "config.pbtxt"
    assert message.startswith(f"{path}:2:1: ")
    assert 'has no field named "bogus_field"' in message


def test_unknown_nested_field_and_enum_value_are_errors(tmp_path):
    write_model(tmp_path, "nested", 'input [ { name: "A" data_type: TYPE_FP32 dims: [1] shape: [1] } ]',
                PY_FILES)
    assert 'has no field named "shape"' in load_error(tmp_path, "nested")
    write_model(tmp_path, "enum", "instance_group [ { kind: KIND_TPU } ]", PY_FILES)
    message = load_error(tmp_path, "enum")
    assert ":1:" in message and "KIND_TPU" in message


@pytest.mark.parametrize("text, line, column, fragment", [
    ('name: "m"\nmax_batch_size: "eight"\n', 2, 17, "Couldn't parse integer"),
    ('input [ { name: "A" ', 1, 17, 'Expected "}"'),
    ('version_policy { latest { } all { } }', 1, 29, "oneof"),
    ('name: "m"\nname: "m"\n', 2, 7, 'multiple "name" fields'),
])
def test_malformed_config_reports_file_line_and_column(tmp_path, text, line, column, fragment):
    write_model(tmp_path, "m", text, PY_FILES)
    message = load_error(tmp_path, "m")
    assert message.startswith(f"{tmp_path / 'm' / 'config.pbtxt'}:{line}:{column}: ")
    assert fragment in message


def test_parse_error_without_a_path_still_names_line_and_column():
    with pytest.raises(ModelLoadError) as info:
        parse_config_text("m", "bogus: 1")
    assert info.value.message.startswith("1:1: ")
    assert info.value.model == "m"


def test_name_defaults_to_the_folder_name(tmp_path):
    write_model(tmp_path, "folder_name", "max_batch_size: 0", PY_FILES)
    assert load(tmp_path, "folder_name").config.name == "folder_name"


def test_name_must_match_the_folder_name(tmp_path):
    write_model(tmp_path, "real", 'name: "other"', PY_FILES)
    message = load_error(tmp_path, "real")
    assert str(tmp_path / "real" / "config.pbtxt") in message
    assert "'other'" in message and "'real'" in message and "does not match" in message


def test_model_config_name_picks_configs_folder_file(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 0", {
        **PY_FILES, "configs/h100.pbtxt": "max_batch_size: 16\ndynamic_batching { }\n"})
    chosen = load(tmp_path, "m", model_config_name="h100")
    assert chosen.config.max_batch_size == 16
    assert chosen.config_file == tmp_path / "m" / "configs" / "h100.pbtxt"
    default = load(tmp_path, "m")
    assert default.config.max_batch_size == 0
    assert default.config_file == tmp_path / "m" / "config.pbtxt"


def test_model_config_name_falls_back_to_config_pbtxt(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 2", PY_FILES)
    definition = load(tmp_path, "m", model_config_name="missing")
    assert definition.config.max_batch_size == 2
    assert definition.config_file == tmp_path / "m" / "config.pbtxt"
    assert config_path(tmp_path / "m", "missing") == tmp_path / "m" / "config.pbtxt"
    assert config_path(tmp_path / "m", None) == tmp_path / "m" / "config.pbtxt"


def test_errors_in_the_custom_config_name_that_file(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 0", {**PY_FILES, "configs/bad.pbtxt": "nope: 1"})
    message = load_error(tmp_path, "m", model_config_name="bad")
    assert message.startswith(f"{tmp_path / 'm' / 'configs' / 'bad.pbtxt'}:1:1: ")


def test_no_config_file_is_fine_when_auto_complete_can_fill_it(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    definition = load(tmp_path, "m")
    assert definition.config_file is None
    assert definition.config.name == "m"


def test_huge_config_is_refused_without_reading_it(tmp_path):
    model_dir = write_model(tmp_path, "m", None, PY_FILES)
    with open(model_dir / "config.pbtxt", "wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 1)  # sparse: cheap to make
    message = load_error(tmp_path, "m")
    assert str(model_dir / "config.pbtxt") in message
    assert f"{MAX_CONFIG_BYTES + 1} bytes" in message


def test_binary_config_is_refused(tmp_path):
    write_model(tmp_path, "m", None, {**PY_FILES, "config.pbtxt": b"\x08\x96\x01\x00\xff"})
    message = load_error(tmp_path, "m")
    assert "config.pbtxt" in message and "binary file" in message


def test_non_utf8_config_is_refused(tmp_path):
    write_model(tmp_path, "m", None, {**PY_FILES, "config.pbtxt": b'name: "caf\xe9"'})
    message = load_error(tmp_path, "m")
    assert "not UTF-8" in message and "byte 10" in message


def test_config_pbtxt_that_is_a_folder(tmp_path):
    model_dir = write_model(tmp_path, "m", None, PY_FILES)
    (model_dir / "config.pbtxt").mkdir()
    message = load_error(tmp_path, "m")
    assert message == f"{model_dir / 'config.pbtxt'}: is a directory, expected a protobuf text file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_config(tmp_path):
    model_dir = write_model(tmp_path, "m", "max_batch_size: 0", PY_FILES)
    (model_dir / "config.pbtxt").chmod(0)
    try:
        message = load_error(tmp_path, "m")
    finally:
        (model_dir / "config.pbtxt").chmod(0o644)
    assert "cannot be read" in message and "Permission denied" in message


def test_dangling_symlink_config_cannot_be_read(tmp_path):
    model_dir = write_model(tmp_path, "m", None, PY_FILES)
    (model_dir / "config.pbtxt").symlink_to(tmp_path / "nowhere.pbtxt")
    message = load_error(tmp_path, "m")
    assert "config.pbtxt: cannot be read" in message


def test_read_config_returns_the_parsed_message(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "x" max_batch_size: 3')
    config = read_config("x", path)
    assert (config.name, config.max_batch_size) == ("x", 3)


def test_unreadable_config_simulated(tmp_path, monkeypatch):
    """The chmod 000 case for runs as root: the read fails with EACCES all the same."""
    model_dir = write_model(tmp_path, "m", "max_batch_size: 0", PY_FILES)
    real_read_bytes = type(model_dir).read_bytes

    def read_bytes(path):
        if path.name == "config.pbtxt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read_bytes(path)

    monkeypatch.setattr(type(model_dir), "read_bytes", read_bytes)
    message = load_error(tmp_path, "m")
    assert message == f"{model_dir / 'config.pbtxt'}: cannot be read: Permission denied"
