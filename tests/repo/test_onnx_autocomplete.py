"""ONNX auto-complete: the onnxruntime backend's rules, on models built with the onnx helper API."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tritium.repo.onnx_autocomplete import read_onnx_io
from tests.repo.helpers import (
    BOOL, FLOAT, INT64, STRING, add_sub, identity, load, load_error, onnx_io, write_model)


def io_summary(tensors):
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims),
             list(t.reshape.shape) if t.HasField("reshape") else None) for t in tensors]


def test_batchable_model_gets_max_batch_size_4_and_dynamic_batching(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub(dims=(-1, 16))})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert list(config.dynamic_batching.preferred_batch_size) == [4]  # normalized
    assert io_summary(config.input) == [("INPUT0", "TYPE_FP32", [16], None),
                                        ("INPUT1", "TYPE_FP32", [16], None)]
    assert io_summary(config.output) == [("OUTPUT0", "TYPE_FP32", [16], None),
                                         ("OUTPUT1", "TYPE_FP32", [16], None)]


def test_default_max_batch_size_option(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    assert load(tmp_path, "m", default_max_batch_size=16).config.max_batch_size == 16
    # 1 batches, but is not worth a dynamic batcher (Triton: only when > 1).
    one = load(tmp_path, "m", default_max_batch_size=1).config
    assert one.max_batch_size == 1
    assert one.WhichOneof("scheduling_choice") is None
    assert load(tmp_path, "m", default_max_batch_size=-3).config.max_batch_size == 0  # max(N, 0)
    zero = load(tmp_path, "m", default_max_batch_size=0).config
    assert zero.max_batch_size == 0
    assert io_summary(zero.input)[0] == ("INPUT0", "TYPE_FP32", [-1, 16], None)


def test_explicit_max_batch_size_is_kept(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 32", {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 32
    assert list(config.dynamic_batching.preferred_batch_size) == [32]
    assert list(config.input[0].dims) == [16]


def test_explicit_max_batch_size_1_gets_no_dynamic_batching(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 1", {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 1
    assert config.WhichOneof("scheduling_choice") is None


def test_configured_scheduler_is_kept(tmp_path):
    write_model(tmp_path, "seq", "sequence_batching { }", {"1/model.onnx": add_sub()})
    config = load(tmp_path, "seq").config
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    write_model(tmp_path, "dyn", "dynamic_batching { max_queue_delay_microseconds: 500 }",
                {"1/model.onnx": add_sub()})
    config = load(tmp_path, "dyn").config
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [4]


def test_non_batchable_model_keeps_max_batch_size_0_and_full_dims(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=(3, 4))})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 0
    assert config.WhichOneof("scheduling_choice") is None
    assert io_summary(config.input) == [("INPUT0", "TYPE_FP32", [3, 4], None)]
    assert io_summary(config.output) == [("OUTPUT0", "TYPE_FP32", [3, 4], None)]


def test_non_batchable_model_with_max_batch_size_is_an_error(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 8", {"1/model.onnx": identity(dims=(3, 4))})
    message = load_error(tmp_path, "m")
    assert message == (f"{tmp_path / 'm' / 'config.pbtxt'}: autofill failed for model 'm': model "
                       "does not support batching while non-zero max_batch_size is specified")


def test_one_fixed_first_dim_makes_the_model_non_batchable(tmp_path):
    build = onnx_io([("A", FLOAT, [-1, 2]), ("B", FLOAT, [1, 2])], [("Y", FLOAT, [-1, 2])])
    write_model(tmp_path, "m", None, {"1/model.onnx": build})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 0
    assert io_summary(config.input) == [("A", "TYPE_FP32", [-1, 2], None),
                                        ("B", "TYPE_FP32", [1, 2], None)]


def test_a_fixed_output_first_dim_makes_the_model_non_batchable(tmp_path):
    build = onnx_io([("A", FLOAT, [-1, 2])], [("Y", FLOAT, [2])])
    write_model(tmp_path, "m", "max_batch_size: 2", {"1/model.onnx": build})
    assert "model does not support batching" in load_error(tmp_path, "m")


def test_scalar_tensors_non_batching_get_dims_1_without_reshape(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=())})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 0
    assert io_summary(config.input) == [("INPUT0", "TYPE_FP32", [1], None)]
    assert io_summary(config.output) == [("OUTPUT0", "TYPE_FP32", [1], None)]


def test_batch_only_tensors_get_dims_1_and_empty_reshape_when_batching(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=(-1,))})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 4
    assert io_summary(config.input) == [("INPUT0", "TYPE_FP32", [1], [])]
    assert io_summary(config.output) == [("OUTPUT0", "TYPE_FP32", [1], [])]


def test_inputs_and_outputs_given_means_no_auto_complete(tmp_path):
    write_model(tmp_path, "m", """
        platform: "onnxruntime_onnx"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 0  # batchable model, but nothing is completed
    assert config.WhichOneof("scheduling_choice") is None
    assert [t.name for t in config.output] == ["OUTPUT0"]


