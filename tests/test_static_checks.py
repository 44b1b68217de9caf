"""Static checks that run with the tests, so that CI runs them from the README's command."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import PROJECT_ROOT


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# What mypy checks (the modules these import are followed, not checked), in the package layout
# that `pip install .` gives them.
MYPY_TARGETS = ("tritium/*.py", "tritium/analyze/*.py", "tritium/perf/*.py", "tritium/client/*.py",
                "tritium/pb_utils/*.py", "tritium/pb_utils/triton_names/*.py", "tritium/gateway/*.py", "tritium/protocol/*.py", "tritium/broker/*.py",
                "tritium/tracing/*.py", "tritium/workers/*.py", "tritium/workers/backends/*.py", "tritium/repo/*.py")
ROLE_FOLDERS = ("gateway", "broker", "workers", "repo")


def _installed_layout(root) -> None:
    """tritium/ with the role folders inside it, as links to the checkout's files."""
    package = root / "tritium"
    package.mkdir()
    for entry in (PROJECT_ROOT / "tritium").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in ROLE_FOLDERS:
        (package / folder).symlink_to(PROJECT_ROOT / folder)


def test_mypy_finds_nothing(tmp_path):
    _installed_layout(tmp_path)
    targets = sorted(str(path.relative_to(tmp_path)) for pattern in MYPY_TARGETS for path in tmp_path.glob(pattern))
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PROJECT_ROOT / "pyproject.toml"),
                             "--cache-dir", str(PROJECT_ROOT / ".mypy_cache"), *targets],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
