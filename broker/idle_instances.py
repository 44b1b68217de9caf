"""Which instances of each model version are idle, in the order they became idle: the scheduler's
pick of the instance a batch goes to.
"""

from __future__ import annotations

from tritium.broker.batcher import DynamicBatcher
from tritium.broker.registry import InstanceRecord, ModelVersion, Registry


class IdleInstances:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        # Per version: ((its instance count, its last instance) when built, its idle instances in
        # the order they became idle); rebuilt when its instances change, forgotten once the version
        # has left the registry (a plain dict: a weak one's look-up cost three times as much, three
        # times a request).
        self._with_room: dict[ModelVersion, tuple[tuple, dict[InstanceRecord, None]]] = {}

    def pick(self, version: ModelVersion) -> InstanceRecord | None:
        """The idle instance that became idle last, or None (a model that cannot batch may give
        a second batch to a busy instance with credit left, when none is idle).

        Idle instances are kept per version (``_room_of``), so a pick does not compare every
        instance: with hundreds of instances that scan was most of the broker's time
        (bench/broker_capacity.py). The most recently freed goes first, as Triton hands a batch
        to the first free instance: work stays on the fewest instances, in larger batches.
        Stale entries (busy, draining or gone) are dropped as they are met.
        """
        idle = self._room_of(version)
        while idle:
            instance = next(reversed(idle))
            if not self._still_idle(instance):
                del idle[instance]
                continue
            return instance
        # A second batch only for a model that cannot batch, and never with a queue policy: a
        # request sent ahead to a busy instance could no longer be overtaken or time out.
        batcher = version.batcher
        if isinstance(batcher, DynamicBatcher) and batcher.simple and not batcher.policy.enabled:
            return max((i for i in version.instances if not i.draining and i.credit > 0),
                       key=lambda i: i.credit, default=None)
        return None

    def count(self, version: ModelVersion, enough: int) -> int:
        """How many of the version's instances are idle, counting no further than ``enough``."""
        idle = self._room_of(version)
        found, stale = 0, []
        for instance in idle:
            if not self._still_idle(instance):
                stale.append(instance)
                continue
            found += 1
            if found == enough:
                break
        for instance in stale:
            del idle[instance]
        return found

    def _still_idle(self, instance: InstanceRecord) -> bool:
        """Whether an entry of the idle instances may take a batch (not busy, draining or gone)."""
        return not (instance.draining or instance.inflight or instance.credit <= 0) \
            and self.registry.instances.get(instance.iid) is instance

    def busy(self, version: ModelVersion, instance: InstanceRecord) -> None:
        """``instance`` was sent a batch: not idle until it is done."""
        if not version.stateful:
            self._room_of(version).pop(instance, None)

    def idle_again(self, version: ModelVersion, instance: InstanceRecord) -> None:
        if not version.stateful:
            self._room_of(version)[instance] = None

    def _room_of(self, version: ModelVersion) -> dict[InstanceRecord, None]:
        """The version's idle instances, in the order they became idle; rebuilt when its
        instances change."""
        instances = version.instances
        members = (len(instances), instances[-1] if instances else None)
        entry = self._with_room.get(version)
        if entry is None or entry[0] != members:
            if entry is None:
                self._forget_retired()
            # The first instance last, so that it is taken first, as before any batch was done.
            entry = self._with_room[version] = (members, dict.fromkeys(reversed(instances)))
        return entry[1]

    def _forget_retired(self) -> None:
        epochs = self.registry.epochs
        for version in [version for version in self._with_room if epochs.get(version.epoch) is not version]:
            del self._with_room[version]