def test_only_inputs_given_completes_outputs_and_batching(tmp_path):
    write_model(tmp_path, "m", """
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert config.max_batch_size == 4
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
    assert io_summary(config.output) == [("OUTPUT0", "TYPE_FP32", [16], None),
                                         ("OUTPUT1", "TYPE_FP32", [16], None)]


def test_only_outputs_given_completes_inputs(tmp_path):
    write_model(tmp_path, "m", """
        max_batch_size: 2
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
    assert [t.name for t in config.output] == ["OUTPUT0"]


def test_batch_inputs_count_as_inputs(tmp_path):
    """Triton's onnxruntime backend adds batch_input to the input count."""
    write_model(tmp_path, "m", """
        max_batch_size: 4
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "INPUT1" data_type: TYPE_FP32
                        source_input: "INPUT0" } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """, {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m").config
    assert len(config.input) == 0
    assert config.WhichOneof("scheduling_choice") is None


def test_auto_complete_disabled(tmp_path):
    write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"', {"1/model.onnx": add_sub()})
    config = load(tmp_path, "m", auto_complete=False).config
    assert config.max_batch_size == 0
    assert len(config.input) == 0 and len(config.output) == 0
    assert config.WhichOneof("scheduling_choice") is None
    # Instance groups are filled even so (Triton does too).
    assert [(g.name, g.count) for g in config.instance_group] == [("m", 2)]


def test_auto_complete_disabled_needs_a_config_file(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": add_sub()})
    message = load_error(tmp_path, "m", auto_complete=False)
    assert message == (f"{tmp_path / 'm'}: has no config.pbtxt, and auto-complete is disabled "
                       "(--disable-auto-complete-config / --strict-model-config=true)")


def test_datatypes_are_mapped(tmp_path):
    build = onnx_io([("S", STRING, [-1, 1]), ("B", BOOL, [-1, 2]), ("I", INT64, [-1, 3])],
                    [("O", FLOAT, [-1, 4])])
    write_model(tmp_path, "m", None, {"1/model.onnx": build})
    config = load(tmp_path, "m").config
    assert io_summary(config.input) == [("S", "TYPE_STRING", [1], None), ("B", "TYPE_BOOL", [2], None),
                                        ("I", "TYPE_INT64", [3], None)]


@pytest.mark.parametrize("dtype, expected", [
    (np.float16, "TYPE_FP16"), (np.float64, "TYPE_FP64"), (np.int8, "TYPE_INT8"),
    (np.uint8, "TYPE_UINT8"), (np.int32, "TYPE_INT32"), (np.uint64, "TYPE_UINT64"),
])
def test_numeric_datatypes(tmp_path, dtype, expected):
    write_model(tmp_path, "m", None, {"1/model.onnx": identity(dims=(2,), dtype=dtype)})
    assert mc.DataType.Name(load(tmp_path, "m").config.input[0].data_type) == expected


def test_initializers_are_not_inputs(tmp_path):
    from examples.models import mlp
    path = mlp(tmp_path / "mlp.onnx", sizes=(4, 8, 2))
    inputs, outputs = read_onnx_io("m", path)
    assert [(t.name, t.data_type, t.dims) for t in inputs] == [("INPUT0", "TYPE_FP32", (-1, 4))]
    assert [(t.name, t.dims) for t in outputs] == [("OUTPUT0", (-1, 2))]


def test_latest_loadable_version_is_read(tmp_path):
    write_model(tmp_path, "m", "version_policy { all { } }", {
        "1/model.onnx": identity(dims=(3,)), "2/model.onnx": add_sub()})
    assert [t.name for t in load(tmp_path, "m").config.input] == ["INPUT0", "INPUT1"]


def test_unreadable_onnx_file_names_the_file(tmp_path):
    write_model(tmp_path, "m", None, {"1/model.onnx": b"this is not protobuf"})
    message = load_error(tmp_path, "m")
    assert message.startswith(f"{tmp_path / 'm' / '1' / 'model.onnx'}: cannot read ONNX model")


def test_onnx_type_without_triton_datatype(tmp_path):
    build = onnx_io([("C", 14, [2])], [("Y", 14, [2])])  # COMPLEX64
    write_model(tmp_path, "m", None, {"1/model.onnx": build})
    message = load_error(tmp_path, "m")
    assert "ONNX tensor 'C' has element type 14, which has no Triton datatype" in message


def test_auto_completed_config_is_validated(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: 4\ndynamic_batching { preferred_batch_size: [ 8 ] }",
                {"1/model.onnx": add_sub()})
    assert "preferred_batch_size 8 is larger than max_batch_size 4" in load_error(tmp_path, "m")


def test_negative_max_batch_size_is_reported_as_such_not_as_autofill_failure(tmp_path):
    write_model(tmp_path, "m", "max_batch_size: -1", {"1/model.onnx": identity(dims=(3,))})
    message = load_error(tmp_path, "m")
    assert "model 'm': 'max_batch_size' must be non-negative, got -1" in message
