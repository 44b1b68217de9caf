"""Logging for every tritium process: one line per event, with the process role and pid."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s.%(msecs)03d %(levelname).1s {role}[%(process)d] %(name)s: %(message)s"


def configure(role: str, verbose: int = 0) -> None:
    """Send logs to stderr, tagged with ``role``; ``verbose`` > 0 turns on debug lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT.format(role=role), datefmt="%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
