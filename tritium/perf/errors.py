"""Why a perf run stopped: one line for the user and the exit code that goes with it."""

from __future__ import annotations

# Exit codes of ``tritium perf`` and ``tritium analyze``.
GENERIC = 1
USAGE = 2          # as click's own answer to a bad command line
UNREACHABLE = 3
UNKNOWN_MODEL = 4
REJECTED = 5
UNSTABLE = 6


class PerfError(Exception):
    """A failure the user can act on; the command prints ``message`` alone and exits ``exit_code``."""

    def __init__(self, message: str, exit_code: int = GENERIC) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ServerUnreachable(PerfError):
    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"cannot reach the server at {url}: {why}", UNREACHABLE)


class UnknownModel(PerfError):
    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"model '{model}' is not available: {why}", UNKNOWN_MODEL)


class RequestsRejected(PerfError):
    def __init__(self, level: str, failed: int, why: str) -> None:
        super().__init__(f"{level}: {failed} request(s) failed; the server said: {why}", REJECTED)


class Unstable(PerfError):
    def __init__(self, level: str, windows: int) -> None:
        super().__init__(f"{level}: no stable measurement within {windows} windows; raise "
                         f"--measurement-interval or --max-trials, or loosen --stability-percentage",
                         UNSTABLE)
