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
   (their ``finalize`` has run, as Triton's load returns after it).

Models with sequence batching, ensembles and autoscaled models reload as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from tritium.broker.registry import InstanceRecord, ModelVersion, Registry, VersionState
from tritium.protocol import Assign, LoadRef, Placed, Unassign
from tritium.repo import ModelDefinition

log = logging.getLogger(__name__)

Done = Callable[[ModelVersion, "str | None"], None]   # the update ended: None, or why it failed


@dataclass(eq=False)
class InstanceUpdate:
    version: ModelVersion
    old: ModelDefinition
    old_identity: str
    hosts: set[bytes]                                           # agents yet to answer the new groups
    started: dict[str, bytes] = field(default_factory=dict)    # new instance key -> its agent
    leaving: dict[str, bytes] = field(default_factory=dict)    # instance key -> agent: to drain and stop
    told: set[str] = field(default_factory=set)                # leaving keys whose stop was sent
    exited: set[str] = field(default_factory=set)              # new instance keys whose process ended
    switched: bool = False   # the new instances take batches, the leaving ones drain
    error: str | None = None


class InstanceUpdates:
    """The loads whose instance groups are being updated; the one owner of that state."""

    def __init__(self, registry: Registry, scheduler, send_backend, done: Done) -> None:
        self.registry = registry
        self.scheduler = scheduler
        self._send_backend = send_backend
        self._done = done
        self._updates: dict[int, InstanceUpdate] = {}   # epoch -> its update

    def __bool__(self) -> bool:
        return bool(self._updates)

    def start(self, version: ModelVersion, definition: ModelDefinition, identity: str) -> None:
        """Send ``version``'s hosts the instance groups of ``definition`` (it differs from the
        serving config only there)."""
        hosts = {a.identity for a in self.registry.agents.values() if a.serves(version.name) and not a.draining}
        self._updates[version.epoch] = InstanceUpdate(version, version.definition, version.identity, hosts)
        version.definition, version.identity = definition, identity   # what new instances start from
        version.reason = ""
        log.info("model %s version %d: updating its instance groups in place", version.name, version.version)
        message = Assign((msgspec.structs.replace(version.assignment(), update=True),)).encode()
        for agent in hosts:
            self._send_backend([agent, message])

    def placed(self, version: ModelVersion, agent: bytes, placed: Placed) -> bool:
        """An agent's answer to the new groups; False when ``placed`` is not one."""
        update = self._updates.get(version.epoch)
        if update is None or agent not in update.hosts:
            return False
        update.hosts.discard(agent)
        if placed.error is not None:
            self._fail(update, placed.error.message)
        else:
            for key in placed.instances or ():
                if key not in version.placed:
                    update.started[key] = agent
                    version.placed.add(key)
                    version.placed_on[key] = agent
            for key in placed.leaving or ():
                update.leaving[key] = agent
            if update.error is not None:   # failed meanwhile: what it started leaves, what it kept stays
                update.leaving = dict(update.started)
        self.check()
        return True

    def holds(self, version: ModelVersion, key: str) -> bool:
        """Whether a new instance saying HELLO is held out of scheduling (its update is not through)."""
        update = self._updates.get(version.epoch)
        return update is not None and not update.switched and key in update.started

    def failed(self, version: ModelVersion, key: str, message: str) -> bool:
        """A new instance could not start; False when ``key`` is none of an update's new ones."""
        update = self._updates.get(version.epoch)
        if update is None or update.switched or key not in update.started:
            return False
        self._fail(update, message)
        self.check()
        return True

    def exited(self, version: ModelVersion, key: str, why: str, expected: bool) -> None:
        """An instance of ``version`` ended: a new one that ends before it was ready fails the update."""
        update = self._updates.get(version.epoch)
        if update is None or key not in update.started:
            return
        update.exited.add(key)
        if not expected and key not in version.seen_ready:
            self.failed(version, key, f"instance {key} {why} before it was ready")
        self.check()

    def host_gone(self, agent: bytes) -> None:
        """A host lost: it answers no more, and the instances it ran are gone with it."""
        for update in self._updates.values():
            update.hosts.discard(agent)
            update.exited.update(key for key, where in update.started.items() if where == agent)
        self.check()

    def check(self) -> None:
        """Move each update on: switch once every new instance is ready, stop the leaving ones
        as they become idle, end once they are gone. Run each broker turn while any is on."""
        for update in list(self._updates.values()):
            version = update.version
            if version.state != VersionState.READY:   # unloaded or stopped meanwhile: nothing left to update
                self._end(update, update.error or "the model was unloaded during its instance update")
                continue
            if update.hosts:
                continue
            if update.error is None and not update.switched:
                if not set(update.started) <= version.seen_ready:
                    continue
                self._switch(update)
            self._stop_idle(update)
            if update.told == set(update.leaving) and all(self._gone(update, key) for key in update.told):
                self._end(update, update.error)

    @staticmethod
    def _gone(update: InstanceUpdate, key: str) -> bool:
        """A stopped instance is gone once it left the version (it exited, or its host was lost);
        a new one that may never have joined, once its process ended."""
        if any(i.name == key for i in update.version.instances):
            return False
        return key not in update.started or key in update.exited

    def _fail(self, update: InstanceUpdate, message: str) -> None:
        if update.error is not None:
            return
        version = update.version
        log.error("model %s version %d: the instance update failed, its instances stay as they were: %s",
                  version.name, version.version, message)
        update.error = message
        update.leaving = dict(update.started)
        version.definition, version.identity = update.old, update.old_identity

    def _switch(self, update: InstanceUpdate) -> None:
        version = update.version
        update.switched = True
        for key, agent in update.leaving.items():
            for instance in _instances(version, key, agent):
                instance.draining = True
        for key, agent in update.started.items():
            host = self.registry.agents.get(agent)
            for instance in _instances(version, key, agent):
                instance.draining = host is None or host.draining
                self.scheduler.instance_ready(instance)

    def _stop_idle(self, update: InstanceUpdate) -> None:
        version = update.version
        for key, agent in update.leaving.items():
            if key in update.told:
                continue
            if key in update.started and key not in version.seen_ready and key not in update.exited:
                continue   # still starting: Triton, too, sees every creation through before it fails
            instances = _instances(version, key, agent)
            for instance in instances:
                instance.draining = True
            if self.scheduler.holds_work(instances):
                continue
            update.told.add(key)
            ref = LoadRef(version.name, version.version, version.epoch, instances=(key,))
            self._send_backend([agent, Unassign((ref,)).encode()])

    def _end(self, update: InstanceUpdate, error: str | None) -> None:
        version = update.version
        del self._updates[version.epoch]
        for key in update.told:
            version.placed.discard(key)
            version.placed_on.pop(key, None)
            version.seen_ready.discard(key)
        if error is not None:
            version.reason = error
        self._done(version, error)


def _instances(version: ModelVersion, key: str, agent: bytes) -> list[InstanceRecord]:
    return [i for i in version.instances if i.name == key and i.agent == agent]
