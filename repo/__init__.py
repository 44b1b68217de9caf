"""The model repository: reading Triton model folders into completed, validated configs."""

from repo.config_file import ModelConfig
from repo.errors import ModelLoadError
from repo.model import ModelDefinition, RepositoryOptions, VersionInfo
from repo.repository import ModelEntry, ModelRepository, RepositoryScan

__all__ = [
    "ModelConfig", "ModelDefinition", "ModelEntry", "ModelLoadError", "ModelRepository",
    "RepositoryOptions", "RepositoryScan", "VersionInfo",
]
