"""Keeping a host's instances across a broker restart (adoption).

A broker started again knows nothing of the instances its predecessor placed. A host
agent that registers with it lists the instances it still runs (``running`` in its
HELLO). The broker offers each of them to the load it would assign anyway: same model,
version and load identity (``ModelVersion.identity``: config, shipped files, folder
contents). The agent keeps the offered instances its plan for that load names, reports
them in its PLACED (``adopted``), and stops the rest. The broker then tells each kept
instance the new boot id and epoch (a RESET with ``boot`` and ``e``); the instance frees
its sequence slots and says HELLO again. No process restarts, no model loads again.

An instance of the previous broker that heartbeats before its agent registered is left
alone (its agent is about to list it); one the agent listed waits for the decision; only
one nobody claims is told RESET without an epoch, which makes it exit.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from tritium.broker.registry import ModelVersion
from tritium.protocol import Assignment, Reset, messages


@dataclass(frozen=True)
class RunningInstance:
    """One instance a host agent still runs when it registers, as its HELLO describes it."""

    iid: bytes
    agent: bytes
    model: str
    version: int
    identity: str     # the load identity it was started for
    key: str
    kind: str
    device: int
    scaled: bool      # started for an autoscaled model (SCALE), not from instance groups

    @classmethod
    def announced(cls, agent: bytes, entry: messages.RunningInstance) -> "RunningInstance":
        return cls(entry.iid.encode(), agent, entry.model, entry.version, entry.identity, entry.key,
                   entry.instance_kind, entry.device, entry.scaled)

    def fits(self, version: ModelVersion) -> bool:
        return (self.model == version.name and self.version == version.version and bool(self.identity)
                and self.identity == version.identity and self.scaled == (version.autoscale is not None)
                and not version.files)


class Adoption:
    """Instances announced by their agents, and those adopted that have yet to say HELLO again."""

    def __init__(self) -> None:
        self._announced: dict[bytes, RunningInstance] = {}   # iid -> listed by its agent, not decided
        self._adopting: dict[bytes, tuple[bytes, ModelVersion]] = {}   # iid -> (agent, the load it joins)

    def announce(self, agent: bytes, running: tuple[messages.RunningInstance, ...] | None) -> None:
        self.forget_agent(agent)
        for entry in running or ():
            instance = RunningInstance.announced(agent, entry)
            self._announced[instance.iid] = instance

    def candidates(self, version: ModelVersion, agent: bytes) -> list[RunningInstance]:
        return [i for i in self._announced.values() if i.agent == agent and i.fits(version)]

    def offer(self, assignment: Assignment, version: ModelVersion, agent: bytes) -> Assignment:
        """``assignment`` with the running instances the agent may keep for it."""
        offered = tuple(i.iid.decode() for i in self.candidates(version, agent))
        return msgspec.structs.replace(assignment, adopt=offered) if offered else assignment

    def placed(self, version: ModelVersion, adopted: dict) -> list[bytes]:
        """The agent kept these instances for ``version``: the iids to tell the new boot and epoch."""
        iids = []
        for iid in (str(i).encode() for i in (adopted or {}).values()):
            instance = self._announced.pop(iid, None)
            if instance is not None and instance.fits(version):
                self._adopting[iid] = (instance.agent, version)
                iids.append(iid)
        return iids

    def rejoin(self, iid: bytes, boot: int) -> Reset | None:
        """The RESET that makes an adopted instance say HELLO again; None if it is not adopted."""
        adopting = self._adopting.get(iid)
        return None if adopting is None else Reset(boot, adopting[1].epoch)

    def pending(self, iid: bytes) -> bool:
        """Listed by its agent, adoption not decided yet: the instance must not be told to exit."""
        return iid in self._announced

    def forget(self, iid: bytes) -> None:
        """It said HELLO again, or it exited."""
        self._adopting.pop(iid, None)
        self._announced.pop(iid, None)

    def forget_agent(self, agent: bytes) -> None:
        for iid in [i for i, r in self._announced.items() if r.agent == agent]:
            del self._announced[iid]
        for iid in [i for i, (owner, _) in self._adopting.items() if owner == agent]:
            del self._adopting[iid]
