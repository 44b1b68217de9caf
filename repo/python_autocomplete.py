"""Run a Python model's ``auto_complete_config`` in a throw-away subprocess.

User code may crash, hang or print; none of that may reach the caller. The child
gets the config as JSON on stdin, and answers one JSON object on its original
stdout (user prints are sent to stderr): ``{"config": {...}}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from repo.errors import ModelLoadError

CHILD_MODULE = "repo._autocomplete_child"


def run_auto_complete(model: str, model_file: Path, config: dict, timeout_s: float) -> dict:
    """Return the config dict as completed by the model, or raise ModelLoadError."""
    env = dict(os.environ)
    project_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [project_root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", CHILD_MODULE, str(model_file)],
            input=json.dumps(config).encode(), capture_output=True, timeout=timeout_s,
            env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelLoadError(
            model, f"auto_complete_config of model '{model}' ({model_file}) did not finish "
            f"within {timeout_s:g} s") from exc
    answer = _last_json_line(proc.stdout)
    if answer is None:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise ModelLoadError(
            model, f"auto_complete_config of model '{model}' ({model_file}) ended with exit "
            f"status {proc.returncode} and no answer" + (f": {' | '.join(tail)}" if tail else ""))
    if "error" in answer:
        raise ModelLoadError(model, f"auto_complete_config of model '{model}' failed: {answer['error']}")
    return answer["config"]


def _last_json_line(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode(errors="replace").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and ("config" in value or "error" in value):
            return value
    return None
