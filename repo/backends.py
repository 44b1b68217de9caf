"""Which backend runs a model: Triton's platform/backend/filename resolution (table 4.9).

``resolve_backend`` fills ``platform``, ``backend`` and ``default_model_filename`` the way
Triton's ``AutoCompleteBackendFields`` does, looking into the lowest-numbered version
folder when the config does not say; ``check_supported`` then refuses, with a message
that says what tritium runs, the platforms Triton knows and tritium does not.
"""

from __future__ import annotations

from pathlib import Path

from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import ConfigRejected, ModelLoadError

ONNXRUNTIME = "onnxruntime"
PYTORCH = "pytorch"
PYTHON = "python"

ONNX_PLATFORM = "onnxruntime_onnx"
TORCHSCRIPT_PLATFORM = "pytorch_libtorch"
ENSEMBLE_PLATFORM = "ensemble"

ONNX_FILENAME = "model.onnx"
TORCHSCRIPT_FILENAME = "model.pt"
PYTHON_FILENAME = "model.py"

# Aliases users write for the backends tritium runs.
_PLATFORM_ALIASES = {"libtorch": TORCHSCRIPT_PLATFORM, "onnxruntime": ONNX_PLATFORM}
_BACKEND_ALIASES = {"libtorch": PYTORCH}

# What Triton knows but tritium cannot run: platform or backend name -> what it is.
UNSUPPORTED = {
    "tensorrt_plan": "TensorRT",
    "tensorrt": "TensorRT",
    "tensorflow_graphdef": "TensorFlow GraphDef",
    "tensorflow_savedmodel": "TensorFlow SavedModel",
    "tensorflow": "TensorFlow",
    "caffe2_netdef": "Caffe2 NetDef",
    "openvino": "OpenVINO",
    "torch_aoti": "PyTorch AOTInductor",
    "dali": "DALI",
    "fil": "Forest Inference Library",
    "tensorrtllm": "TensorRT-LLM",
    "vllm": "vLLM",
    "armnn_tflite": "Arm NN TFLite",
    "paddle": "Paddle",
}
# Model files that identify those formats when the config names no backend.
_UNSUPPORTED_FILES = {
    "model.plan": ("tensorrt", "tensorrt_plan"),
    "model.savedmodel": ("tensorflow", "tensorflow_savedmodel"),
    "model.graphdef": ("tensorflow", "tensorflow_graphdef"),
    "model.xml": ("openvino", ""),
    "model.pt2": (PYTORCH, "torch_aoti"),
    "model.dali": ("dali", ""),
}

SUPPORTED_DESCRIPTION = (
    "tritium runs onnxruntime_onnx (model.onnx), pytorch_libtorch (TorchScript model.pt), "
    "python (model.py), ensemble, and custom Python backends")


def lowest_version_dir(model_dir: Path) -> Path | None:
    versions = numeric_subdirs(model_dir)
    return model_dir / str(min(versions)) if versions else None


