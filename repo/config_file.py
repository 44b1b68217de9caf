"""Finding and parsing a model's ``config.pbtxt`` (protobuf text format, via protobuf itself)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

from google.protobuf import text_format
from tritium.model_config_proto import model_config_pb2

from tritium.repo.errors import ModelLoadError

ModelConfig: TypeAlias = model_config_pb2.ModelConfig

CONFIG_FILENAME = "config.pbtxt"
CUSTOM_CONFIG_FOLDER = "configs"
# Real configs are a few KiB; a file this large is a mistake, not a config.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def config_path(model_dir: Path, model_config_name: str | None) -> Path:
    """The file Triton would read: ``configs/<name>.pbtxt`` when asked for and present."""
    if model_config_name:
        custom = model_dir / CUSTOM_CONFIG_FOLDER / f"{model_config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILENAME


def read_config(model: str, path: Path) -> ModelConfig:
    """Parse one config file; every failure names the file (and line:column for syntax)."""
    if path.is_dir():
        raise ModelLoadError(model, "is a directory, expected a protobuf text file", path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ModelLoadError(
                model, f"is {size} bytes, more than the {MAX_CONFIG_BYTES} bytes a model "
                "configuration may have", path)
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(model, f"cannot be read: {exc.strerror or exc}", path) from exc
    if b"\x00" in raw:
        raise ModelLoadError(model, "is a binary file, expected protobuf text format", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelLoadError(
            model, f"is not UTF-8 text (byte {exc.start}), expected protobuf text format",
            path) from exc
    return parse_config_text(model, text, path)


def parse_config_text(model: str, text: str, path: Path | None = None) -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        message = str(exc)
        prefix = f"{line}:{column} : "
        if message.startswith(prefix):
            message = message[len(prefix):]
        # Some protobuf errors carry no position; say the file alone then, not "None:None".
        position = f":{line}:{column}" if line is not None else ""
        location = f"{path}{position}" if path is not None else (position[1:] or "config")
        raise ModelLoadError(model, f"{location}: {message}") from exc
    return config
