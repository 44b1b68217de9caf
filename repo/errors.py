"""Errors of the model repository: each names the model and, where there is one, the file."""

from __future__ import annotations

from pathlib import Path

from tritium.errors import InvalidArgument


class ModelLoadError(InvalidArgument):
    """A model (or one of its versions) cannot be loaded; Triton answers a failed load with 400."""

    def __init__(self, model: str, message: str, path: Path | None = None) -> None:
        self.model = model
        self.path = path
        self.detail = message
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}{message}")


class ModelCodeFailed(ModelLoadError):
    """The model's own code failed while its config was completed (``auto_complete_config``
    raised, hung or ended its process). Triton runs that code when it loads a version, so
    each selected version fails with this reason and the model is listed with them."""
