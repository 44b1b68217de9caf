"""Exit codes of tritium processes, so that supervisors and systemd can tell why one ended."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    INIT_FAILED = 3          # an instance could not initialize its model: do not restart it
    MODEL_LOAD_FAILED = 4    # serve: a model failed at startup (Triton's --exit-on-error)
    PROTOCOL_MISMATCH = 5
    FORCED = 6               # a second SIGTERM/SIGINT cut the drain short
