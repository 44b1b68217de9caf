"""Triton's rate limiter (``--rate-limit=execution_count``): which instances may start a batch now.

An instance group's ``rate_limiter`` names the resources each of its instances holds while it
runs a batch, and a priority. An instance starts a batch only when all of its resources are
free; instances that wait go in the order of their executions times their priority (a priority
of 2 gets half the chances of 1), and one that waits holds back those ranked after it, so a
model that needs many resources is not starved by models that need few.

Resources count per device of each host (the instance's GPU; 0 for CPU instances) unless
marked ``global``, shared by the devices of the host: each host has its own, as each machine
running Triton does. How many there are: the ``--rate-limit-resource`` given for the name, or,
when none is given at all, the most any instance on the host asks for (every instance can then
run alone). The scheduler owns when batches start (``Scheduler.dispatch``); this module owns
the counts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tritium.broker.registry import InstanceRecord, ModelVersion
from tritium.errors import InvalidArgument
from tritium.repo import ModelConfig

log = logging.getLogger(__name__)

GLOBAL_DEVICE = -2   # the key of resources shared by every device
EVERY_DEVICE = -1    # a --rate-limit-resource without a device: the count of each device

FORMAT_ERROR = ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' "
                "or '<resource_name>:<count>'. Got {}")

Key = tuple[int, str, bytes]   # (device, or GLOBAL_DEVICE; resource name; the host's agent)


@dataclass(frozen=True, slots=True)
class ResourceFlag:
    """One ``--rate-limit-resource``: ``count`` of ``name`` on ``device`` (EVERY_DEVICE: on each)."""

    name: str
    count: int
    device: int = EVERY_DEVICE

    @classmethod
    def parse(cls, text: str) -> ResourceFlag:
        """``NAME:COUNT`` or ``NAME:COUNT:DEVICE``; ValueError with Triton's texts otherwise."""
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(FORMAT_ERROR.format(text))
        numbers = []
        for part in parts[1:]:
            if not part.lstrip("-").isdigit():
                raise ValueError(f"Invalid option value. Got {part}")
            numbers.append(int(part))
        if numbers[0] < 0:   # Triton takes it as a count past any limit
            raise ValueError(f"--rate-limit-resource count must not be negative. Got {text}")
        return cls(parts[0], *numbers)


@dataclass(slots=True)
class _Holder:
    """What one instance asks for, and how often it ran."""

    needs: dict[Key, int]
    priority: int
    executions: int = 0
    holding: bool = False


