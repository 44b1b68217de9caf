"""What a model name may be: the name of one folder in a repository, never a path.

Every API takes a model name from the client (load, unload, infer, config, statistics),
and the load API writes the files it is sent into a folder for that model. A name that
is a path (``../x``, ``/abs``, ``a/b``) or that a file system reads differently (NUL,
control characters) would reach outside that folder, so a load or unload refuses it in
the broker (whichever way it came) and the worker agent, and a file is never written
outside the load's folder.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from tritium.repo.errors import ModelLoadError
from tritium.errors import InvalidArgument

_SEPARATORS = ("/", "\\")
NOT_A_NAME = "a model name is one folder name, not a path: no '/', '\\', '..', NUL or control characters"


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a model name, or None when it can."""
    if not isinstance(name, str) or not name:
        return "a model name cannot be empty"
    if name in (".", "..") or any(s in name for s in _SEPARATORS) or _has_control(name):
        return NOT_A_NAME
    return None


def require_name(name: str, operation: str) -> None:
    """Refuse a model name that is a path for the load or unload API, before any file is touched."""
    problem = name_problem(name)
    if problem is None:
        return
    if operation == "load":  # Triton's text for a name its repository cannot find, and why
        raise InvalidArgument(f"failed to load '{name}', failed to poll from model repository: {problem}")
    raise InvalidArgument(f"failed to {operation} '{name}': {problem}")


def model_file_path(path: str) -> str:
    """A load API file path (``file:<path>``) as Triton reads it: below the model folder, a
    leading ``/`` included (``file:/1/model.py`` is ``1/model.py``)."""
    return path.lstrip("/")


def relative_file_problem(path: str) -> str | None:
    """Why a file path of the load API (``<version>/<file>``) cannot be written, or None."""
    parts = PurePosixPath(path).parts
    if (not path or path.startswith("/") or "\\" in path or _has_control(path)
            or any(part in (".", "..") for part in path.split("/"))):
        return "must be a relative path inside the model folder, without '..', '\\' or control characters"
    if len(parts) < 2 or not parts[0].isdigit():
        return "must be <version>/<file name> inside the model"
    return None


def write_files(load_dir: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write the load API's files into ``load_dir/<name>``, a folder made for this load.

    Raises ModelLoadError for a name or a file path that would leave that folder; the
    check after resolving catches what the string checks cannot (a link on the way).
    """
    problem = name_problem(name)
    if problem is not None:
        raise ModelLoadError(str(name), f"failed to load '{name}': {problem}")
    model_dir = load_dir / name
    for given, content in files.items():
        path = model_file_path(given)
        problem = relative_file_problem(path)
        target = model_dir / path
        if problem is None and not target.resolve().is_relative_to(model_dir.resolve()):
            problem = "leaves the model folder"
        if problem is not None:
            raise ModelLoadError(name, f"failed to load '{name}': file override 'file:{given}' {problem}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return model_dir


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def check_load_parameters(name: str, parameters: dict) -> None:
    """The load API's parameters: a JSON ``config`` and ``file:<path>`` contents, nothing else
    (Triton refuses any other name), checked in the order they came."""
    for key, value in parameters.items():
        if key == "config" and not isinstance(value, str):
            raise InvalidArgument(f"failed to load '{name}': the 'config' parameter must be a JSON string")
        if key.startswith("file:") and not isinstance(value, (str, bytes)):
            raise InvalidArgument(f"failed to load '{name}': '{key}' must be base64 text or bytes")
        if key != "config" and not key.startswith("file:"):
            raise InvalidArgument(f"unrecognized load parameter '{key}'.")
