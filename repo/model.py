"""What loading a model from the repository produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tritium.repo.config_file import ModelConfig
from tritium.repo.json_form import config_to_json_dict


@dataclass(frozen=True)
class RepositoryOptions:
    """How configs are read; the flags of Triton's that change it."""

    model_config_name: str | None = None
    auto_complete: bool = True
    default_max_batch_size: int = 4
    python_autocomplete_timeout_s: float = 30.0
    gpus: tuple[int, ...] | None = ()  # the loading host's GPUs, for KIND_AUTO and gpu checks; None: not here
    read_torchscript: bool = False     # open TorchScript files to check them (imports torch)
    backend_directory: Path | None = None   # --backend-directory: Python-based backends' model.py complete configs


@dataclass(frozen=True)
class VersionInfo:
    """One version selected by the version policy; ``error`` is None when it can load."""

    version: int
    path: Path
    error: str | None = None


@dataclass(frozen=True)
class ModelDefinition:
    """A model read from the repository: its completed config and its versions.

    ``config`` is fully normalized for the host that loaded it (the one Triton would show);
    ``portable_config`` is the same before instance groups were resolved, which is what a
    worker host receives and resolves with its own GPUs.
    """

    name: str
    path: Path
    config: ModelConfig
    portable_config: ModelConfig
    versions: tuple[VersionInfo, ...]
    config_file: Path | None = None
    warnings: tuple[str, ...] = field(default=())
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)   # output -> its label_filename's lines
    python_based: bool = False   # served by a Python-based backend (<backend-directory>/<backend>/model.py)

    @property
    def runs_python(self) -> bool:
        """Whether a Python model serves it (Triton's Python backend, or a Python-based one)."""
        return self.python_based or self.config.backend == "python"

    @property
    def loadable_versions(self) -> tuple[int, ...]:
        return tuple(v.version for v in self.versions if v.error is None)

    def config_json(self) -> dict:
        return config_to_json_dict(self.config)
