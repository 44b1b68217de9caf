"""Backend / platform resolution (reference table 4.9) and the platforms tritium refuses."""

from __future__ import annotations

import pytest

from tritium.repo import ModelLoadError
from tritium.repo.backends import SUPPORTED_DESCRIPTION, check_supported, resolve_backend
from tritium.repo.config_file import parse_config_text
from tests.repo.helpers import PLAIN_PY_MODEL, add_sub, load, load_error, minimal_io, write_model


def resolved(tmp_path, text: str, files: dict[str, object] | None = None, name: str = "m"):
    """(backend, platform, default_model_filename) after resolution of config ``text``."""
    model_dir = write_model(tmp_path, name, None, files or {})
    config = parse_config_text(name, text)
    resolve_backend(name, config, model_dir)
    return config.backend, config.platform, config.default_model_filename


@pytest.mark.parametrize("text", [
    'platform: "onnxruntime_onnx"', 'backend: "onnxruntime"', 'platform: "onnxruntime"',
    'default_model_filename: "model.onnx"',
])
def test_onnx_from_config(tmp_path, text):
    assert resolved(tmp_path, text) == ("onnxruntime", "onnxruntime_onnx", "model.onnx")


def test_onnx_from_model_file_and_from_model_folder(tmp_path):
    assert resolved(tmp_path, "", {"1/model.onnx": b"x"}) == (
        "onnxruntime", "onnxruntime_onnx", "model.onnx")
    # A large ONNX model may be a folder named model.onnx.
    assert resolved(tmp_path, "", {"1/model.onnx/model.onnx": b"x"}, name="big") == (
        "onnxruntime", "onnxruntime_onnx", "model.onnx")


def test_onnx_keeps_a_custom_default_model_filename(tmp_path):
    text = 'backend: "onnxruntime" default_model_filename: "net.onnx"'
    assert resolved(tmp_path, text) == ("onnxruntime", "onnxruntime_onnx", "net.onnx")


@pytest.mark.parametrize("text", [
    'platform: "pytorch_libtorch"', 'platform: "libtorch"', 'backend: "pytorch"',
    'backend: "libtorch"', 'default_model_filename: "model.pt"',
])
def test_torchscript_from_config(tmp_path, text):
    assert resolved(tmp_path, text) == ("pytorch", "pytorch_libtorch", "model.pt")


def test_torchscript_from_model_file_but_not_from_a_folder(tmp_path):
    assert resolved(tmp_path, "", {"1/model.pt": b"x"}) == ("pytorch", "pytorch_libtorch", "model.pt")
    # Triton only takes a model.pt *file* as TorchScript; a folder named so tells nothing.
    with pytest.raises(ModelLoadError, match="cannot tell which backend"):
        resolved(tmp_path, "", {"1/model.pt/data": b"x"}, name="dir")


def test_pytorch_with_python_runtime_gets_no_model_pt_default(tmp_path):
    assert resolved(tmp_path, 'backend: "pytorch" runtime: "model.py"') == (
        "pytorch", "pytorch_libtorch", "")


@pytest.mark.parametrize("text, files", [
    ('backend: "python"', {}),
    ('default_model_filename: "model.py"', {}),
    ("", {"1/model.py": "x = 1"}),
])
def test_python_resolution(tmp_path, text, files):
    assert resolved(tmp_path, text, files) == ("python", "", "model.py")


def test_file_probe_uses_the_lowest_numbered_version(tmp_path):
    files = {"2/model.onnx": b"x", "10/model.py": "x = 1", "1/model.py": "x = 1"}
    assert resolved(tmp_path, "", files)[0] == "python"


def test_files_are_not_probed_when_the_config_names_a_backend(tmp_path):
    assert resolved(tmp_path, 'backend: "python"', {"1/model.onnx": b"x"}) == (
        "python", "", "model.py")


def test_ensemble_platform_and_ensemble_scheduling_imply_ensemble(tmp_path):
    assert resolved(tmp_path, 'platform: "ensemble"') == ("", "ensemble", "")
    text = 'ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }'
    assert resolved(tmp_path, text, name="e2") == ("", "ensemble", "")


def test_custom_backend_from_model_name(tmp_path):
    assert resolved(tmp_path, "", {"1/weights.bin": b"x"}, name="my_model.identity") == (
        "identity", "", "model.identity")


def test_custom_backend_named_in_config_is_kept(tmp_path):
    assert resolved(tmp_path, 'backend: "my_backend"') == ("my_backend", "", "")


