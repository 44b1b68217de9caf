"""Version folders and the version policy that picks which of them load."""

from __future__ import annotations

from pathlib import Path

from tritium.repo.backends import ENSEMBLE_PLATFORM, is_builtin, numeric_subdirs
from tritium.repo.config_file import ModelConfig
from tritium.repo.errors import NoVersions
from tritium.repo.model import VersionInfo


def select_versions(config: ModelConfig, model_dir: Path) -> tuple[VersionInfo, ...]:
    """The versions the policy selects, each with an error if its model file is missing."""
    model = config.name
    available = numeric_subdirs(model_dir)
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    missing: list[int] = []
    if choice == "all":
        chosen = available
    elif choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        chosen = [v for v in wanted if v in available]
        missing = [v for v in wanted if v not in available]
    else:
        count = policy.latest.num_versions  # validated >= 1 before; never slice by 0
        chosen = available[-count:] if count > 0 else []
    if not chosen:
        # Triton fails the whole model here; versions listed but absent are only logged.
        absent = f"; version folders listed but absent: {missing}" if missing else ""
        raise NoVersions(
            model, f"model '{model}' has no version folder that its version policy selects "
            f"(numeric folders found: {available or 'none'}{absent}); at least one version "
            "must be available under the version policy", model_dir)
    infos = [VersionInfo(v, model_dir / str(v), _version_error(config, model_dir / str(v)))
             for v in chosen]
    infos += [VersionInfo(v, model_dir / str(v),
                          f"version {v} of model '{model}' is listed by the version policy but "
                          f"folder {model_dir / str(v)} does not exist") for v in missing]
    return tuple(sorted(infos, key=lambda info: info.version))


def _version_error(config: ModelConfig, version_dir: Path) -> str | None:
    if config.platform == ENSEMBLE_PLATFORM:
        return None
    filename = config.default_model_filename
    if not filename or not is_builtin(config.backend):
        return None  # a custom backend knows its own files
    if not (version_dir / filename).exists():
        return (f"version {version_dir.name} of model '{config.name}' has no {filename} in "
                f"{version_dir}")
    return None
