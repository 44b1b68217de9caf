"""The model repository: reading Triton model folders into completed, validated configs.

The public names are imported on first use (PEP 562): the Python auto-complete child
process runs as ``repo._autocomplete_child`` and must not pay for importing protobuf,
tritonclient and grpc, which this package's modules need and the child does not.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelConfig": "tritium.repo.config_file",
    "ModelLoadError": "tritium.repo.errors",
    "LoadFailure": "tritium.repo.errors",
    "LoadStage": "tritium.repo.errors",
    "stage_of": "tritium.repo.errors",
    "ModelDefinition": "tritium.repo.model",
    "RepositoryOptions": "tritium.repo.model",
    "VersionInfo": "tritium.repo.model",
    "ModelEntry": "tritium.repo.repository",
    "ModelRepository": "tritium.repo.repository",
    "RepositoryScan": "tritium.repo.repository",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tritium.repo' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
