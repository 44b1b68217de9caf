"""Static checks that run with the tests, so that CI runs them from the README's command."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import PROJECT_ROOT


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
