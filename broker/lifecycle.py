"""Model lifecycle: loading, reloading without dropping a request, unloading; owns the registry's models, versions, epochs.

Every load of a model version is a ``ModelVersion`` with an epoch of its own. A first
load takes the version's place in the registry at once, LOADING. A reload (new files, a
new config) starts the new epoch's instances beside the old ones; only when all of them
are ready does the new epoch take the version's place, and the old one drains: it gets
no new request, finishes what it queued and runs, and its instances are stopped. A
reload that fails leaves the old epoch serving and records the error.

Reading model folders is ``ModelReader``'s (broker/model_reads.py), off the loop; ensembles'
part of loading is ``EnsembleLoader``'s (broker/ensemble_loading.py); poll mode is
``RepositoryPoller``'s (broker/polling.py). This module alone writes the registry's models,
versions and epochs; instances leave, and the generation moves, through ``Membership``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Set as AbstractSet
from dataclasses import dataclass, field

from tritium.broker.ensemble_loading import EnsembleLoader, is_ensemble, members_of
from tritium.broker.instance_updates import InstanceUpdates
from tritium.broker.membership import Membership
from tritium.broker.model_reads import MissingModel, ModelReader, overrides_from
from tritium.broker.polling import RepositoryPoller
from tritium.broker.registry import (
    AgentRecord,
    ModelRecord,
    ModelVersion,
    Registry,
    VersionState,
    load_identity,
)
from tritium.repo import LoadStage, ModelDefinition, ModelRepository, stage_of
from tritium.repo.errors import LoadFailure
from tritium.repo.json_form import config_to_json_dict
from tritium.repo.names import require_name
from tritium.repo.repository import DUPLICATE_REASON, version_fingerprint
from tritium.errors import InvalidArgument, TritiumError, Unavailable
from tritium.protocol import UNLOADED, Assign, LoadRef, Placed, Unassign

log = logging.getLogger(__name__)

Reply = Callable[[object], None]   # called once with the result, or with a TritiumError

POLLING_ENABLED = "explicit model load / unload is not allowed if polling is enabled"


@dataclass(frozen=True)
class ControlSettings:
    mode: str = "none"                       # none | poll | explicit
    load_models: tuple[str, ...] = ()        # explicit mode: loaded at startup ("*": all)
    poll_seconds: float = 15.0
    load_threads: int = 4
    load_retries: int = 0                    # Triton's --model-load-retry-count: a failed load is tried again


@dataclass(eq=False)
class LoadInProgress:
    name: str
    waiting: set[int] = field(default_factory=set)   # epochs not yet READY or failed
    errors: list[str] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    retiring: list[ModelVersion] = field(default_factory=list)  # versions the policy no longer selects
    members: set[str] = field(default_factory=set)   # an ensemble's composing models it waits to see loaded
    override: tuple | None = None   # the load API's (config, files) this load applies, if any
    publish: ModelDefinition | None = None   # the config gateways get once a version of this load is READY
    fresh: list[ModelVersion] = field(default_factory=list)   # versions it loads where none served
    first: bool = True   # the model was neither loaded nor unloaded before this load (its record is new)


class ModelLifecycle:
    def __init__(self, registry: Registry, repository: ModelRepository, scheduler, send_backend,
                 settings: ControlSettings, membership: Membership,
                 new_version_hook: Callable[[ModelVersion], None] = lambda v: None, autoscaler=None) -> None:
        self.autoscaler = autoscaler   # places the instances of tritium.autoscale models
        self.registry = registry
        self.membership = membership   # instances leave, and the generation moves, through it
        self.repository = repository
        self.scheduler = scheduler
        self._send_backend = send_backend
        self.settings = settings
        self._new_version_hook = new_version_hook
        self._epochs = itertools.count(1)
        self._loads: dict[str, LoadInProgress] = {}
        self._queued: dict[str, list[Callable[[], None]]] = {}   # loads/unloads asked for during a load
        self.draining: set[ModelVersion] = set()
        self.instance_updates = InstanceUpdates(registry, scheduler, send_backend, self._instances_updated)
        self.reader = ModelReader(repository, settings.load_threads)
        self.ensembles = EnsembleLoader(registry, self._loads, self, self.reader, settings.mode == "poll")
        self.poller = RepositoryPoller(registry, repository, self._loads, self, self.reader, self.ensembles,
                                       settings.poll_seconds, settings.mode == "poll")
        self.repository_errors: tuple[str, ...] = ()
        self._version_files: dict[int, tuple] = {}   # epoch -> the files its version was loaded from
        self._files_before_update: dict[int, tuple] = {}   # epoch -> its files, while its instance groups change

    # -- startup ------------------------------------------------------------------------

    def start(self) -> None:
        """Load what the control mode loads at startup, in the caller's thread. A model repository
        that cannot be read fails the server's start, as in Triton: with --exit-on-error=false it
        then serves, neither live nor ready (the gateways answer model calls 'Server not ready')."""
        # A bucket repository's copy, before anything reads it (discover reports a failure). Explicit
        # mode loads few models of what may be a large bucket: the names for the index, and each
        # load fetches its model's files.
        self.repository.fetch(names_only=self.settings.mode == "explicit")
        unreadable = self.repository.discover()[1]
        self.registry.startup_failure = unreadable[0] if unreadable else None
        if self.settings.mode == "explicit":
            for error in unreadable:   # (the other modes log them with the scan's errors)
                log.error("%s", error)
            names = self.settings.load_models
            if "*" in names:
                names = tuple(self.repository.discover()[0])
            for name, result in self.ensembles.read_with_members(names):  # composing models first
                self.begin(name, *result, reply=None, members_asked=True)
            return
        scan = self.repository.load_all()
        self.repository_errors = scan.errors
        for error in scan.errors:
            log.error("%s", error)
        for name, entry in sorted(scan.models.items()):  # the scan checked ensembles against their models
            self.begin(name, entry.definition, entry.error, self.reader.fingerprint(name), None, reply=None,
                        checked=True)

    def close(self) -> None:
        self.reader.close()

    @property
    def loading(self) -> bool:
        """Whether a load is in progress (the startup load, until every version is READY or failed)."""
        return bool(self._loads)

    # -- the load, unload and index API ---------------------------------------------------

    def load(self, name: str, parameters: dict, reply: Reply) -> None:
        """Triton's synchronous load: ``reply`` is called when every version is READY or failed."""
        if self.settings.mode != "explicit":
            reply(Unavailable(POLLING_ENABLED))
            return
        try:
            require_name(name, "load")
            config, files = overrides_from(name, parameters)
        except TritiumError as exc:
            reply(exc)
            return
        record = self.registry.models.get(name)
        if config is None and not files and record is not None and record.override is not None \
                and not record.unloaded and (not self.repository.remote or self.repository.in_a_folder(name)) \
                and record.fingerprint == self.reader.fingerprint(name):
            # As Triton: nothing changed on disk, so the override stays. (A bucket repository's copy
            # is fetched by the load itself: it would say nothing changed before the fetch.)
            config, files = record.override
        self.schedule_read(name, config, files, reply)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Triton's asynchronous unload: in-flight requests finish, new ones find no model.

        ``unload_dependents`` also unloads an ensemble's composing models (all the way
        down) that no other loaded ensemble uses.
        """
        if self.settings.mode != "explicit":
            raise Unavailable(POLLING_ENABLED)
        require_name(name, "unload")
        self.ensembles.forget_dependent(name)   # unloaded on purpose: loading its models does not bring it back
        if name in self._loads:  # after the load in progress, as Triton orders them
            self._queued.setdefault(name, []).append(lambda: self._unload_asked(name, unload_dependents))
            return
        self._unload_asked(name, unload_dependents)

    def _unload_asked(self, name: str, unload_dependents: bool) -> None:
        record = self.registry.models.get(name)
        if record is not None and not unload_dependents and not any(
                v.state in (VersionState.READY, VersionState.LOADING) for v in record.versions.values()):
            # Nothing of it is loaded (its load failed): as in Triton, unloading it changes nothing,
            # and its failure keeps the server not ready until a load succeeds.
            return
        self.unload_now(name, unload_dependents)

    def index(self, ready_only: bool) -> list[dict]:
        # The repository's model folders, as Triton lists them: a model whose folder went away leaves
        # the index (while it still serves, in explicit mode), and a model loaded only from the load
        # API's files is not in it.
        folders = self.repository.discover()[0]
        entries = []
        for name in sorted(folders):
            if len(folders[name]) > 1:   # never loaded, whatever was loaded of it before (Triton's)
                entries.append({"name": name, "state": VersionState.UNAVAILABLE.value, "reason": DUPLICATE_REASON})
                continue
            record = self.registry.models.get(name)
            if record is None:
                if not ready_only:
                    entries.append({"name": name})
                continue
            entries.extend(_index_entries(record))
        if ready_only:
            entries = [e for e in entries if e.get("state") == VersionState.READY.value]
        return entries

    def schedule_read(self, name: str, config, files, reply: Reply | None, restoring: bool = False) -> None:
        if name in self._loads:  # one load of a model at a time, in the order asked
            self._queued.setdefault(name, []).append(
                lambda: self.schedule_read(name, config, files, reply, restoring))
            return
        self._loads[name] = LoadInProgress(name, replies=[reply] if reply else [],
                                           override=(config, files) if config is not None or files else None)
        self.reader.read_later(name, config, files,
                               lambda result: self.begin(name, *result, reply=None, restoring=restoring))

    # -- applying a load ------------------------------------------------------------------

    def begin(self, name: str, definition: ModelDefinition | None, error: str | None, fingerprint,
               files, reply: Reply | None, checked: bool = False, members_asked: bool = False,
               restoring: bool = False) -> None:
        """Apply a read model folder; ``restoring``: an ensemble unloaded with its models, tried again."""
        load = self._loads.setdefault(name, LoadInProgress(name))
        if reply is not None:
            load.replies.append(reply)
        if not restoring:
            self.ensembles.forget_dependent(name)
        if error is None and is_ensemble(definition) and not checked:
            # An ensemble's models load first, as in Triton (explicit mode loads them; a poll
            # that brings back a model and its ensemble lets the model finish loading first).
            if not members_asked and self.ensembles.load_members(load, definition, fingerprint, files):
                return
            error = self.ensembles.ensemble_error(definition)
        if self.ensembles.waits_for_members(name, definition, error, restoring):
            self._finish_if_done(load)
            return
        record = self.registry.models.get(name)
        if isinstance(error, MissingModel):
            # A name the repository does not have: a load request's is refused, one named at startup
            # (--load-model) fails the startup, as in Triton; neither is recorded.
            load.errors.append(error)
            if not load.replies:
                missing = f"failed to poll model '{name}': model not found in any model repository."
                log.error("%s", missing)
                self.repository_errors += (missing,)
            self._finish_if_done(load, prefix=False)
            return
        if record is None:
            record = self.registry.models[name] = ModelRecord(name)
        record.fingerprint = fingerprint
        if error is not None:
            log.error("model %s failed to load: %s", name, error)
            if record.versions and not record.unloaded:
                record.last_error = f"reload failed, the previous load keeps serving: {error}"
            elif stage_of(error) is LoadStage.CONFIG and record.failed_in_lifecycle:
                pass   # it stays: Triton falls back to the state before the poll
            else:
                record.error, record.error_stage, record.unloaded = str(error), stage_of(error), False
                record.config_json = record.labels = None
            load.errors.append(error)
            self.membership.changed()
            self._finish_if_done(load)
            return
        # Every read (ModelReader.read, a scan's ModelEntry) gives a definition or an error (returned above).
        assert definition is not None
        record.override = load.override
        was_unloaded, record.unloaded = record.unloaded, False
        load.first = not (was_unloaded or record.versions or record.unloaded_versions)
        serving = not was_unloaded and any(v.state == VersionState.READY for v in record.versions.values())
        record.error, record.last_error = None, None
        if not serving and any(info.error is None for info in definition.versions):
            _publish(record, definition)   # a first load shows its config at once; a reload's, once it serves
        selected = {info.version: info for info in definition.versions}
        kept_all, failed = True, False   # every version kept as it runs; a version of this load failed
        for number, info in selected.items():
            record.unloaded_versions.discard(number)
            current = record.versions.get(number) if not was_unloaded else None
            if info.error and current is not None and current.state == VersionState.READY:
                record.last_error = f"reload failed, the previous load keeps serving: version {number}: {info.error}"
                load.errors.append(_version_error(number, info.error))
                log.error("model %s version %d failed to reload (the previous load keeps serving): %s",
                          name, number, info.error)
                kept_all, failed = False, True
                continue
            if info.error:
                record.version_errors[number] = info.error
                load.errors.append(_version_error(number, info.error))
                log.error("model %s version %d failed to load: %s", name, number, info.error)
                kept_all, failed = False, True
                continue
            record.version_errors.pop(number, None)
            if current is not None and current.state != VersionState.UNAVAILABLE and \
                    self._same_load(current, definition, files):
                continue  # nothing changed for this version: keep it as it is
            kept_all = False
            if current is not None and current.state == VersionState.READY and \
                    self._only_instance_groups_changed(current, definition, files):
                self._update_instance_groups(current, definition, load)
                continue
            self._start_version(record, number, definition, files, current, load)
        for number in [n for n in record.version_errors if n not in selected]:
            # a failed version the policy no longer selects is unloaded, as Triton's lifecycle says of it
            del record.version_errors[number]
            record.unloaded_versions.add(number)
        if serving and kept_all:   # only the version policy changed: its config shows at once
            _publish(record, definition)
        elif serving and not failed:   # it shows once a version of this load serves
            load.publish = definition
        # Versions the policy dropped serve until the new ones are ready, so that a request
        # for the latest version always finds one.
        load.retiring.extend(v for n, v in record.versions.items() if n not in selected)
        self.membership.changed()
        self._finish_if_done(load)

    def _start_version(self, record: ModelRecord, number: int, definition: ModelDefinition, files,
                       current: ModelVersion | None, load: LoadInProgress, attempt: int = 0) -> None:
        version = ModelVersion(record.name, number, definition, epoch=next(self._epochs),
                               replaces=current, files=files, load_attempt=attempt)
        self._version_files[version.epoch] = _version_files(definition, number)
        version.identity = load_identity(config_to_json_dict(definition.portable_config), files,
                                         self._version_files[version.epoch])
        self._new_version_hook(version)
        self.registry.epochs[version.epoch] = version
        if current is None or current.state != VersionState.READY:
            if current is not None:
                self._retire(current, unload=False)
            record.versions[number] = version
            self.registry.versions[version.key] = version
            version.replaces = None
            load.fresh.append(version)
        load.waiting.add(version.epoch)
        if version.ensemble:  # no instances: READY once the models of its steps are
            limit = definition.config.ensemble_scheduling.max_inflight_requests
            if limit:   # (Triton's words)
                log.info("Ensemble model '%s' configured with max_inflight_requests: %d", record.name, limit)
            self.ensembles.waiting.add(version)
            self.reader.post(self.ensembles.check)
            return
        log.info("loading model %s version %d (epoch %d)%s", record.name, number, version.epoch,
                 " beside the serving one" if version.replaces else "")
        if version.autoscale is not None and self.autoscaler is not None:
            if self.autoscaler.start(version):   # min=0: ready with no instance, until traffic comes
                self.version_ready(version)
            return
        for agent in self.registry.agents.values():
            if agent.serves(record.name) and not agent.draining:
                self._send_backend([agent.identity, Assign((version.assignment(),)).encode()])

    def _update_instance_groups(self, version: ModelVersion, definition: ModelDefinition,
                                load: LoadInProgress) -> None:
        """Give a serving version ``definition``'s instance groups in place (instance_updates.py)."""
        load.waiting.add(version.epoch)
        self._files_before_update[version.epoch] = self._version_files[version.epoch]
        self._version_files[version.epoch] = _version_files(definition, version.version)
        identity = load_identity(config_to_json_dict(definition.portable_config), None,
                                 self._version_files[version.epoch])
        self.instance_updates.start(version, definition, identity)

    def _finish_if_done(self, load: LoadInProgress, prefix: bool = True) -> None:
        if load.waiting:
            return
        self._loads.pop(load.name, None)
        self._retire_dropped(load)
        result: dict | TritiumError = {}
        if load.errors:
            message = "".join(load.errors)
            result = InvalidArgument(f"load failed for model '{load.name}': {message}" if prefix else message)
        for reply in load.replies:
            reply(result)
        if not load.errors:
            self.ensembles.follow(load.name)
        if self.ensembles.waiting:   # an ensemble waits for its models' loads to end, not only their versions
            self.ensembles.check()
        self._run_queued(load.name)

    def _run_queued(self, name: str) -> None:
        """Start what was asked of ``name`` while it was loading: unloads run at once, the next load waits."""
        queued = self._queued.pop(name, [])
        while queued and name not in self._loads:
            queued.pop(0)()
        if queued:
            self._queued.setdefault(name, [])[:0] = queued

    def _retire_dropped(self, load: LoadInProgress) -> None:
        if load.errors:
            self._undo_fresh(load)
        if load.errors and load.retiring:
            log.warning("model %s: keeping version(s) %s serving, since the load that drops them failed",
                        load.name, ", ".join(str(v.version) for v in load.retiring))
            return
        for version in load.retiring:
            if version.state in (VersionState.READY, VersionState.LOADING, VersionState.UNAVAILABLE):
                self._retire(version, unload=True)
        if load.retiring:
            self.membership.changed()

    def _undo_fresh(self, load: LoadInProgress) -> None:
        """A load that failed unloads the versions it loaded where none served, as Triton does
        ("If any of the versions fails to load, abort the load and unload all newly loaded
        versions"): the model is then not half there."""
        record = self.registry.models.get(load.name)
        undone = [v for v in load.fresh if v.state == VersionState.READY
                  and record is not None and record.versions.get(v.version) is v]
        if undone:
            log.warning("model %s: unloading version(s) %s, since the load that brought them failed",
                        load.name, ", ".join(str(v.version) for v in undone))
        for version in undone:
            self._retire(version, unload=True)

    # -- versions becoming ready, failing, draining -------------------------------------

    def version_ready(self, version: ModelVersion) -> None:
        record = self.registry.models.get(version.name)
        self._set_state(version, VersionState.READY)
        log.info("model %s version %d is READY (epoch %d)", version.name, version.version, version.epoch)
        load = self._loads.get(version.name)
        if load is not None and load.publish is not None and version.epoch in load.waiting and record is not None:
            _publish(record, load.publish)   # a reload that only added versions beside kept ones
            load.publish = None
        old = version.replaces
        if old is not None and record is not None:
            _publish(record, version.definition)  # gateways now check requests against the new config
            version.replaces = None
            record.versions[version.version] = version
            self.registry.versions[version.key] = version
            self._retire(old, unload=False)  # traffic has moved; the old epoch finishes and stops
        self._progress(version)
        if len(version.batcher):   # requests held while a new broker process took the instances over
            self.scheduler.dispatch(version)
        if self.ensembles.waiting:
            self.ensembles.check()

    def _instances_updated(self, version: ModelVersion, error: str | None) -> None:
        """A serving version's instance update ended (InstanceUpdates): its load goes on."""
        record = self.registry.models.get(version.name)
        files_before = self._files_before_update.pop(version.epoch, None)
        if error is not None and files_before is not None and version.epoch in self._version_files:
            self._version_files[version.epoch] = files_before   # it still runs what it ran
        if error is None and record is not None:
            _publish(record, version.definition)
        self.membership.changed()
        load = self._loads.get(version.name)
        if load is None or version.epoch not in load.waiting:
            return
        load.waiting.discard(version.epoch)
        if error is not None:   # (Triton's words: the version is still READY, unless it was unloaded meanwhile)
            load.errors.append(f"version {version.version} is at {version.state.value} state: {error};\n")
        self._finish_if_done(load)

    def version_failed(self, version: ModelVersion, message: str) -> None:
        record = self.registry.models.get(version.name)
        self._unassign(version)
        self.registry.epochs.pop(version.epoch, None)
        self._version_files.pop(version.epoch, None)
        if len(version.batcher):   # held while a new broker process took over: a retry is a new version
            self.scheduler.fail_queued(version, Unavailable(
                f"model '{version.name}' version {version.version} failed to load: {message}"))
        if record is not None and self._load_again(record, version, message):
            return
        log.error("model %s version %d failed to load: %s", version.name, version.version, message)
        if version.replaces is not None and record is not None:  # the old epoch keeps serving
            record.last_error = f"reload failed, the previous load keeps serving: {message}"
            self.membership.changed()
        else:
            self._set_state(version, VersionState.UNAVAILABLE, message)
            self.scheduler.fail_queued(version, Unavailable(
                f"model '{version.name}' version {version.version} failed to load: {message}"))
        self._progress(version, message)
        if self.ensembles.waiting:
            self.ensembles.check()

    def ensemble_refused(self, version: ModelVersion, message: str) -> None:
        """A first load of an ensemble whose models did not load: Triton's dependency graph never lets
        such an ensemble into its lifecycle, so it ends as a config refused while polling does (its
        name alone in the repository index, unknown to requests, not counted by readiness); its load
        is answered with the reason, and polling tries it again once its models load. An ensemble
        with a version serving fails as any version does."""
        record = self.registry.models.get(version.name)
        load = self._loads.get(version.name)
        # Only a first load of one version with nothing asked behind it: a record with a history (an
        # unload, versions) or more versions keeps failing as versions do.
        if record is None or load is None or not load.first or version.name in self._queued \
                or list(record.versions.values()) != [version]:
            self.version_failed(version, message)
            return
        self._unassign(version)
        self.registry.epochs.pop(version.epoch, None)
        self._version_files.pop(version.epoch, None)
        if self.registry.versions.get(version.key) is version:
            del self.registry.versions[version.key]
        del record.versions[version.version]
        version.state = VersionState.UNAVAILABLE
        error = LoadFailure.at(f"ensemble '{version.name}': {message}", LoadStage.CONFIG)
        log.error("model %s failed to load: %s", version.name, error)
        record.error, record.error_stage = str(error), LoadStage.CONFIG   # (a plain str: the model table encodes it)
        record.config_json = record.labels = None
        self.ensembles.waits_for_members(version.name, version.definition, error, restoring=False)
        self.membership.changed()
        if version.epoch in load.waiting:
            load.waiting.discard(version.epoch)
            load.errors.append(error)
            self._finish_if_done(load)

    def _load_again(self, record: ModelRecord, version: ModelVersion, message: str) -> bool:
        """Triton's --model-load-retry-count: a version that failed to load (its instances already
        stopped) starts again at once, as a new epoch of the same files, while tries are left, the
        model is not being unloaded, and a host can take it (one lost or draining while it loaded
        leaves none: the load fails, as without retries, rather than waiting for a host to join)."""
        load = self._loads.get(version.name)
        if version.load_attempt >= self.settings.load_retries or record.unloaded \
                or load is None or version.epoch not in load.waiting:
            return False
        if not version.ensemble and not any(agent.serves(version.name) and not agent.draining
                                            for agent in self.registry.agents.values()):
            return False
        attempt = version.load_attempt + 1
        log.warning("model %s version %d failed to load, trying again (retry %d of %d): %s", version.name,
                    version.version, attempt, self.settings.load_retries, message)
        load.waiting.discard(version.epoch)
        self._start_version(record, version.version, version.definition, version.files, version.replaces, load,
                            attempt)
        return True

    def _set_state(self, version: ModelVersion, state: VersionState, reason: str = "") -> None:
        self.registry.set_state(version, state, reason)
        self.membership.changed()

    def _progress(self, version: ModelVersion, error: str | None = None) -> None:
        load = self._loads.get(version.name)
        if load is None or version.epoch not in load.waiting:
            return
        load.waiting.discard(version.epoch)
        if error is not None:
            load.errors.append(_version_error(version.version, error))
        self._finish_if_done(load)

    def unload_now(self, name: str, with_members: bool = False) -> None:
        record = self.registry.models.get(name)
        if record is None or record.unloaded:
            return  # unloading what is not loaded succeeds, as in Triton
        members = members_of(record)
        record.unloaded = True
        for epoch_version in list(self.registry.epochs.values()):  # first, so that their load is answered
            if epoch_version.name == name and epoch_version.state == VersionState.LOADING:
                self.version_failed(epoch_version, "unloaded while loading")
        for version in list(record.versions.values()):
            record.unloaded_versions.add(version.version)
            self._retire(version, unload=True)
        self.membership.changed()
        log.info("model %s unloaded; its in-flight requests finish", name)
        for dependent in self.ensembles.using(name):  # as Triton: an ensemble goes with its models
            if self.registry.models[dependent].unloaded:
                continue  # gone already with another of its models (it uses a nested ensemble that used this)
            log.info("unloading ensemble %s, which uses model %s", dependent, name)
            self.ensembles.note_dependent(dependent, members_of(self.registry.models[dependent]))
            self.unload_now(dependent)
        if with_members:
            for member in members:
                if not self.ensembles.using(member):
                    self.unload_now(member, with_members=True)
        if self.ensembles.waiting:
            self.ensembles.check()

    def _retire(self, version: ModelVersion, unload: bool) -> None:
        """No new requests for ``version``; it finishes what it holds, then its instances stop."""
        if self.registry.versions.get(version.key) is version:
            del self.registry.versions[version.key]
        record = self.registry.models.get(version.name)
        if unload and record is not None and record.versions.get(version.version) is version:
            del record.versions[version.version]
            record.unloaded_versions.add(version.version)
        self._set_state(version, VersionState.UNLOADING)
        self.draining.add(version)
        self.check_drained()

    def check_drained(self) -> None:
        for version in list(self.draining):
            if len(version.batcher) or any(i.inflight for i in version.instances) \
                    or self.scheduler.streams.of_version(version):
                continue
            self.draining.discard(version)
            self._unassign(version)
            self.membership.remove_stopped(version)
            self.registry.epochs.pop(version.epoch, None)
            self._version_files.pop(version.epoch, None)
            self._set_state(version, VersionState.UNAVAILABLE, UNLOADED)
            log.info("model %s version %d (epoch %d) drained and stopped", version.name, version.version,
                     version.epoch)

    def _unassign(self, version: ModelVersion) -> None:
        if version.ensemble:
            return  # no agent runs anything of it
        message = Unassign((LoadRef(version.name, version.version, version.epoch),)).encode()
        for agent in self.registry.agents.values():
            self._send_backend([agent.identity, message])

    # -- agents and instances ---------------------------------------------------------------

    def loads_for(self, agent: AgentRecord) -> list[ModelVersion]:
        """The loads a host joining now should run (or, for autoscaled ones, may keep running)."""
        return [v for v in self.registry.epochs.values()
                if v.state in (VersionState.LOADING, VersionState.READY) and agent.serves(v.name) and not v.ensemble]

    def placed(self, placed: Placed, agent: bytes = b"") -> None:
        """An agent's answer to ASSIGN: the instances it starts for a load, or why it cannot (an
        answer to new instance groups is InstanceUpdates')."""
        version = self.registry.epochs.get(placed.epoch)
        if version is None:
            return
        if self.instance_updates.placed(version, agent, placed):
            return   # an answer to new instance groups
        if placed.error is not None:
            why = placed.error.message
            if version.autoscale is not None and self.autoscaler is not None:
                self.autoscaler.placement_failed(version, agent, why)   # it places elsewhere
                if version.state == VersionState.LOADING and (version.scale is None or version.scale.total == 0):
                    self.version_failed(version, why)
            elif version.state == VersionState.LOADING:
                self.version_failed(version, why)
            else:  # another host cannot serve it; the hosts that do keep serving
                log.error("model %s version %d cannot be placed on a host: %s", version.name, version.version, why)
            return
        for name in placed.instances or ():
            version.placed.add(name)
            version.placed_on[name] = agent

    def host_gone(self, agent: bytes, why: str) -> None:
        """A host lost or draining takes its not-yet-ready instances out of the loads in progress."""
        self.instance_updates.host_gone(agent)
        for version in [v for v in self.registry.epochs.values() if v.state == VersionState.LOADING]:
            gone = {name for name, where in version.placed_on.items()
                    if where == agent and name not in version.seen_ready}
            if not gone:
                continue
            version.placed -= gone
            for name in gone:
                del version.placed_on[name]
            if not version.placed:
                self.version_failed(version, why)
            elif version.placed <= version.seen_ready:
                self.version_ready(version)

    def instance_joined(self, version: ModelVersion, name: str, agent: bytes) -> None:
        version.seen_ready.add(name)
        if version.state == VersionState.LOADING and version.placed <= version.seen_ready:
            self.version_ready(version)
        elif self.instance_updates:
            self.instance_updates.joined(version, agent, name)

    def _same_load(self, current: ModelVersion, definition: ModelDefinition, files) -> bool:
        """Whether ``current`` was loaded from what ``definition`` would load now (no reload then).
        A change of version policy alone loads and unloads other versions but leaves a version that
        stays as it runs, as in Triton. The config file's own time is not asked, only what it says
        (Triton's timestamps leave it out): a config written again the same reloads nothing."""
        return self._same_files(current, definition, files, besides=_config_entries(current, definition)) and \
            _without(current.definition.portable_config, "version_policy") == \
            _without(definition.portable_config, "version_policy")

    def _only_instance_groups_changed(self, current: ModelVersion, definition: ModelDefinition, files) -> bool:
        """Whether ``definition`` changes only the instance groups of ``current``, which Triton then
        updates in place (instance_updates.py); not while a previous update's leaving instances
        still hold sequences."""
        if current.ensemble or current.autoscale is not None or self.instance_updates.lingering(current):
            return False
        return self._same_files(current, definition, files, besides=_config_entries(current, definition)) and \
            _without(current.definition.portable_config, "version_policy", "instance_group") == \
            _without(definition.portable_config, "version_policy", "instance_group")

    def _same_files(self, current: ModelVersion, definition: ModelDefinition, files,
                    besides: AbstractSet[str] = frozenset()) -> bool:
        """Whether the same files back both loads; ``besides``: the model folder's entries left out."""
        def kept(fingerprint: tuple | None) -> tuple | None:
            if fingerprint is None:
                return None
            return tuple(item for item in fingerprint if item[0].split("/", 1)[0] not in besides)

        return (files is None and current.files is None
                and current.definition.labels == definition.labels
                and current.definition.path == definition.path
                and kept(self._version_files.get(current.epoch)) == kept(_version_files(definition,
                                                                                       current.version)))


