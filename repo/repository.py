"""The model repository: one or more folders of model folders, scanned and loaded per model.

One broken model never hides another: every model gets its own entry, with either a
definition or the error that stopped it. ``fingerprint`` is the cheap change detector
that a polling mode compares between scans.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tritium.repo.backends import ENSEMBLE_PLATFORM, numeric_subdirs
from tritium.repo.ensembles import composing_models, validate_ensemble
from tritium.repo.errors import ConfigRejected, LoadFailure, LoadStage, ModelLoadError
from tritium.repo.loader import load_model
from tritium.repo.model import ModelDefinition, RepositoryOptions
from tritium.repo.names import name_problem
from tritium.repo.cloud_mirror import CloudMirror, StorageError, bucket_for, is_cloud

log = logging.getLogger(__name__)
# Importing a model.py (auto-complete, Python instances) may write this; it is no edit.
_BYTECODE_CACHE = "__pycache__"


@dataclass(frozen=True)
class ModelEntry:
    """The outcome of loading one model name: a definition, or the error that stopped it (an
    ensemble its models cannot serve keeps its definition too: it is tried again when they load)."""

    name: str
    paths: tuple[Path, ...]
    definition: ModelDefinition | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.definition is not None and self.error is None


@dataclass(frozen=True)
class RepositoryScan:
    models: dict[str, ModelEntry]
    errors: tuple[str, ...]  # problems with a repository folder itself


class ModelRepository:
    def __init__(self, roots: Sequence[str | Path], options: RepositoryOptions | None = None) -> None:
        """``roots``: folders, or bucket locations (``s3://``, ``gs://``, ``as://``), each read through a local mirror
        that ``fetch`` brings in step with its bucket."""
        self.locations = tuple(str(r) for r in roots)
        self._mirrors = {location: CloudMirror(bucket_for(location)) for location in self.locations
                         if is_cloud(location)}
        self.roots = tuple(self._mirrors[loc].root if loc in self._mirrors else Path(loc) for loc in self.locations)
        self.options = options or RepositoryOptions()
        self._fetch_errors: dict[str, str] = {}   # bucket location -> why its last full fetch failed
        self._model_failures: dict[str, str] = {}   # model -> why some of its objects were not fetched
        self._fetch_lock = threading.Lock()   # fetches run on the reader's threads; discover in the loop

    @property
    def remote(self) -> bool:
        """Whether some of the repositories are in buckets (read after a ``fetch``)."""
        return bool(self._mirrors)

    def stop_fetching(self) -> None:
        """The process is stopping: fetches under way end soon (at the next object, or the next
        chunk of one), and later ones at once."""
        for mirror in self._mirrors.values():
            mirror.stop()

    @property
    def mirrors(self) -> dict[str, CloudMirror]:
        """Bucket location -> its mirror on this host."""
        return dict(self._mirrors)

    def fetch(self, model: str | None = None, names_only: bool = False) -> str | None:
        """Bring the bucket repositories' mirrors in step with their buckets (only ``model``'s
        folder when named); blocks on the network; never raises. Why the repository (or the
        model) could not be fetched, or None. A repository whose last full fetch failed is
        reported by ``discover``; a model some of whose objects failed does not load until a
        fetch brings them. ``names_only``: only the model folders' names (each model's files
        come with its own fetch)."""
        if model is not None and name_problem(model) is not None:
            return None   # no folder to fetch: the load says what is wrong with the name
        failure, failed = None, {}
        read = []   # the roots of the mirrors fetched
        for location, mirror in self._mirrors.items():
            try:
                if names_only:
                    mirror.sync_names()
                else:
                    failed.update(mirror.sync(model))
                read.append(mirror.root)
                why = None
            except StorageError as exc:
                why = str(exc)
            except Exception as exc:  # a bug of ours: one more failure to report, not an escape
                log.exception("fetching %s failed", location)
                why = repr(exc)
            if why is not None:
                failure = failure or f"model repository '{location}' cannot be read: {why}"
            if model is None:
                with self._fetch_lock:
                    if why is None:
                        self._fetch_errors.pop(location, None)
                    else:
                        self._fetch_errors[location] = why
        if model is not None and failure is not None and (
                self.in_a_folder(model) or any((root / model).is_dir() for root in read)):
            failure = None   # a bucket that cannot be read says nothing of a model found elsewhere
        with self._fetch_lock:
            if model is None:
                self._model_failures = dict(failed)
            else:
                self._model_failures.pop(model, None)
                self._model_failures.update(failed if failure is None else {model: failure})
        if model is not None:
            return failure or failed.get(model)
        return failure

    def in_a_folder(self, model: str) -> bool:
        """Whether the model is in one of the folder repositories (not in a bucket)."""
        return any((root / model).is_dir() for location, root in zip(self.locations, self.roots)
                   if location not in self._mirrors)

    def model_failure(self, name: str) -> str | None:
        """Why the model's objects could not all be fetched the last time, or None."""
        return self._model_failures.get(name)

    def discover(self) -> tuple[dict[str, tuple[Path, ...]], tuple[str, ...]]:
        """Model names mapped to the folders that hold them, and errors about the roots."""
        found: dict[str, list[Path]] = {}
        with self._fetch_lock:
            fetch_errors = dict(self._fetch_errors)
        errors = [f"model repository '{location}' cannot be read: {why}" for location, why in fetch_errors.items()]
        for location, root in zip(self.locations, self.roots):
            shown = location if location in self._mirrors else root
            if not root.exists():
                if location not in fetch_errors:
                    errors.append(f"model repository '{shown}' does not exist")
                continue
            if not root.is_dir():
                errors.append(f"model repository '{shown}' is not a folder")
                continue
            try:
                entries = sorted(root.iterdir())
            except OSError as exc:
                errors.append(f"model repository '{shown}' cannot be read: {exc.strerror or exc}")
                continue
            for entry in entries:
                if entry.name.startswith(".") or _plain_file(entry):   # a file beside the models is none (as in Triton)
                    continue
                found.setdefault(entry.name, []).append(entry)
        return {name: tuple(paths) for name, paths in found.items()}, tuple(errors)

    def load(self, name: str, config_override=None, model_dir: Path | None = None) -> ModelDefinition:
        """Load one model by name (raises ModelLoadError); ensembles are checked on their own.

        ``model_dir`` loads from another folder than the repository's (Triton's load API
        with ``file:`` overrides); ``config_override`` replaces its config.pbtxt.
        """
        if model_dir is None:
            paths = self.discover()[0].get(name)
            if not paths:
                raise ModelLoadError(name, f"model '{name}' is not in the model repository")
            if len(paths) > 1:
                raise ConfigRejected(name, _duplicate_message(name, paths))
            model_dir = paths[0]
            self._check_fetched(name)
        return load_model(name, model_dir, self.options, config_override)

    def _check_fetched(self, name: str) -> None:
        failure = self.model_failure(name)
        if failure is not None:
            raise ModelLoadError(name, f"failed to load '{name}': {failure}")

    def load_all(self) -> RepositoryScan:
        found, errors = self.discover()
        entries: dict[str, ModelEntry] = {}
        for name, paths in found.items():
            entries[name] = self._load_entry(name, paths)
        return RepositoryScan(self._check_ensembles(entries), errors)

    def _load_entry(self, name: str, paths: tuple[Path, ...]) -> ModelEntry:
        if len(paths) > 1:   # as Triton's poll: not unique, so never loaded (repository index: DUPLICATE_REASON)
            return ModelEntry(name, paths, error=LoadFailure.at(_duplicate_message(name, paths), LoadStage.CONFIG))
        try:
            self._check_fetched(name)
            return ModelEntry(name, paths, definition=load_model(name, paths[0], self.options))
        except ModelLoadError as exc:
            log.debug("model %s failed to load: %s", name, exc.message)
            return ModelEntry(name, paths, error=LoadFailure.of(exc))
        except Exception as exc:  # a bug of ours must still not hide the other models
            log.exception("unexpected failure loading model %s", name)
            return ModelEntry(name, paths, error=f"internal error loading model '{name}': {exc!r}")

    @staticmethod
    def _check_ensembles(entries: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        # Ensembles depend on each other; re-check until no new failure appears.
        changed = True
        while changed:
            changed = False
            failures = {n: why for n, e in entries.items() if (why := _failure(e)) is not None}
            configs = {n: e.definition.config for n, e in entries.items()
                       if n not in failures and e.definition is not None}   # (always, for one not failing)
            for name, entry in list(entries.items()):
                definition = entry.definition
                if not entry.ok or definition is None or definition.config.platform != ENSEMBLE_PLATFORM:
                    continue
                try:
                    validate_ensemble(definition.config, configs, failures)
                except ModelLoadError as exc:   # Triton drops such an ensemble before its lifecycle
                    # Kept with its definition when a model it uses is missing or failed: it is tried
                    # again once that model loads (poll mode), as Triton's dependency graph does.
                    lacking = any(member in failures or member not in configs
                                  for member in composing_models(definition.config))
                    entries[name] = ModelEntry(name, entry.paths, definition if lacking else None,
                                               error=LoadFailure.of(exc, LoadStage.CONFIG))
                    changed = True
        return entries

    def fingerprint(self, name: str) -> tuple:
        """A cheap summary of a model's files: it changes when config or versions change."""
        paths = self.discover()[0].get(name, ())
        return tuple(_folder_fingerprint(p) for p in paths)


def _failure(entry: ModelEntry) -> str | None:
    """Why an ensemble cannot use the model: its error, or every version's when all failed
    (its code failed as it loaded, or no version's files fit the config)."""
    if not entry.ok or entry.definition is None:
        return entry.error
    versions = entry.definition.versions
    if versions and all(info.error for info in versions):
        return "; ".join(f"version {info.version}: {info.error}" for info in versions)
    return None


# What Triton's repository index says of a model folder found in several repositories.
DUPLICATE_REASON = "model appears in two or more repositories"


def _duplicate_message(name: str, paths: Sequence[Path]) -> str:
    where = ", ".join(str(p) for p in paths)
    return f"model '{name}' appears in more than one model repository ({where})"


def _folder_fingerprint(model_dir: Path) -> tuple:
    """(path, mtime_ns, size) of every file in the folder, at any depth, as Triton's poll watches.

    A file replaced in place (an editor's save, an ``os.replace``) changes its mtime, so
    it is noticed even when its size stays the same. Folders count by name only: a
    Python model's ``__pycache__`` appearing changes its folder's mtime, and is no edit.
    """
    return (str(model_dir), tuple(sorted(_files(model_dir))))


def version_fingerprint(model_dir: Path, version: int) -> tuple:
    """What a version's instances read besides the config: its own folder, and the model
    folder's other files (labels, shared data), but not the other versions' folders."""
    others = {str(v) for v in numeric_subdirs(model_dir)} - {str(version)}
    return tuple(sorted(item for item in _files(model_dir)
                        if item[0].split("/", 1)[0] not in others))


def _files(folder: Path, prefix: str = "") -> list[tuple]:
    items = []
    for entry in _scan(str(folder)):
        if entry.name == _BYTECODE_CACHE:
            continue
        relative = f"{prefix}{entry.name}"
        try:
            is_folder = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_folder = False
        if is_folder:
            items.append((relative, "dir"))
            items.extend(_files(Path(entry.path), relative + "/"))
        else:
            items.append((relative,) + _stat(entry))
    return items


def _scan(path: str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []


def _stat(entry: os.DirEntry) -> tuple:
    try:
        st = entry.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _plain_file(entry: Path) -> bool:
    """A file that is not a model folder (a link that leads nowhere, or that cannot be looked
    at, stays an entry: its load says what is wrong)."""
    try:
        return entry.exists() and not entry.is_dir()
    except OSError:
        return False
