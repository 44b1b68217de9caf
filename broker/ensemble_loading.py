"""Loading ensembles: their composing models first, READY when those are, gone with them.

An ensemble version starts no instances. It waits, LOADING, until the model version of
every step (-1: the latest) is READY, then is READY itself; if one of them cannot
become ready, the ensemble's load fails naming the step. In explicit mode, loading an
ensemble first loads the composing models that are not loaded (Triton does), and
unloading a composing model unloads the ensembles that use it.

``EnsembleLoader`` is owned by ``ModelLifecycle``: it shares the lifecycle's loads in
progress, and applies its decisions through the lifecycle's ``LoadSteps``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, TypeGuard

from tritium.broker.registry import ModelRecord, ModelVersion, Registry, VersionState
from tritium.repo import ModelDefinition, ModelLoadError
from tritium.repo.errors import LoadFailure, LoadStage
from tritium.repo.backends import ENSEMBLE_PLATFORM
from tritium.repo.ensembles import composing_models, validate_ensemble

if TYPE_CHECKING:
    from tritium.broker.lifecycle import LoadInProgress, Reply
    from tritium.broker.model_reads import ModelRead, ModelReader

log = logging.getLogger(__name__)

_WAITING = object()


class LoadSteps(Protocol):
    """What the ensemble loader (and the repository poller) ask of the model lifecycle."""

    def begin(self, name: str, definition: ModelDefinition | None, error: str | None, fingerprint, files,
              reply: Reply | None, checked: bool = False, members_asked: bool = False,
              restoring: bool = False) -> None: ...

    def schedule_read(self, name: str, config, files, reply: Reply | None, restoring: bool = False) -> None: ...

    def version_ready(self, version: ModelVersion) -> None: ...

    def version_failed(self, version: ModelVersion, message: str) -> None: ...

    def ensemble_refused(self, version: ModelVersion, message: str) -> None: ...

    def unload_now(self, name: str, with_members: bool = False) -> None: ...


class EnsembleLoader:
    """Composing models loaded first, ensembles' readiness, and ensembles unloaded with their models."""

    def __init__(self, registry: Registry, loads: dict[str, LoadInProgress], steps: LoadSteps,
                 reader: ModelReader, poll_mode: bool) -> None:
        self.registry = registry
        self._loads = loads   # the lifecycle's loads in progress, by model name
        self._steps = steps
        self._reader = reader
        self._poll_mode = poll_mode
        self.waiting: set[ModelVersion] = set()   # ensemble versions waiting for their steps' models
        self._dependents: dict[str, list[str]] = {}   # ensembles unloaded with their models -> those models

    def note_dependent(self, name: str, members: list[str]) -> None:
        """``name`` was unloaded with its models: it loads again once all of them are loaded."""
        self._dependents[name] = members

    def forget_dependent(self, name: str) -> None:
        """``name`` is not to be loaded again when its models are (unloaded on purpose, or loading now)."""
        self._dependents.pop(name, None)

    def read_with_members(self, names: Iterable[str]) -> list[tuple[str, ModelRead]]:
        """Explicit mode's startup reads: the named models and the models of named ensembles, models first.

        Each ensemble then finds its composing models loading, and the broker does not
        report its startup done before the ensemble is READY or failed.
        """
        reads, order, visiting = {}, [], set()

        def visit(name: str) -> None:
            if name in reads or name in visiting:
                return
            visiting.add(name)
            result = self._reader.read(name, None, None)
            if is_ensemble(result[0]):
                for member in composing_models(result[0].config):
                    visit(member)
            reads[name] = result
            order.append(name)

        for name in names:
            visit(name)
        return [(name, reads[name]) for name in order]

    def load_members(self, load: LoadInProgress, definition: ModelDefinition, fingerprint, files) -> bool:
        """Load the composing models an ensemble needs that are not loaded; False if none."""
        missing = [m for m in dict.fromkeys(composing_models(definition.config))
                   if m != load.name and not self.is_loaded(m)]   # naming itself: the check says so
        if not missing:
            return False
        cycle = next((m for m in missing if self._waits_on(m, load.name)), None)
        if cycle is not None:
            self._steps.begin(load.name, None, LoadFailure.at(f"ensemble '{load.name}': ensembles form a cycle through "
                                                              f"model '{cycle}'", LoadStage.CONFIG),
                              fingerprint, files, reply=None)
            return True
        load.members = set(missing)
        log.info("ensemble %s: loading its composing model(s) %s first", load.name, ", ".join(missing))

        def loaded(member: str, _result) -> None:
            load.members.discard(member)
            if not load.members:
                self._steps.begin(load.name, definition, None, fingerprint, files, reply=None, members_asked=True)

        for member in missing:
            if member in self._loads:
                self._loads[member].replies.append(functools.partial(loaded, member))
            else:
                self._steps.schedule_read(member, None, None, functools.partial(loaded, member))
        return True

    def _waits_on(self, name: str, target: str) -> bool:
        """Whether the load of ``name`` waits, through composing models, on the load of ``target``."""
        seen, pending = set(), [name]
        while pending:
            load = self._loads.get(pending.pop())
            for member in (load.members if load else ()):
                if member == target:
                    return True
                if member not in seen:
                    seen.add(member)
                    pending.append(member)
        return False

    def is_loaded(self, name: str) -> bool:
        record = self.registry.models.get(name)
        return record is not None and not record.unloaded and record.error is None and any(
            v.state != VersionState.UNAVAILABLE for v in record.versions.values())

    def ensemble_error(self, definition: ModelDefinition) -> str | None:
        """The ensemble checked against the models loaded now (a scan checks against the repository's)."""
        configs, failures = {}, {}
        for name, record in self.registry.models.items():
            if self.is_loaded(name):
                configs[name] = max(record.versions.items())[1].definition.config
            elif record.error is not None and not record.unloaded:
                failures[name] = record.error
            elif (record.versions or record.version_errors) and not record.unloaded:
                reasons = {**record.version_errors, **{n: v.reason for n, v in record.versions.items()}}
                failures[name] = "; ".join(f"version {n}: {reason}" for n, reason in sorted(reasons.items()))
        try:
            validate_ensemble(definition.config, configs, failures)
        except ModelLoadError as exc:   # Triton drops such an ensemble before its lifecycle
            return LoadFailure.of(exc, LoadStage.CONFIG)
        return None

    def check(self) -> None:
        """Ensemble versions whose steps' models are all READY become READY; those that cannot, fail."""
        for version in list(self.waiting):
            if version not in self.waiting:
                continue  # settled by a nested call
            if version.state != VersionState.LOADING or self.registry.epochs.get(version.epoch) is not version:
                self.waiting.discard(version)
                continue
            problem = self._members_problem(version)
            if problem is _WAITING:
                continue
            self.waiting.discard(version)
            if problem is None:
                self._steps.version_ready(version)
            else:
                self._steps.ensemble_refused(version, problem)

    def _members_problem(self, version: ModelVersion):
        """None when every step's model is READY, _WAITING while one still loads, else why not."""
        waiting = False
        for index, step in enumerate(version.definition.config.ensemble_scheduling.step):
            member = self.registry.resolve_step(step.model_name, step.model_version)
            # (a member's load still in progress may yet fail, which unloads the versions it brought)
            load = self._loads.get(step.model_name)
            if member is not None and member.state == VersionState.READY and (load is None or member not in load.fresh):
                continue
            if step.model_name in self._loads or any(
                    v.name == step.model_name and v.state == VersionState.LOADING
                    and step.model_version in (-1, v.version) for v in self.registry.epochs.values()):
                waiting = True
                continue
            wanted = "" if step.model_version < 0 else f" version {step.model_version}"
            reason = _unavailable_reason(self.registry.models.get(step.model_name), step.model_version)
            return (f"step {index} (model '{step.model_name}'): model '{step.model_name}'{wanted} is not "
                    f"available{': ' + reason if reason else ''}")
        return _WAITING if waiting else None

    def follow(self, name: str) -> None:
        """After model ``name`` loaded: as Triton, an ensemble that no longer fits it is unloaded,
        and an ensemble unloaded with its models loads again once all of them are loaded."""
        for ensemble, members in list(self._dependents.items()):
            if name in members and all(self.is_loaded(m) for m in members):
                log.info("loading ensemble %s again: its models are loaded", ensemble)
                del self._dependents[ensemble]
                self._steps.schedule_read(ensemble, None, None, None, restoring=True)
        for ensemble in self.using(name):
            record = self.registry.models[ensemble]
            error = self.ensemble_error(max(record.versions.items())[1].definition)
            if error is not None:
                log.warning("unloading ensemble %s, which no longer fits model %s: %s", ensemble, name, error)
                self._dependents[ensemble] = members_of(record)
                self._steps.unload_now(ensemble)

    def waits_for_members(self, name: str, definition: ModelDefinition | None, error: str | None,
                           restoring: bool) -> bool:
        """Note an ensemble that does not fit its models now, to try it again when one of them
        loads (in poll mode, and for one unloaded with its models, as Triton does). True when it
        was unloaded with them: it then stays unloaded meanwhile (Triton's index says so too)
        rather than failed."""
        if error is None or not is_ensemble(definition) or not (restoring or self._poll_mode):
            return False
        self._dependents[name] = list(dict.fromkeys(composing_models(definition.config)))
        record = self.registry.models.get(name)
        if record is not None and record.unloaded:
            log.info("ensemble %s stays unloaded until its models fit it: %s", name, error)
            return True
        return False

    def using(self, name: str) -> list[str]:
        """The loaded ensembles with a step that uses model ``name``."""
        return [record.name for record in self.registry.models.values()
                if not record.unloaded and name in members_of(record)]


def _unavailable_reason(record: ModelRecord | None, number: int) -> str:
    if record is None or record.unloaded:
        return "it is not loaded"
    if record.error:
        return record.error
    reasons = {**record.version_errors, **{n: v.reason for n, v in record.versions.items()}}
    if number >= 0:
        reasons = {n: reason for n, reason in reasons.items() if n == number}
    return reasons[max(reasons)] if reasons else ""


def is_ensemble(definition: ModelDefinition | None) -> TypeGuard[ModelDefinition]:
    return definition is not None and definition.config.platform == ENSEMBLE_PLATFORM


def members_of(record: ModelRecord) -> list[str]:
    """The models an ensemble's steps use (none for a model that is not an ensemble)."""
    for version in record.versions.values():
        if version.ensemble:
            return list(dict.fromkeys(composing_models(version.definition.config)))
    return []
