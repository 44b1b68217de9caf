"""Command-line flags that are refused before any process starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tritium.cli import main


@pytest.mark.parametrize("flags, message", [
    (["--load-model", "a"], "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "a"],
     "'--load-model=*' can not be used with other '--load-model' arguments."),
    (["--model-control-mode", "sometimes"], "'sometimes' is not one of 'none', 'poll', 'explicit'"),
    (["--model-control-mode", "poll", "--repository-poll-secs", "0"], "must be positive"),
])
def test_model_control_flags_are_checked(tmp_path, flags, message):
    for command in ("serve", "broker"):
        extra = ["--frontend", "ipc:///nowhere/f", "--backend", "ipc:///nowhere/b"] if command == "broker" else []
        result = CliRunner().invoke(main, [command, "--model-repository", str(tmp_path), *extra, *flags])
        assert result.exit_code == 2, result.output
        assert message in result.output