def test_no_backend_found_names_the_model_and_the_files_looked_for(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolved(tmp_path, "", {"1/weights.bin": b"x"}, name="mystery")
    message = info.value.message
    assert "model 'mystery'" in message
    for filename in ("model.onnx", "model.pt", "model.py", "'backend: \"<name>\"'"):
        assert filename in message


@pytest.mark.parametrize("config, files, value, field, what", [
    ('platform: "tensorrt_plan"', {"1/model.plan": b"x"}, "tensorrt_plan", "platform", "TensorRT"),
    (None, {"1/model.plan": b"x"}, "tensorrt_plan", "platform", "TensorRT"),
    ('backend: "tensorrt"', {"1/model.plan": b"x"}, "tensorrt", "backend", "TensorRT"),
    ('platform: "tensorflow_savedmodel"', {"1/model.savedmodel/saved_model.pb": b"x"},
     "tensorflow_savedmodel", "platform", "TensorFlow SavedModel"),
    (None, {"1/model.savedmodel/saved_model.pb": b"x"}, "tensorflow_savedmodel", "platform",
     "TensorFlow SavedModel"),
    (None, {"1/model.graphdef": b"x"}, "tensorflow_graphdef", "platform", "TensorFlow GraphDef"),
    ('platform: "tensorflow_graphdef"', {"1/model.graphdef": b"x"}, "tensorflow_graphdef",
     "platform", "TensorFlow GraphDef"),
    ('backend: "openvino"', {"1/model.xml": b"x"}, "openvino", "backend", "OpenVINO"),
    (None, {"1/model.xml": b"x"}, "openvino", "backend", "OpenVINO"),
    ('platform: "caffe2_netdef"', {"1/model.netdef": b"x"}, "caffe2_netdef", "platform",
     "Caffe2 NetDef"),
    ('platform: "torch_aoti"', {"1/model.pt2": b"x"}, "torch_aoti", "platform",
     "PyTorch AOTInductor"),
    (None, {"1/model.pt2": b"x"}, "torch_aoti", "platform", "PyTorch AOTInductor"),
    ('backend: "dali"', {"1/model.dali": b"x"}, "dali", "backend", "DALI"),
    ('backend: "vllm"', {"1/model.json": b"x"}, "vllm", "backend", "vLLM"),
    ('backend: "tensorrtllm"', {"1/x": b"x"}, "tensorrtllm", "backend", "TensorRT-LLM"),
    ('backend: "fil"', {"1/xgboost.model": b"x"}, "fil", "backend", "Forest Inference Library"),
])
def test_unsupported_platforms_are_refused_by_name(tmp_path, config, files, value, field, what):
    write_model(tmp_path, "m", config, files)
    message = load_error(tmp_path, "m")
    assert f"model 'm' uses {field} '{value}' ({what}), which tritium does not support" in message
    assert SUPPORTED_DESCRIPTION in message


def test_unknown_platform_is_refused(tmp_path):
    write_model(tmp_path, "m", 'platform: "mxnet_symbol"', {"1/model.json": b"x"})
    message = load_error(tmp_path, "m")
    assert "model 'm' has unknown platform 'mxnet_symbol'" in message
    assert SUPPORTED_DESCRIPTION in message


@pytest.mark.parametrize("text, fragment", [
    ('platform: "pytorch_libtorch" backend: "onnxruntime"',
     "pairs platform 'pytorch_libtorch' with backend 'onnxruntime'; backend 'onnxruntime' runs "
     "platform 'onnxruntime_onnx'"),
    ('platform: "onnxruntime_onnx" backend: "pytorch"',
     "pairs platform 'onnxruntime_onnx' with backend 'pytorch'"),
    ('platform: "onnxruntime_onnx" backend: "python"',
     "pairs platform 'onnxruntime_onnx' with backend 'python'; the python backend takes no platform"),
    ('platform: "ensemble" backend: "python"', "ensemble 'm' must not set backend 'python'"),
])
def test_inconsistent_platform_and_backend(text, fragment):
    config = parse_config_text("m", text)
    with pytest.raises(ModelLoadError) as info:
        check_supported("m", config)
    assert fragment in info.value.message


def test_supported_models_resolve_end_to_end(tmp_path):
    write_model(tmp_path, "onnx", None, {"1/model.onnx": add_sub()})
    write_model(tmp_path, "py", None, {"1/model.py": PLAIN_PY_MODEL})
    write_model(tmp_path, "ts", 'platform: "pytorch_libtorch"' + minimal_io(), {"1/model.pt": b"x"})
    got = {name: (d.config.backend, d.config.platform, d.config.default_model_filename)
           for name in ("onnx", "py", "ts") for d in [load(tmp_path, name)]}
    assert got == {
        "onnx": ("onnxruntime", "onnxruntime_onnx", "model.onnx"),
        "py": ("python", "", "model.py"),
        "ts": ("pytorch", "pytorch_libtorch", "model.pt"),
    }


def test_runtime_is_kept(tmp_path):
    write_model(tmp_path, "m", 'backend: "python" runtime: "model.py"', {"1/model.py": PLAIN_PY_MODEL})
    assert load(tmp_path, "m").config.runtime == "model.py"
