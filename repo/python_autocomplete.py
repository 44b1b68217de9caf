"""Run a Python model's ``auto_complete_config`` in a throw-away subprocess.

User code may crash, hang or print; none of that may reach the caller. The child
gets the config as JSON on stdin, and answers one JSON object on its original
stdout (user prints are sent to stderr): ``{"config": {...}}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tritium.lifetime import own_process_group
from tritium.repo.errors import ModelCodeFailed

CHILD_MODULE = "tritium.repo._autocomplete_child"


def run_auto_complete(model: str, model_file: Path, config: dict, timeout_s: float,
                      version_dir: Path | None = None) -> dict:
    """Return the config dict as completed by the model, or raise ModelCodeFailed. ``version_dir``:
    what ``pb_utils.get_model_dir()`` gives (the model file's folder unless a Python-based
    backend's ``model.py`` completes a model of its own)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", CHILD_MODULE, str(model_file), str(version_dir or model_file.parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(),
        # Its own process group, so that a timeout also ends what user code started; in the
        # broker's session, so that a stopped one whose broker is killed is continued (orphaned).
        **own_process_group())
    try:
        stdout, stderr = proc.communicate(json.dumps(config).encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise ModelCodeFailed(
            model, f"auto_complete_config of model '{model}' ({model_file}) did not finish "
            f"within {timeout_s:g} s") from exc
    answer = _last_json_line(stdout)
    if answer is None:
        tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise ModelCodeFailed(
            model, f"auto_complete_config of model '{model}' ({model_file}) ended with exit "
            f"status {proc.returncode} and no answer" + (f": {' | '.join(tail)}" if tail else ""))
    if "error" in answer:
        raise ModelCodeFailed(model, answer["error"])
    return answer["config"]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    project_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [project_root, env.get("PYTHONPATH")]))
    # Importing <version>/model.py must not write __pycache__ into the version folder:
    # that would change the model's fingerprint and look like an edit to a poller.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
    proc.wait()
    # Not communicate(): a grandchild that left the group could keep the pipes open.
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _last_json_line(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode(errors="replace").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and ("config" in value or "error" in value):
            return value
    return None
