"""Instances that follow demand: tritium's ``tritium.autoscale`` models (repo/autoscale.py).

For such a model the broker, not the instance groups, decides how many instances run and
on which host. It asks a host agent for a number of instances of the model (``SCALE``);
the agent starts or stops processes to match. The decisions:

* **up** when the oldest queued request has waited longer than ``target_queue_ms``
  (one instance at a time, then a cooldown), never above ``max``;
* **cold start** when a request finds no instance at all (``min=0`` after idleness): at
  once, without cooldown; the time until the first instance is ready is recorded;
* **down** when no request arrived for ``idle_s``, never below ``min``: an idle instance
  is drained first (no new batch) and then stopped;
* **placement** on the host with the most free capacity for the model's kind: CPU slots
  (``--max-cpu-instances`` per host) for KIND_CPU, its GPUs (one instance per GPU unless
  the instance group's count allows more) for KIND_GPU.

A cold start that fails (the model's initialize raises) answers the requests waiting for
it with the cause; the next request tries again after ``RETRY_AFTER_S``.

Nothing is decided while the broker's worker hosts have yet to register (``StartupHold.
awaits_hosts``): a new broker process learns from them which instances they still run, and
its requests wait for that rather than fail for want of a host or start an instance beside
one that is kept. The cold start they would have made is made once the hosts are there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tritium.model_config_proto import model_config_pb2

from tritium.broker.batcher import DynamicBatcher
from tritium.broker.registry import AgentRecord, ModelVersion, Registry, VersionState
from tritium.broker.startup_hold import StartupHold
from tritium.errors import Unavailable
from tritium.repo.autoscale import AutoscalePolicy
from tritium.protocol import Scale

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5.0    # after a failed cold start
NO_ROOM_REPEAT_S = 60.0
_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU


@dataclass(eq=False)
class ScaleState:
    """What the autoscaler asked of each host for one model version, and why it last acted."""

    targets: dict[bytes, int] = field(default_factory=dict)   # agent identity -> instances asked for
    last_request_ns: int = 0
    next_step_ns: int = 0
    cold_start_since_ns: int | None = None    # the first request that found no instance
    cold_start_deferred: bool = False         # a request found no instance while hosts were awaited
    retry_after_ns: int = 0
    no_room_said_ns: int = 0
    last_error: str = ""
    cold_starts: int = 0
    cold_start_ns_total: int = 0

    @property
    def total(self) -> int:
        return sum(self.targets.values())


class Autoscaler:
    def __init__(self, registry: Registry, send_backend: Callable[[list], None], scheduler,
                 clock: Callable[[], int], changed: Callable[[], None], hold: StartupHold | None = None) -> None:
        self.registry = registry
        self._changed = changed   # Membership.changed: what gateways see changed
        self._send_backend = send_backend
        self.scheduler = scheduler
        self._clock = clock
        self._hold = hold   # the broker's first seconds, when its hosts may yet register

    # -- the versions it scales ----------------------------------------------------------

    def versions(self) -> list[ModelVersion]:
        return [v for v in self.registry.epochs.values() if v.autoscale is not None]

    def start(self, version: ModelVersion) -> bool:
        """Place ``min`` instances of a version being loaded; True when it needs none to be ready."""
        version.scale = ScaleState(last_request_ns=self._clock())
        if not self._hosts_awaited():   # else evaluate() places them once one registers
            self._grow_to_minimum(version, "the model's minimum")
        return _policy(version).min_instances == 0

    def request_arrived(self, version: ModelVersion, now: int) -> Unavailable | None:
        """Note traffic; the error to answer with while a failed cold start waits to be retried."""
        scale = _state(version)
        scale.last_request_ns = now
        if scale.total == 0 and now < scale.retry_after_ns:
            return Unavailable(scale.last_error)
        if scale.total == 0 and not _serving(version):
            if self._hosts_awaited():
                scale.cold_start_deferred = True   # evaluate() makes it once the hosts are there
                return None
            return self._cold_start(version, now)
        return None

    def _cold_start(self, version: ModelVersion, since: int) -> Unavailable | None:
        """The first instance of a version that has none, for requests waiting since ``since``;
        the error to answer them with when no host has room."""
        if self._grow(version, "cold start: a request found no instance"):
            scale = _state(version)
            if scale.cold_start_since_ns is None:
                scale.cold_start_since_ns = since
            return None
        return Unavailable(f"no worker host has room for an instance of model '{version.name}' "
                           f"version {version.version} (see --max-cpu-instances)")

    def request_held(self, version: ModelVersion, now: int) -> None:
        """A request queued for the version while a new broker process takes it over: traffic all
        the same (nothing is placed meanwhile: the hosts' running instances are being adopted)."""
        _state(version).last_request_ns = now

    def coming(self, version: ModelVersion) -> bool:
        """Whether a version without instances can expect one: asked of a live host, or room for one."""
        scale = version.scale
        if scale is None:
            return True
        if self._hosts_awaited():
            return True
        live = self.registry.agents
        if any(count > 0 and agent in live and not live[agent].draining for agent, count in scale.targets.items()):
            return True
        if self._clock() < scale.retry_after_ns:
            return True   # request_arrived answers with the failed cold start's cause meanwhile
        return self._roomiest_host(version) is not None

    def placement_failed(self, version: ModelVersion, agent: bytes, message: str) -> None:
        """A host refused a SCALE (the model is not in its repository, it is draining)."""
        scale = version.scale
        if scale is not None and scale.targets.get(agent):
            scale.targets[agent] -= 1
            log.warning("model %s version %d: a host refused an instance: %s", version.name, version.version,
                        message)

    def adopt(self, version: ModelVersion, agent: bytes, running: int) -> int:
        """A host kept ``running`` instances across a broker restart: count them (within ``max``)."""
        scale = version.scale
        if scale is None:
            return 0
        others = scale.total - scale.targets.get(agent, 0)
        count = max(0, min(running, _policy(version).max_instances - others))
        scale.targets[agent] = count
        log.info("model %s version %d: keeping %d running instance(s) on a host across the broker restart",
                 version.name, version.version, count)
        self._changed()
        return count

    def agent_draining(self, agent: bytes) -> None:
        """A draining host's instances are going: place their replacements elsewhere at once."""
        for version in self.versions():
            if version.scale is not None and version.scale.targets.pop(agent, 0):
                version.scale.next_step_ns = 0

    # -- periodic decisions ----------------------------------------------------------------

    def evaluate(self) -> None:
        if self._hosts_awaited():
            return
        now = self._clock()
        for version in self.versions():
            if version.scale is None:
                continue
            if version.state == VersionState.LOADING and now >= version.scale.next_step_ns:
                self._grow_to_minimum(version, "the model's minimum (no host had room when it loaded)")
            elif version.state == VersionState.READY:
                self._evaluate(version, now)

    def _evaluate(self, version: ModelVersion, now: int) -> None:
        policy, scale = _policy(version), _state(version)
        if len(version.batcher):
            scale.last_request_ns = now
        if scale.cold_start_deferred:
            scale.cold_start_deferred = False
            if self._deferred_cold_start(version):
                return
        if scale.total < policy.min_instances and now >= scale.retry_after_ns:
            self._grow_to_minimum(version, "below the model's minimum (a host left?)")
            return
        if now < scale.next_step_ns:
            return
        batcher = _dynamic_batcher(version)
        waited_ms = (now - batcher.oldest_arrival_ns()) / 1e6 if len(batcher) else 0.0
        if waited_ms > policy.target_queue_ms and scale.total < policy.max_instances \
                and len(version.instances) >= scale.total:   # earlier scale-ups are serving already
            self._grow(version, f"the oldest request waited {waited_ms:.0f} ms (target {policy.target_queue_ms:g} ms)")
        elif (now - scale.last_request_ns) / 1e9 >= policy.idle_s and scale.total > policy.min_instances:
            self._shrink(version, f"no request for {policy.idle_s:g} s")

    def _deferred_cold_start(self, version: ModelVersion) -> bool:
        """The cold start requests asked for before the hosts registered, unless a kept instance
        serves them; whether it was made (or failed, its requests answered)."""
        if _state(version).total or _serving(version) or not len(version.batcher):
            return False
        if self._cold_start(version, _dynamic_batcher(version).oldest_arrival_ns()) is not None:
            self.scheduler.fail_unserviceable()   # no host has room: answered as on arrival
        return True

    def _hosts_awaited(self) -> bool:
        return self._hold is not None and self._hold.awaits_hosts(self._clock())

    # -- growing and shrinking -------------------------------------------------------------

    def _grow_to_minimum(self, version: ModelVersion, why: str) -> None:
        while _state(version).total < _policy(version).min_instances:
            if not self._grow(version, why):
                return

    def _grow(self, version: ModelVersion, why: str) -> bool:
        scale = _state(version)
        agent = self._roomiest_host(version)
        if agent is None:
            if self._clock() >= scale.next_step_ns:   # not every evaluation: once per cooldown
                if self._clock() >= scale.no_room_said_ns:   # and said once a minute at most
                    log.warning("model %s version %d: cannot add an instance (%s): no host has room",
                                version.name, version.version, why)
                    scale.no_room_said_ns = self._clock() + int(NO_ROOM_REPEAT_S * 1e9)
                scale.next_step_ns = self._clock() + int(_policy(version).cooldown_s * 1e9)
            return False
        scale.targets[agent.identity] = scale.targets.get(agent.identity, 0) + 1
        scale.next_step_ns = self._clock() + int(_policy(version).cooldown_s * 1e9)
        log.info("model %s version %d: %d -> %d instance(s), one more on host %s: %s", version.name,
                 version.version, scale.total - 1, scale.total, agent.host, why)
        self._tell(agent.identity, version)
        self._changed()
        return True

    def _shrink(self, version: ModelVersion, why: str) -> None:
        # Not one still answering a decoupled request after its execute returned (its threads'
        # or its coroutines' responses would be cut off).
        idle = [i for i in version.instances if not i.draining and not self.scheduler.holds_work([i])]
        if not idle:
            return
        instance = idle[-1]
        instance.draining = True
        scale = _state(version)
        scale.targets[instance.agent] = max(0, scale.targets.get(instance.agent, 0) - 1)
        scale.next_step_ns = self._clock() + int(_policy(version).cooldown_s * 1e9)
        host = self.registry.agents[instance.agent].host if instance.agent in self.registry.agents else "?"
        log.info("model %s version %d: %d -> %d instance(s), stopping %s on host %s: %s", version.name,
                 version.version, scale.total + 1, scale.total, instance.name, host, why)
        self._tell(instance.agent, version, stop=[instance.name])

    def _tell(self, agent: bytes, version: ModelVersion, stop: Sequence[str] = ()) -> None:
        message = Scale(version.assignment(), _state(version).targets.get(agent, 0), tuple(stop))
        self._send_backend([agent, message.encode()])

    def _roomiest_host(self, version: ModelVersion) -> AgentRecord | None:
        best, best_room = None, 0
        for agent in self.registry.agents.values():
            if agent.draining or not agent.serves(version.name):
                continue
            room = self._room(agent, version)
            if room > best_room:
                best, best_room = agent, room
        return best

    def _room(self, agent: AgentRecord, version: ModelVersion) -> int:
        group = version.definition.portable_config.instance_group
        if group and group[0].kind == _GPU:
            per_gpu = max(1, group[0].count)
            return len(agent.gpus) * per_gpu - _state(version).targets.get(agent.identity, 0)
        # The limit is for autoscaled instances: fixed instance groups are the operator's own choice.
        # A reload's new load may use the slots of the load it replaces (which stops when it is ready).
        scaled = sum(v.scale.targets.get(agent.identity, 0) for v in self.versions() if v.scale is not None
                     and not _gpu_model(v) and v is not version.replaces)
        return agent.cpu_slots - scaled

    # -- what happens to instances ----------------------------------------------------------

    def instance_joined(self, version: ModelVersion) -> None:
        scale = version.scale
        if scale is None or scale.cold_start_since_ns is None:
            return
        took = self._clock() - scale.cold_start_since_ns
        scale.cold_start_since_ns = None
        scale.cold_starts += 1
        scale.cold_start_ns_total += took
        log.info("model %s version %d: cold start done in %.0f ms", version.name, version.version, took / 1e6)

    def instance_failed(self, version: ModelVersion, agent: bytes, message: str) -> None:
        """An instance could not initialize: with none left, the waiting requests get the cause."""
        scale = version.scale
        if scale is None:
            return
        scale.targets[agent] = max(0, scale.targets.get(agent, 0) - 1)
        if version.instances or scale.total:
            return
        summary = message.split("\n", 1)[0]   # (a Python model's frames follow on the lines after it)
        scale.last_error = (f"cold start of model '{version.name}' version {version.version} failed: {summary}; "
                            f"retrying after {RETRY_AFTER_S:g} s")
        scale.retry_after_ns = self._clock() + int(RETRY_AFTER_S * 1e9)
        scale.cold_start_since_ns = None
        log.error("%s", scale.last_error)
        self.scheduler.fail_queued(version, Unavailable(scale.last_error))

    def agent_left(self, agent: bytes) -> None:
        for version in self.versions():
            if version.scale is not None:
                version.scale.targets.pop(agent, None)


def _policy(version: ModelVersion) -> AutoscalePolicy:
    """An autoscaled version's policy (versions() lists only those that have one)."""
    assert version.autoscale is not None
    return version.autoscale


def _state(version: ModelVersion) -> ScaleState:
    """An autoscaled version's scaling state, set by start() before anything else reads it."""
    assert version.scale is not None
    return version.scale


def _dynamic_batcher(version: ModelVersion) -> DynamicBatcher:
    batcher = version.batcher
    assert isinstance(batcher, DynamicBatcher)   # sequence models are never autoscaled (repo/autoscale.py)
    return batcher


def _serving(version: ModelVersion) -> bool:
    """Whether an instance of the version takes new batches (one being stopped does not)."""
    return any(not i.draining for i in version.instances)


def _gpu_model(version: ModelVersion) -> bool:
    group = version.definition.portable_config.instance_group
    return bool(group) and group[0].kind == _GPU
