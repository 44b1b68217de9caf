"""Errors of the model repository: each names the model and, where there is one, the file."""

from __future__ import annotations

import enum
from pathlib import Path

from tritium.errors import InvalidArgument


class LoadStage(str, enum.Enum):
    """Where Triton meets a model's load error, which decides how the failed model shows."""

    CONFIG = "config"       # while it polls the repository (ConfigRejected): the model never enters its lifecycle
    VERSIONS = "versions"   # picking the versions to load (NoVersions): in its lifecycle without versions
    LOAD = "load"           # as a version loads


class ModelLoadError(InvalidArgument):
    """A model (or one of its versions) cannot be loaded; Triton answers a failed load with 400.
    ``stage``: where Triton meets the problem."""

    stage = LoadStage.LOAD

    def __init__(self, model: str, message: str, path: Path | None = None) -> None:
        self.model = model
        self.path = path
        self.detail = message
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}{message}")


class ConfigRejected(ModelLoadError):
    """The config cannot be read, names another model, or breaks a rule Triton checks while it
    polls the repository (before the model enters its lifecycle): such a model is listed in the
    index by name only, is unknown to requests, and does not keep the server from being ready."""

    stage = LoadStage.CONFIG


class InvalidInputsOutputs(ModelLoadError):
    """An input or output the config declares wrongly: Triton checks them as each version loads, so
    each selected version fails with it (the model is listed with them)."""


class NoVersions(ModelLoadError):
    """No version folder is there for the version policy: Triton's lifecycle then holds the model
    without versions, which keeps the server not ready and leaves it out of the index."""

    stage = LoadStage.VERSIONS


class LoadFailure(str):
    """A failed load's text, carrying its error's ``stage`` to the broker's records."""

    stage = LoadStage.LOAD

    @classmethod
    def of(cls, error: ModelLoadError, stage: LoadStage | None = None) -> LoadFailure:
        return cls.at(error.message, stage or error.stage)

    @classmethod
    def at(cls, text: str, stage: LoadStage) -> LoadFailure:
        failure = cls(text)
        failure.stage = stage
        return failure


def stage_of(error: str | None) -> LoadStage:
    """The stage a model's load error failed at (LOAD for plain texts)."""
    return getattr(error, "stage", LoadStage.LOAD)


class ModelCodeFailed(ModelLoadError):
    """The model's own code failed while its config was completed (``auto_complete_config``
    raised, hung or ended its process). Triton runs that code when it loads a version, so
    each selected version fails with this reason and the model is listed with them."""
