"""tritium: a Triton-compatible inference server built around a ZeroMQ broker.

Installed, the role packages live inside this one (``tritium.gateway``, ``tritium.broker``,
``tritium.workers``, ``tritium.repo``). In a source checkout they sit beside this folder, so
the checkout's root joins the package's search path: the same imports work in both.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_ROLE_PACKAGES = ("gateway", "broker", "workers", "repo")
_here = _Path(__file__).resolve().parent
if not (_here / "gateway").is_dir() and all((_here.parent / name).is_dir() for name in _ROLE_PACKAGES):
    __path__.append(str(_here.parent))  # noqa: F821  (a package's __path__ is defined by the import system)