def _config_entries(current: ModelVersion, definition: ModelDefinition) -> set[str]:
    return {entry for entry in map(_top_entry, (current.definition, definition)) if entry is not None}


def _top_entry(definition: ModelDefinition) -> str | None:
    """The entry of the model folder that holds its config file: the file, or the whole folder
    it is in (as Triton leaves out of its timestamps the entry the config path starts with: a
    change to another file of a `configs/` folder is not seen either)."""
    if definition.config_file is None:
        return None
    try:
        return definition.config_file.relative_to(definition.path).parts[0]
    except ValueError:   # (a config file outside the model folder)
        return None


def _without(config, *fields: str):
    copy = type(config)()
    copy.CopyFrom(config)
    for name in fields:
        copy.ClearField(name)
    return copy


def _index_entries(record: ModelRecord) -> list[dict]:
    entries = {}
    for number in record.unloaded_versions:
        entries[number] = (VersionState.UNAVAILABLE.value, UNLOADED)
    if record.error is not None and not record.versions:
        # As Triton's index shows a model by how far its load got: a config refused while polling
        # never entered its lifecycle (its name alone); no version to load leaves it there with
        # none (no entry); any other failure is the model's, with the reason.
        stage = record.error_stage
        if stage is LoadStage.LOAD:
            return [{"name": record.name, "state": VersionState.UNAVAILABLE.value, "reason": record.error}]
        if not entries:
            return [{"name": record.name}] if stage is LoadStage.CONFIG else []
    for number, error in record.version_errors.items():
        entries[number] = (VersionState.UNAVAILABLE.value, error)
    if not record.unloaded:
        for number, version in record.versions.items():
            reason = version.reason or (record.last_error or "")
            entries[number] = (version.state.value, reason)
    result = []
    for number, (state, reason) in sorted(entries.items()):
        entry = {"name": record.name, "version": str(number), "state": state}
        if reason:
            entry["reason"] = reason
        result.append(entry)
    return result


def _publish(record: ModelRecord, definition: ModelDefinition) -> None:
    """Make ``definition`` the config gateways show and check requests against."""
    record.config_json = definition.config_json()
    record.labels = {name: list(lines) for name, lines in definition.labels.items()} or None


def _version_error(number: int, reason: str) -> str:
    return f"version {number} is at UNAVAILABLE state: {reason};\n"   # Triton's wording


def _version_files(definition: ModelDefinition, number: int) -> tuple:
    """What a version's instances read besides the config (repo/repository.py), the config file's
    own entry left out: a config saved again unchanged is the same load, and has the same identity
    (load_identity: what a restarted broker adopts instances by)."""
    config = _top_entry(definition)
    try:
        return tuple(item for item in version_fingerprint(definition.path, number)
                     if item[0].split("/", 1)[0] != config)
    except OSError:
        return ()
