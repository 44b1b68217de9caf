"""Instance groups changed in place: a reload whose config differs only in ``instance_group``.

Triton updates such a model without reloading it: the instances the new groups match go on
as they run, the others are created, and those left over are removed; a failure leaves
the model as it was. Here, for one serving load (``ModelVersion``, its epoch unchanged):

1. every host agent serving the model is sent the new groups (ASSIGN ``update``); each keeps
   the running instances that match them, starts the others and lists the rest as leaving
   (PLACED ``leaving``);
2. the new instances, once ready, are held out of scheduling until all of them are: if one
   fails (its initialize raises, it dies, the rate limiter refuses it), they are the ones
   that leave instead, and the load fails with the version still READY, as in Triton;
3. otherwise the new instances take batches and the leaving ones drain: each is stopped
   (UNASSIGN of its key) once it holds no work, and the load is answered when they are gone
   (their ``finalize`` has run, as Triton's load returns after it). A leaving instance of a
   stateful model lives on until the sequences bound to it end, as in Triton: the load is
   answered without waiting for it (the update lingers until it is stopped). A failed update is
   undone by a second round, an update to the old groups (``failure`` says why the first failed),
   so that what the hosts keep running is what the serving config describes (a host that joined
   meanwhile started the new groups); its load is answered when that round is through.

Instance keys are unique per host, so every instance is tracked as (agent, key).

Ensembles and autoscaled models reload as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from tritium.broker.registry import InstanceRecord, ModelVersion, Registry, VersionState
from tritium.broker.scheduler import Scheduler
from tritium.broker.sequences import SequenceBatcher
from tritium.protocol import Assign, LoadRef, Placed, Unassign
from tritium.repo import ModelDefinition

log = logging.getLogger(__name__)

Done = Callable[[ModelVersion, "str | None"], None]   # the update ended: None, or why it failed
Entry = tuple[bytes, str]   # (agent, instance key)


@dataclass(eq=False)
class InstanceUpdate:
    version: ModelVersion
    old: ModelDefinition
    old_identity: str
    hosts: set[bytes]                                      # agents yet to answer the new groups
    started: set[Entry] = field(default_factory=set)       # the new instances
    leaving: set[Entry] = field(default_factory=set)       # to drain and stop
    told: set[Entry] = field(default_factory=set)          # leaving ones whose stop was sent
    joined: set[Entry] = field(default_factory=set)        # new ones that said HELLO at least once
    ended: set[Entry] = field(default_factory=set)         # new ones whose process is gone (until it says HELLO again)
    switched: bool = False   # the new instances take batches, the leaving ones drain
    answered: bool = False   # its load was answered (only leaving instances holding sequences are left)
    error: str | None = None
    failure: str | None = None   # a round undoing a failed update: why that one failed


class InstanceUpdates:
    """The loads whose instance groups are being updated; the one owner of that state."""

    def __init__(self, registry: Registry, scheduler: Scheduler, send_backend: Callable[[list], None],
                 done: Done) -> None:
        self.registry = registry
        self.scheduler = scheduler
        self._send_backend = send_backend
        self._done = done
        self._updates: dict[int, InstanceUpdate] = {}   # epoch -> its update

    def __bool__(self) -> bool:
        return bool(self._updates)

    def lingering(self, version: ModelVersion) -> bool:
        """Whether an update of ``version`` is still on. Loads of one model run one at a time, so for
        a new load this means one whose load was answered while leaving instances still serve
        their sequences."""
        return version.epoch in self._updates

    def start(self, version: ModelVersion, definition: ModelDefinition, identity: str) -> None:
        """Send the hosts of ``version`` the instance groups of ``definition`` (it differs from the
        serving config only there)."""
        update = self._updates[version.epoch] = InstanceUpdate(version, version.definition, version.identity,
                                                               self._hosts_of(version))
        version.definition, version.identity = definition, identity   # what new instances start from
        version.reason = ""
        log.info("model %s version %d: updating its instance groups in place", version.name, version.version)
        self._tell_hosts(update)

    def placed(self, version: ModelVersion, agent: bytes, placed: Placed) -> bool:
        """An agent's answer to an update; False when ``placed`` is not one."""
        update = self._updates.get(version.epoch)
        if not placed.update or update is None or agent not in update.hosts:
            return False
        update.hosts.discard(agent)
        if placed.error is not None and not _placed_on(version, agent):
            log.error("model %s version %d cannot be placed on a host: %s", version.name, version.version,
                      placed.error.message)   # a host that did not serve it before: the others go on
        elif placed.error is not None:
            self._fail(update, placed.error.message)
        else:
            kept = set(placed.kept or ())
            for key in placed.instances or ():
                if key not in kept:
                    update.started.add((agent, key))
                    version.placed.add(key)
                    version.placed_on[key] = agent
            update.leaving.update((agent, key) for key in placed.leaving or ())
            if update.error is not None:
                _started_leave(update)
        self.check()
        return True

    def holds(self, version: ModelVersion, agent: bytes, key: str) -> bool:
        """Whether an instance saying HELLO is held out of scheduling: a new one before its update is
        through, or one that is leaving (once the update switched, or failed: what it started leaves),
        started again (it would be given a sequence it cannot keep)."""
        update = self._updates.get(version.epoch)
        if update is None:
            return False
        entry = (agent, key)
        return entry in update.leaving if update.switched or update.error else entry in update.started

    def joined(self, version: ModelVersion, agent: bytes, key: str) -> None:
        update = self._updates.get(version.epoch)
        if update is not None and (agent, key) in update.started:
            update.joined.add((agent, key))
            update.ended.discard((agent, key))
        self.check()

    def failed(self, version: ModelVersion, agent: bytes, key: str, message: str) -> None:
        """A new instance could not start (its initialize raised, the rate limiter refused it)."""
        update = self._updates.get(version.epoch)
        if update is not None and not update.switched and (agent, key) in update.started:
            self._fail(update, message)
            self.check()

    def exited(self, version: ModelVersion, agent: bytes, key: str, why: str, expected: bool) -> None:
        """An instance of ``version`` ended; a new one that ends before it was ever ready, not
        stopped on purpose, fails the update (one that was ready is started again by its agent)."""
        update = self._updates.get(version.epoch)
        if update is None or (agent, key) not in update.started:
            return
        update.ended.add((agent, key))
        if not expected and (agent, key) not in update.joined and not update.switched:
            self._fail(update, f"instance {key} {why} before it was ready")
        self.check()

    def host_gone(self, agent: bytes) -> None:
        """A host lost or draining: it answers no more, and what it runs leaves with it."""
        for update in self._updates.values():
            update.hosts.discard(agent)
            update.ended.update(entry for entry in update.started if entry[0] == agent)
            update.leaving = {entry for entry in update.leaving if entry[0] != agent}
            update.told = {entry for entry in update.told if entry[0] != agent}
        self.check()

    def check(self) -> None:
        """Move each update on: switch once every new instance is ready, stop the leaving ones
        as they become idle, end once they are gone. Run each broker turn while any is on."""
        for update in list(self._updates.values()):
            version = update.version
            if self._updates.get(version.epoch) is not update:
                continue   # ended, or replaced by its undo, earlier in this loop
            if version.state != VersionState.READY:   # unloaded or stopped meanwhile: nothing left to update
                self._end(update, update.error or "the model was unloaded during its instance update")
                continue
            if update.hosts:
                continue
            if update.error is None and not update.switched:
                if not all(_present(version, entry) or entry in update.ended for entry in update.started):
                    continue
                self._switch(update)
            self._stop_idle(update)
            if not all(self._gone(update, entry) for entry in update.told):
                continue
            if update.told == update.leaving:
                self._end(update, update.error)
            elif update.error is None and not update.answered and self._held_only_by_sequences(update):
                update.answered = True   # the rest wait for their sequences to end
                self._done(version, update.failure)

    @staticmethod
    def _held_only_by_sequences(update: InstanceUpdate) -> bool:
        return all(_binds_sequences(update.version, _instances(update.version, *entry))
                   for entry in update.leaving - update.told)

    @staticmethod
    def _gone(update: InstanceUpdate, entry: Entry) -> bool:
        """A stopped instance is gone once it left the version (it exited, or its host was lost);
        a new one, which may never have joined, once its process ended."""
        return not _present(update.version, entry) and (entry not in update.started or entry in update.ended)

    def _fail(self, update: InstanceUpdate, message: str) -> None:
        if update.error is not None:
            return
        version = update.version
        log.error("model %s version %d: the instance update failed, its instances stay as they were: %s",
                  version.name, version.version, message)
        update.error = message
        _started_leave(update)
        update.told &= update.leaving
        version.definition, version.identity = update.old, update.old_identity

    def _switch(self, update: InstanceUpdate) -> None:
        version = update.version
        update.switched = True
        for agent, key in update.leaving:
            for instance in _instances(version, agent, key):
                instance.draining = True
        for agent, key in update.started:
            host = self.registry.agents.get(agent)
            for instance in _instances(version, agent, key):
                if instance.passive:
                    continue   # never given work
                instance.draining = host is None or host.draining
                self.scheduler.instance_ready(instance)

    def _stop_idle(self, update: InstanceUpdate) -> None:
        version = update.version
        for entry in update.leaving - update.told:
            if _starting(update, entry):
                continue   # Triton, too, sees every creation through before it fails
            agent, key = entry
            instances = _instances(version, agent, key)
            for instance in instances:
                instance.draining = True
            if self.scheduler.holds_work(instances) or _binds_sequences(version, instances):
                continue
            update.told.add(entry)
            ref = LoadRef(version.name, version.version, version.epoch, instances=(key,))
            self._send_backend([agent, Unassign((ref,)).encode()])

    def _end(self, update: InstanceUpdate, error: str | None) -> None:
        version = update.version
        if self._updates.get(version.epoch) is update:
            del self._updates[version.epoch]
        for agent, key in update.told:
            version.awaited.pop(key, None)   # stopped on purpose: not coming back
            if not any(i.name == key for i in version.instances):
                version.placed.discard(key)
                version.placed_on.pop(key, None)
                version.seen_ready.discard(key)
        if error is not None and update.failure is None and version.state == VersionState.READY:
            self._undo(update, error)
        elif not update.answered:
            self._done(version, update.failure or error)

    def _undo(self, update: InstanceUpdate, error: str) -> None:
        """Send the hosts the serving groups again: what they run is then what it describes."""
        version = update.version
        version.reason = error
        undo = self._updates[version.epoch] = InstanceUpdate(version, update.old, update.old_identity,
                                                             self._hosts_of(version), failure=error)
        log.info("model %s version %d: giving its hosts the instance groups that serve again", version.name,
                 version.version)
        self._tell_hosts(undo)

    def _hosts_of(self, version: ModelVersion) -> set[bytes]:
        """The hosts that were sent ``version`` (as a load is: every one serving the model, not draining);
        one that joined during an update was sent the new groups."""
        return {a.identity for a in self.registry.agents.values() if a.serves(version.name) and not a.draining}

    def _tell_hosts(self, update: InstanceUpdate) -> None:
        message = Assign((msgspec.structs.replace(update.version.assignment(), update=True),)).encode()
        for agent in update.hosts:
            self._send_backend([agent, message])


def _instances(version: ModelVersion, agent: bytes, key: str) -> list[InstanceRecord]:
    return [i for i in version.instances if i.name == key and i.agent == agent]


def _started_leave(update: InstanceUpdate) -> None:
    """A failed round: what it started leaves, what it kept stays; an undo that fails also lets go
    what does not belong to the serving groups."""
    if update.failure is None:
        update.leaving = set(update.started)
    else:
        update.leaving |= update.started


def _starting(update: InstanceUpdate, entry: Entry) -> bool:
    """A new instance that neither said HELLO yet nor ended."""
    return entry in update.started and entry not in update.joined and entry not in update.ended


def _binds_sequences(version: ModelVersion, instances: list[InstanceRecord]) -> bool:
    batcher = version.batcher
    return isinstance(batcher, SequenceBatcher) and any(batcher.binds(i) for i in instances)


def _placed_on(version: ModelVersion, agent: bytes) -> bool:
    """Whether ``agent`` runs instances of ``version`` (some may be starting again)."""
    return agent in version.placed_on.values() or any(i.agent == agent for i in version.instances)


def _present(version: ModelVersion, entry: Entry) -> bool:
    return bool(_instances(version, *entry))