def numeric_subdirs(model_dir: Path) -> list[int]:
    """Version numbers of ``model_dir``: numeric folder names without a leading zero."""
    found = []
    try:
        entries = list(model_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        name = entry.name
        if name.isdigit() and (name == "0" or not name.startswith("0")) and entry.is_dir():
            found.append(int(name))
    return sorted(found)


def python_based_backend(backend: str, backend_directory: Path | None) -> Path | None:
    """The ``model.py`` of a Python-based backend, ``<backend-directory>/<backend>/model.py`` (as
    Triton finds one: a backend written as a Python model, such as vLLM's), or None."""
    if backend_directory is None or not backend or backend in (ONNXRUNTIME, PYTORCH, PYTHON):
        return None
    candidate = backend_directory / backend / PYTHON_FILENAME
    return candidate if candidate.is_file() else None


def resolve_backend(model: str, config: ModelConfig, model_dir: Path) -> None:
    """Fill platform, backend and default_model_filename in place, as Triton does."""
    config.platform = _PLATFORM_ALIASES.get(config.platform, config.platform)
    config.backend = _BACKEND_ALIASES.get(config.backend, config.backend)
    if config.HasField("ensemble_scheduling") and not config.platform and not config.backend:
        config.platform = ENSEMBLE_PLATFORM
    if config.platform == ENSEMBLE_PLATFORM:
        return

    version_dir = lowest_version_dir(model_dir)
    content = _listing(version_dir)
    unset = not config.platform and not config.default_model_filename
    # Only look at the files when the config names nothing: Triton's rule.
    probe = unset and not config.backend

    if config.platform == ONNX_PLATFORM or config.default_model_filename == ONNX_FILENAME or (
            probe and ONNX_FILENAME in content):
        config.backend = config.backend or ONNXRUNTIME
    if config.backend == ONNXRUNTIME:
        config.platform = config.platform or ONNX_PLATFORM
        config.default_model_filename = config.default_model_filename or ONNX_FILENAME
        return

    if config.platform == TORCHSCRIPT_PLATFORM or config.default_model_filename == TORCHSCRIPT_FILENAME or (
            probe and content.get(TORCHSCRIPT_FILENAME) is False):
        config.backend = config.backend or PYTORCH
    if config.backend == PYTORCH:
        config.platform = config.platform or TORCHSCRIPT_PLATFORM
        if config.runtime != PYTHON_FILENAME and not config.default_model_filename:
            config.default_model_filename = TORCHSCRIPT_FILENAME
        return

    if config.default_model_filename == PYTHON_FILENAME or (probe and PYTHON_FILENAME in content):
        config.backend = config.backend or PYTHON
    if config.backend == PYTHON:
        config.default_model_filename = config.default_model_filename or PYTHON_FILENAME
        return

    if probe:
        for filename, (backend, platform) in _UNSUPPORTED_FILES.items():
            if filename in content:
                config.backend, config.platform = backend, platform
                config.default_model_filename = filename
                return

    if not config.backend and not config.platform and not config.default_model_filename:
        # Triton's last resort: a model named "<anything>.<backend>".
        if "." not in model:   # refused while Triton polls (its index: the name alone)
            raise ConfigRejected(
                model, f"cannot tell which backend runs model '{model}': the configuration "
                "names no 'backend' or 'platform' and the version folder holds none of "
                f"{ONNX_FILENAME}, {TORCHSCRIPT_FILENAME} or {PYTHON_FILENAME} "
                "(a custom backend needs 'backend: \"<name>\"', or a model named "
                "'<model>.<backend>')")
        backend = model.split(".", 1)[1]
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def check_supported(model: str, config: ModelConfig) -> None:
    """Refuse, by name, the platforms and backends tritium does not run."""
    for value in (config.platform, config.backend):
        if value in UNSUPPORTED:
            field = "platform" if value == config.platform else "backend"
            raise ModelLoadError(
                model, f"model '{model}' uses {field} '{value}' ({UNSUPPORTED[value]}), "
                f"which tritium does not support; {SUPPORTED_DESCRIPTION}")
    # Before the backend checks below: an ensemble with a backend is an ensemble mistake.
    if config.platform == ENSEMBLE_PLATFORM and config.backend:
        raise ModelLoadError(
            model, f"ensemble '{model}' must not set backend '{config.backend}'")
    if config.platform and not config.backend and config.platform != ENSEMBLE_PLATFORM:
        raise ModelLoadError(
            model, f"model '{model}' has unknown platform '{config.platform}'; "
            f"{SUPPORTED_DESCRIPTION}")
    expected_platform = {ONNXRUNTIME: ONNX_PLATFORM, PYTORCH: TORCHSCRIPT_PLATFORM}.get(config.backend)
    if expected_platform and config.platform != expected_platform:
        raise ModelLoadError(
            model, f"model '{model}' pairs platform '{config.platform}' with backend "
            f"'{config.backend}'; backend '{config.backend}' runs platform '{expected_platform}'")
    if config.backend == PYTHON and config.platform:
        raise ModelLoadError(
            model, f"model '{model}' pairs platform '{config.platform}' with backend 'python'; "
            "the python backend takes no platform")


def is_builtin(backend: str) -> bool:
    return backend in (ONNXRUNTIME, PYTORCH, PYTHON)


def _listing(folder: Path | None) -> dict[str, bool]:
    """Names in ``folder`` mapped to whether each is a directory."""
    if folder is None:
        return {}
    try:
        return {entry.name: entry.is_dir() for entry in folder.iterdir()}
    except OSError:
        return {}
