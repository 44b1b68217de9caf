"""Loading one model folder: parse, resolve backend, auto-complete, normalize, validate."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from google.protobuf import json_format

from tritium.repo import backends
from tritium.repo.config_file import ModelConfig, config_path, read_config
from tritium.repo.errors import ConfigRejected, InvalidInputsOutputs, ModelCodeFailed, ModelLoadError
from tritium.repo.instance_groups import resolve_instance_groups
from tritium.repo.json_form import config_to_json_dict
from tritium.repo.model import ModelDefinition, RepositoryOptions, VersionInfo
from tritium.repo.model_files import check_versions
from tritium.repo.normalize import normalize, normalize_version_policy
from tritium.repo.onnx_autocomplete import auto_complete_onnx
from tritium.repo.python_autocomplete import run_auto_complete
from tritium.repo.validate import validate_basics, validate_config
from tritium.repo.versions import select_versions

log = logging.getLogger(__name__)


def load_model(name: str, model_dir: Path, options: RepositoryOptions,
               config_override: ModelConfig | None = None) -> ModelDefinition:
    """Read ``model_dir`` as Triton would; raise ModelLoadError naming what is wrong.

    ``config_override`` replaces the folder's config.pbtxt (Triton's load API ``config``).
    """
    _check_folder(name, model_dir)
    if config_override is not None:
        config, config_file = config_override, None
    else:
        try:
            config, config_file = _read(name, model_dir, options)
        except ModelLoadError as exc:
            raise ConfigRejected(name, exc.detail, exc.path) from exc
    try:
        return _complete(name, model_dir, config, config_file, options)
    except ModelLoadError as exc:
        if exc.path is not None:
            raise
        # Say which file the problem is in (or the folder, when there is no config file).
        raise type(exc)(name, exc.detail, config_file or model_dir) from exc


def _complete(name: str, model_dir: Path, config: ModelConfig, config_file: Path | None,
              options: RepositoryOptions) -> ModelDefinition:
    if not config.name:
        config.name = name
    elif config.name != name:
        raise ConfigRejected(
            name, f"config name '{config.name}' does not match the model folder name '{name}'",
            config_file)
    backends.resolve_backend(name, config, model_dir)
    backend_file = backends.python_based_backend(config.backend, options.backend_directory)
    python_based = backend_file is not None
    if not python_based:   # (vLLM's backend, say, is a Python-based one tritium can run)
        backends.check_supported(name, config)
    elif not config.runtime:   # Triton names the file it runs such a backend from
        config.runtime = "model.py"
    normalize_version_policy(config)
    validate_basics(config)
    versions = select_versions(config, model_dir)
    if options.auto_complete:
        try:
            config = _auto_complete(name, config, versions, options, backend_file)
        except ModelCodeFailed as exc:
            return _versions_failed(name, model_dir, config, _normalized(config, options), config_file, versions,
                                    exc.detail, python_based)
    if config.backend == backends.PYTORCH and (len(config.input) == 0 or len(config.output) == 0):
        raise ModelLoadError(
            name, f"TorchScript model '{name}' must list its inputs and outputs in "
            "config.pbtxt: the pytorch backend cannot read them from model.pt", config_file)
    portable = _normalized(config, options)
    try:
        validate_config(config)
    except InvalidInputsOutputs as exc:
        if config.platform == backends.ENSEMBLE_PLATFORM:
            raise
        # Triton checks inputs and outputs as each version loads: every selected version fails with it.
        return _versions_failed(name, model_dir, config, portable, config_file, versions,
                                ModelLoadError(name, exc.detail, config_file or model_dir).message, python_based)
    versions = check_versions(config, versions, config_file, options.read_torchscript)
    return ModelDefinition(name=name, path=model_dir, config=config, portable_config=portable,
                           versions=versions, config_file=config_file, labels=_read_labels(name, model_dir, config),
                           python_based=python_based)


def _normalized(config: ModelConfig, options: RepositoryOptions) -> ModelConfig:
    """Normalize ``config`` and resolve its instance groups for this host; return the portable
    copy from between the two (what a worker host resolves with its own GPUs)."""
    normalize(config)
    portable = ModelConfig()
    portable.CopyFrom(config)
    resolve_instance_groups(config, options.gpus)
    return portable


def _versions_failed(name: str, model_dir: Path, config: ModelConfig, portable: ModelConfig,
                     config_file: Path | None, versions: tuple[VersionInfo, ...], reason: str,
                     python_based: bool) -> ModelDefinition:
    """The model as its files say, each selected version failed with ``reason`` (or its own error):
    what Triton meets as a version loads (the model's ``auto_complete_config`` failing, inputs or
    outputs it refuses) lists the versions UNAVAILABLE with the reason."""
    failed = tuple(replace(info, error=info.error or reason) for info in versions)
    return ModelDefinition(name=name, path=model_dir, config=config, portable_config=portable,
                           versions=failed, config_file=config_file, labels={}, python_based=python_based)


def _read_labels(name: str, model_dir: Path, config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """The classification labels of each output that names a label file (one label per line)."""
    labels = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir / output.label_filename
        try:
            labels[output.name] = tuple(path.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(name, f"output '{output.name}': cannot read label file "
                                 f"'{output.label_filename}': {getattr(exc, 'strerror', None) or exc}") from exc
    return labels


def _check_folder(name: str, model_dir: Path) -> None:
    if not model_dir.exists():
        raise ModelLoadError(name, "model folder does not exist", model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(name, "is a file; a model must be a folder", model_dir)
    try:
        empty = not any(model_dir.iterdir())
    except OSError as exc:
        raise ModelLoadError(name, f"model folder cannot be read: {exc.strerror or exc}",
                             model_dir) from exc
    if empty:
        raise ModelLoadError(name, "model folder is empty", model_dir)


def _read(name: str, model_dir: Path, options: RepositoryOptions) -> tuple[ModelConfig, Path | None]:
    path = config_path(model_dir, options.model_config_name)
    if path.exists() or path.is_symlink():
        return read_config(name, path), path
    if not options.auto_complete:
        raise ModelLoadError(
            name, "has no config.pbtxt, and auto-complete is disabled "
            "(--disable-auto-complete-config / --strict-model-config=true)", model_dir)
    return ModelConfig(), None


def _auto_complete(name: str, config: ModelConfig, versions: tuple[VersionInfo, ...],
                   options: RepositoryOptions, backend_file: Path | None) -> ModelConfig:
    """``backend_file``: the model.py of the Python-based backend serving the model, if one does."""
    if backend_file is not None:   # its model.py completes the configs of the backend's models
        version = next((info for info in reversed(versions) if info.error is None), None)
        if version is not None and _defines_auto_complete(backend_file):
            completed = run_auto_complete(name, backend_file, config_to_json_dict(config),
                                          options.python_autocomplete_timeout_s, version.path)
            config = _config_from_dict(name, completed)
        return config
    model_file = _latest_model_file(config, versions)
    if model_file is None:
        return config
    if config.backend == backends.ONNXRUNTIME:
        auto_complete_onnx(name, config, model_file, options.default_max_batch_size)
    elif config.backend == backends.PYTHON and _defines_auto_complete(model_file):
        completed = run_auto_complete(name, model_file, config_to_json_dict(config),
                                      options.python_autocomplete_timeout_s)
        config = _config_from_dict(name, completed)
    return config


def _latest_model_file(config: ModelConfig, versions: tuple[VersionInfo, ...]) -> Path | None:
    for info in reversed(versions):
        if info.error is None and config.default_model_filename:
            candidate = info.path / config.default_model_filename
            if candidate.exists():
                return candidate
    return None


def _defines_auto_complete(model_file: Path) -> bool:
    # Starting a Python process costs ~100 ms; only pay it for models that use the hook.
    try:
        return b"auto_complete_config" in model_file.read_bytes()
    except OSError:
        return False


def _config_from_dict(name: str, completed: dict) -> ModelConfig:
    config = ModelConfig()
    try:
        json_format.ParseDict(completed, config, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ModelLoadError(
            name, f"auto_complete_config of model '{name}' returned an invalid configuration: "
            f"{exc}") from exc
    return config