class RateLimiter:
    def __init__(self, flags: Iterable[ResourceFlag] = ()) -> None:
        self._given: dict[tuple[int, str], int] = {}   # (device or EVERY_DEVICE, name) -> count
        for flag in flags:   # a name given twice for one device: the smaller count, as Triton
            key = (flag.device, flag.name)
            self._given[key] = min(flag.count, self._given.get(key, flag.count))
        self._holders: dict[InstanceRecord, _Holder] = {}
        self._limits: dict[Key, int] = {}
        self._in_use: Counter[Key] = Counter()
        # Versions with requests whose best instance waits for resources: the rank it waits with.
        self.blocked: dict[ModelVersion, int] = {}

    # -- instances come and go ------------------------------------------------------------

    def register_from_config(self, instance: InstanceRecord, config: ModelConfig) -> None:
        """Register an instance with what its instance group's ``rate_limiter`` says."""
        groups = config.instance_group
        limiter = groups[instance.group].rate_limiter if 0 <= instance.group < len(groups) else None
        if limiter is None:
            self.register(instance, (), 1)
        else:   # "global" is a Python keyword: the field is read by name
            self.register(instance, [(r.name, getattr(r, "global"), r.count) for r in limiter.resources],
                          limiter.priority)

    def register(self, instance: InstanceRecord, resources: Iterable[tuple[str, bool, int]], priority: int) -> None:
        """``resources``: (name, global, count) as its group's ``rate_limiter`` lists them, counted on
        the instance's device of its host; InvalidArgument (Triton's text) when the counts the flags give could
        never let it run, or a name is both global and per device."""
        device, host = instance.device, instance.agent
        needs = {(GLOBAL_DEVICE if is_global else device, name, host): count for name, is_global, count in resources}
        self._holders[instance] = _Holder(needs, max(priority, 1))
        try:
            self._limits = self._compute_limits()
        except InvalidArgument:
            del self._holders[instance]
            self._limits = self._compute_limits()
            raise
        self._log_limits()

    def forget(self, instance: InstanceRecord) -> None:
        holder = self._holders.pop(instance, None)
        if holder is None:
            return
        if holder.holding:
            self._in_use.subtract(holder.needs)
        try:
            self._limits = self._compute_limits()
        except InvalidArgument:   # cannot newly fail with fewer instances; keep the old limits if it did
            return
        self._log_limits()

    def _log_limits(self) -> None:
        """The counts, as Triton's verbose log shows them each time an instance comes or goes (one
        line, its tabs and line breaks escaped as in Triton's log)."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        hosts = {host for _, _, host in self._limits}
        text = "\\nMax Resource Map===>\\n"
        for host, device in sorted({(host, device) for device, _, host in self._limits}):
            where = f" of host {host.decode(errors='replace')}" if len(hosts) > 1 else ""   # (each host its own)
            text += f"\\tDevice: {'GLOBAL' if device == GLOBAL_DEVICE else device}{where}\\n"
            for (_, name, _), count in ((k, c) for k, c in self._limits.items() if k[0] == device and k[2] == host):
                text += f"\\t\\tResource: {name}\\t Count: {count}\\n"
        log.debug("%s", text)

    def _compute_limits(self) -> dict[Key, int]:
        """Per resource, the most any instance needs, or what the flags give (checked against it
        first, then that no name is both global and per device: Triton's order, global resources
        first, then by device and name)."""
        most: dict[Key, int] = {}
        for holder in self._holders.values():
            for key, count in holder.needs.items():
                most[key] = max(count, most.get(key, 0))
        most = dict(sorted(most.items()))
        limits = most
        if self._given:
            limits = {}
            for (device, name, host), needed in most.items():
                given = self._given_count(device, name)
                if given < needed:
                    raise InvalidArgument(f'Resource count for "{name}" is limited to {given} which will prevent '
                                          "scheduling of one or more model instances, the minimum required count "
                                          f"is {needed}")
                limits[(device, name, host)] = given
        shared = {name for device, name, _ in most if device == GLOBAL_DEVICE}
        for device, name, _ in most:
            if device != GLOBAL_DEVICE and name in shared:
                raise InvalidArgument(f'Resource "{name}" is present as both global and device-specific '
                                      "resource in the model configuration.")
        return limits

    def _given_count(self, device: int, name: str) -> int:
        """What the flags give: for a global resource the largest count of the name on any device;
        for a device, the larger of its own count and the count for every device; 0 when not named."""
        if device == GLOBAL_DEVICE:
            return max((count for (_, given), count in self._given.items() if given == name), default=0)
        return max(self._given.get((device, name), 0), self._given.get((EVERY_DEVICE, name), 0))

    # -- batches start and end ------------------------------------------------------------

    def rank(self, instance: InstanceRecord) -> int:
        """Lower goes first: its executions times its priority (Triton's scaled priority)."""
        holder = self._holders.get(instance)
        return 0 if holder is None else holder.executions * holder.priority

    def may_start(self, instance: InstanceRecord, version: ModelVersion) -> bool:
        """Whether ``instance`` (the best of ``version``) may start a batch now: no other version
        waits with a better rank, and its resources are free."""
        rank = self.rank(instance)
        if any(waiting < rank for other, waiting in self.blocked.items() if other is not version):
            return False
        return self.free(instance)

    def free(self, instance: InstanceRecord) -> bool:
        holder = self._holders.get(instance)
        if holder is None:
            return True
        return all(self._in_use[key] + count <= self._limits.get(key, count) for key, count in holder.needs.items())

    def acquire(self, instance: InstanceRecord) -> None:
        holder = self._holders.get(instance)
        if holder is not None and not holder.holding:
            holder.holding = True
            self._in_use.update(holder.needs)

    def release(self, instance: InstanceRecord) -> None:
        """Its batch ran: its resources are free again, and it counts one more execution."""
        holder = self._holders.get(instance)
        if holder is not None and holder.holding:
            holder.holding = False
            holder.executions += 1
            self._in_use.subtract(holder.needs)

    def in_use(self, name: str) -> int:
        """How many of a resource running batches hold, on every device of every host (for tests)."""
        return sum(count for (_, held, _), count in self._in_use.items() if held == name)
