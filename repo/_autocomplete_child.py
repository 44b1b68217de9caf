"""Child process of ``repo.python_autocomplete``: imports model.py and calls auto_complete_config."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from tritium.pb_utils.model_file import NotAPythonFile, import_model_file
from tritium.pb_utils.python_errors import with_model_frames


def main() -> None:
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # whatever the user's code prints goes to stderr, not into the answer
    sys.stdout = sys.stderr
    try:
        model_file, version_dir = Path(sys.argv[1]), sys.argv[2]
        sys.argv = [""]   # what Triton's stub gives model code, not this process's arguments
        answer: dict[str, object] = {"config": _complete(model_file, version_dir, json.loads(sys.stdin.read()))}
    except BaseException as exc:  # report any failure of user code as the answer (sys.exit() too)
        # As Triton's stub reports it: its status's "Internal: ", the exception, the model's frames
        # (a file name it refuses: its words alone).
        reported = str(exc) if isinstance(exc, NotAPythonFile) else with_model_frames(exc, (__file__,))
        answer = {"error": f"Internal: {reported}", "traceback": traceback.format_exc()}
    os.write(answer_fd, (json.dumps(answer) + "\n").encode())


def _complete(model_file: Path, model_version_dir: str, config: dict) -> dict:
    from tritium.pb_utils import MODULE_DIR
    from tritium.pb_utils.types import runtime

    version_dir = model_file.parent
    model_dir = version_dir.parent
    python_based = Path(model_version_dir) != version_dir   # a Python-based backend's model.py
    sys.path[:0] = [MODULE_DIR]
    sys.path.extend([str(version_dir)] if python_based else [str(version_dir), str(model_dir)])
    runtime.model_dir = model_version_dir
    import triton_python_backend_utils as pb_utils

    module = import_model_file(model_file, python_based)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise AttributeError(f"{model_file} defines no class TritonPythonModel")
    auto_complete = getattr(model_class, "auto_complete_config", None)
    if auto_complete is None:
        return config
    result = auto_complete(pb_utils.ModelConfig(config))
    if not isinstance(result, pb_utils.ModelConfig):
        raise TypeError(
            "auto_complete_config must return the pb_utils.ModelConfig it was given, "
            f"got {type(result).__name__}")
    return result.as_dict()


if __name__ == "__main__":
    main()
