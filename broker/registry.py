"""What the broker knows (data and lookups, no decisions): models and their versions, host agents,
and instance processes."""

from __future__ import annotations

import enum
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from tritium.broker.batcher import BatchingPolicy, DynamicBatcher
from tritium.broker.custom_metrics import CustomMetrics
from tritium.broker.ordering import ResponseOrder
from tritium.broker.queue_policy import QueuePolicy
from tritium.broker.sequences import SequenceBatcher, SequencePolicy
from tritium.broker.stats import ModelVersionStats
from tritium.input_checks import DeclaredInput, declared_inputs, runs_without_inputs
from tritium.repo import LoadStage, ModelDefinition
from tritium.repo.backends import ENSEMBLE_PLATFORM
from tritium.repo.autoscale import AutoscalePolicy, autoscale_policy
from tritium.repo.json_form import config_to_json_dict
from tritium.protocol import UNLOADED, Assignment, HostMetrics, ModelRow, Models, SharedMemoryRegion, VersionRow

if TYPE_CHECKING:
    from tritium.broker.autoscale import ScaleState


class VersionState(str, enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


class PendingRequest(msgspec.Struct, eq=False):
    """A request waiting in a queue or running in a batch; the broker never reads its frames."""

    client: bytes             # identity of the peer that asked: a gateway, or an instance (BLS)
    rid: int
    record: object            # the INFER record (a ZeroMQ frame), forwarded untouched
    external: list | None     # its external tensor frames (None: none)
    batch_size: int
    shape_key: object
    arrival_ns: int
    dispatch_ns: int = 0
    from_backend: bool = False  # asked on the backend socket (an instance's BLS request)
    retried: bool = False       # already sent again after the instance running it was lost
    level: int = 0              # priority level index (0 is Triton's level 1)
    deadline_ns: int = 0        # when its queue policy's timeout runs out; 0: never
    delayed: bool = False       # its DELAY timeout ran out: it waits behind requests still in time
    queued: bool = False        # in its version's queue right now
    order: int = 0              # arrival number, for preserve_ordering
    cache_key: bytes | None = None   # missed the response cache: its response goes in under this key
    correlation_id: int | str = 0   # the sequence it belongs to (0: none)
    flags: int = 0                  # sequence START (1) / END (2)
    traced: bool = False            # its INFER has a trace context: its batch carries its stamps
    cancelled: bool = False         # its client gave up while its instance held it (told CANCEL_RUNNING)
    responded: bool = False         # its first response left: the first-response histogram has it
    received_ns: int = 0            # its first arrival, when a reschedule moved arrival_ns (0: arrival_ns)


@dataclass(eq=False, slots=True)
class InstanceRecord:
    iid: bytes
    agent: bytes
    model: str
    version: int
    name: str
    credit: int
    inflight: dict[int, "Batch"] = field(default_factory=dict)
    execution_ns: float = 0.0   # moving average of how long a batch takes in the instance
    healthy: bool = True        # what the instance last reported (Python models' is_ready)
    epoch: int = 0              # the load (ModelVersion.epoch) it serves
    draining: bool = False      # it finishes what it holds and gets nothing new (its host stopping, an update, passive)
    kind: str = "CPU"           # CPU, GPU or MODEL: which capacity of its host it takes
    device: int = 0             # its GPU on its host (0 for CPU instances): where its rate-limiter resources count
    group: int = 0              # the index of its instance group in the config
    passive: bool = False       # of a passive group: initialized, kept draining, never given work


@dataclass(eq=False, slots=True)
class Batch:
    number: int
    version: "ModelVersion"
    instance: InstanceRecord
    requests: list[PendingRequest]
    batch_size: int
    finished: set[int] = field(default_factory=set)  # decoupled: requests that had their final response
    answered: set[int] = field(default_factory=set)  # decoupled: requests that had any response
    timings: tuple = (0, 0, 0)
    # Decoupled: final answers sent while the batch still executes, counted once its timings come
    # (record_outcome's arguments after the request), as Triton counts a request's compute times.
    held_outcomes: list | None = None

    def hold_outcome(self, request: PendingRequest, ok: bool, now: int, cancelled: bool) -> None:
        if self.held_outcomes is None:
            self.held_outcomes = []
        self.held_outcomes.append((request, ok, now, cancelled))

    def record_held_outcomes(self, failed: bool = False) -> None:
        """The batch has its timings (or will have none: its instance is gone). ``failed``: its
        execute raised, which fails the requests it answered before too, as Triton counts them."""
        held, self.held_outcomes = self.held_outcomes, None
        for request, ok, now, cancelled in held or ():
            self.record_outcome(request, ok and not failed, now, cancelled)

    def record_outcome(self, request: PendingRequest, ok: bool, now: int, cancelled: bool = False) -> None:
        """A request of this batch had its (final) answer: its version's statistics count it
        (``cancelled``: a failure that is its client's cancellation, answered CANCELLED)."""
        if ok:
            self.record_successes([request], now)
        else:
            self.version.stats.record_failure(now - request.arrival_ns, "CANCELED" if cancelled else "BACKEND")

    def record_successes(self, requests: list[PendingRequest], now: int) -> None:
        """``record_outcome`` of each of ``requests``, all answered at ``now`` with success, counted
        at once (a batch's answers are the broker's busiest path)."""
        stats = self.version.stats
        if stats.histogram_counts:
            for request in requests:
                first_response(self.version, request, now)
        total_ns = queue_ns = inferences = 0
        for request in requests:
            total_ns += now - request.arrival_ns
            queue_ns += request.dispatch_ns - request.arrival_ns
            inferences += request.batch_size
        stats.record_successes(len(requests), total_ns, queue_ns, inferences, self.timings)
        if stats.summaries is not None:   # (only with --metrics-config summary_latencies=true)
            clock = time.monotonic_ns()
            for request in requests:
                stats.summaries.observe_success(now - request.arrival_ns, request.dispatch_ns - request.arrival_ns,
                                                self.timings, clock)


def first_response(version: "ModelVersion", request: PendingRequest, now: int) -> None:
    """A response to ``request`` leaves: the first-response histogram counts its first, once."""
    if not request.responded:
        request.responded = True
        version.stats.observe_first_response(now - (request.received_ns or request.arrival_ns))


@dataclass(eq=False)
class ModelVersion:
    """One load of one version of a model; a reload makes a new one (a new ``epoch``)."""

    name: str
    version: int
    definition: ModelDefinition
    epoch: int = 0
    replaces: "ModelVersion | None" = None              # the version it takes over from, once READY
    files: dict | None = None                           # load API file overrides, shipped to agents
    identity: str = ""                                  # what its instances run (load_identity)
    state: VersionState = VersionState.LOADING
    reason: str = ""
    stats: ModelVersionStats = field(default_factory=ModelVersionStats)
    instances: list[InstanceRecord] = field(default_factory=list)
    passive_instances: int = 0   # of ``instances``, those of passive groups (membership keeps both)
    placed: set[str] = field(default_factory=set)       # instance names announced by agents
    placed_on: dict[str, bytes] = field(default_factory=dict)   # instance name -> the agent that announced it
    awaited: dict[str, int] = field(default_factory=dict)       # lost instances coming back: name -> deadline ns
    seen_ready: set[str] = field(default_factory=set)   # instance names that said hello once
    load_started_ns: int = field(default_factory=time.monotonic_ns)
    load_seconds: float | None = None                   # how long it took to become READY
    load_attempt: int = 0                               # loads of this version tried before it (--model-load-retry-count)
    batcher: DynamicBatcher[PendingRequest] | SequenceBatcher[InstanceRecord] = field(init=False)
    # Moving averages of a batch's time in its instance per request: batches of one request, and
    # larger ones (whether batching saves anything: Scheduler._share).
    execution_alone_ns: float = 0.0
    execution_grouped_ns: float = 0.0
    ordering: ResponseOrder | None = field(init=False)   # preserve_ordering: responses leave in order
    caches: bool = field(init=False)                     # response_cache { enable: true }
    autoscale: AutoscalePolicy | None = field(init=False)    # tritium.autoscale; None: fixed instances
    scale: ScaleState | None = None                    # the autoscaler's targets, once it started
    variable_shapes: bool = field(init=False)
    ragged_inputs: frozenset[str] = field(init=False)   # inputs whose shapes need not match in a batch
    declared_inputs: dict[str, DeclaredInput] = field(init=False)   # what a BLS call's inputs are checked against
    declared_outputs: frozenset[str] = field(init=False)   # and the outputs it asks for
    runs_without_inputs: bool = field(init=False)   # (tritium/input_checks.py)
    stateful: bool = field(init=False)   # its requests form sequences bound to instance slots (sequence_batching)
    iterative: bool = field(init=False)  # iterative_sequence: its model may release requests to run again
    # Triton's Python backend counts every execution in the statistics; its other backends only
    # those with a request that succeeded.
    counts_failed_executions: bool = field(init=False)

    def __post_init__(self) -> None:
        config = self.definition.config
        self.stateful = config.HasField("sequence_batching")   # asked for every batch: read once
        self.iterative = self.stateful and config.sequence_batching.iterative_sequence
        self.counts_failed_executions = self.definition.runs_python
        queue_policy = QueuePolicy.from_config(config)
        self.batcher = SequenceBatcher(SequencePolicy.from_config(config)) if self.stateful \
            else DynamicBatcher(BatchingPolicy.from_config(config), queue_policy)
        decoupled = config.model_transaction_policy.decoupled
        self.ordering = ResponseOrder() if queue_policy.preserve_ordering and not decoupled else None
        # Triton caches neither decoupled nor sequence models' responses.
        self.caches = config.response_cache.enable and not decoupled and not self.stateful
        self.autoscale = autoscale_policy(config)
        self.ensemble = config.platform == ENSEMBLE_PLATFORM   # run by the broker, no instances
        # Only models with a variable non-batch dim (or optional inputs) need shape keys.
        self.variable_shapes = any(
            -1 in list(t.dims) or t.optional or t.allow_ragged_batch for t in config.input)
        # allow_ragged_batch: a Python model gets each request's own arrays, so requests whose ragged
        # inputs differ in shape share a batch, as in Triton. The stacking backends join a batch's
        # rows into one tensor, which needs Triton's batch_input (not supported): they keep to one shape.
        self.ragged_inputs = frozenset(t.name for t in config.input if t.allow_ragged_batch) \
            if self.definition.runs_python else frozenset()
        self.declared_inputs = declared_inputs(config)
        self.declared_outputs = frozenset(t.name for t in config.output)
        self.runs_without_inputs = runs_without_inputs(config.platform, len(config.sequence_batching.control_input),
                                                       len(config.sequence_batching.state))

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)

    def pending_requests(self) -> int:
        """Requests not yet executing: those queued here, and those an instance holds behind the
        batch it runs (its second credit), which Triton would still have in its queue."""
        waiting = len(self.batcher)
        for instance in list(self.instances):   # (read from the metrics thread: copies, not views)
            waiting += sum(len(batch.requests) for batch in list(instance.inflight.values())[1:])
        return waiting

    def assignment(self) -> Assignment:
        """What a host agent needs to start instances of this load: its config and shipped files."""
        return Assignment(self.name, self.version, self.epoch, config_to_json_dict(self.definition.portable_config),
                          self.files or None, self.identity or None)

    @property
    def healthy(self) -> bool:
        """Triton asks is_ready() of every instance; one that says no makes the model not ready.

        A serving version with no instance left (its hosts lost or restarting) is not ready either.
        """
        if not self.serving and self.state == VersionState.READY:
            return self.autoscale is not None and self.autoscale.min_instances == 0   # scaled to zero on purpose
        return all(instance.healthy for instance in self.instances if not instance.passive)

    @property
    def serving(self) -> bool:
        """Whether it has an instance that may be given work (a passive one never is)."""
        return len(self.instances) > self.passive_instances


    @property
    def decoupled(self) -> bool:
        return self.definition.config.model_transaction_policy.decoupled


_VERSION_POLICY_KEYS = ("version_policy", "versionPolicy")


def load_identity(config_json: dict, files: dict | None, fingerprint: tuple) -> str:
    """What an instance of a load runs: its config, shipped files and the files of its folder.

    A host agent reports it for each running instance, so that a broker started again keeps
    (adopts) the instances whose load it would start anyway, rather than loading them again.
    """
    # Which versions load is the model's business, not what one version's instance runs.
    config_json = {key: value for key, value in config_json.items() if key not in _VERSION_POLICY_KEYS}
    digest = hashlib.sha256(json.dumps(config_json, sort_keys=True).encode())
    for path, content in sorted((files or {}).items()):
        digest.update(path.encode() + b"\0" + bytes(content))
    digest.update(repr(fingerprint).encode())
    return digest.hexdigest()[:32]


@dataclass(eq=False)
class ModelRecord:
    """One model name: its versions, or the error that kept it from loading at all."""

    name: str
    error: str | None = None
    error_stage: LoadStage = LoadStage.LOAD   # where its load failed
    versions: dict[int, ModelVersion] = field(default_factory=dict)   # the versions requests go to
    version_errors: dict[int, str] = field(default_factory=dict)
    config_json: dict | None = None
    labels: dict | None = None          # classification labels per output, for the gateways
    unloaded: bool = False              # unloaded through the API: unknown to clients, kept for the index
    unloaded_versions: set[int] = field(default_factory=set)
    last_error: str | None = None       # a reload that failed while the old versions kept serving
    fingerprint: tuple | None = None    # the repository files this load read (poll mode, and a plain load)
    override: tuple | None = None       # the load API's (config, files) it was loaded with: a plain load keeps them

    @property
    def rejected(self) -> bool:
        """Its config failed where Triton checks it while polling the repository, and nothing of it
        serves: in Triton such a model never entered its lifecycle, so it is listed by name only,
        unknown to requests, and not counted by strict readiness."""
        return self.error is not None and not self.versions and self.error_stage is LoadStage.CONFIG

    @property
    def known_to_requests(self) -> bool:
        """Requests for it hear of it ("has no available versions") rather than "is not found"."""
        return not self.rejected or bool(self.unloaded_versions)

    @property
    def failed_in_lifecycle(self) -> bool:
        """A failure Triton's lifecycle holds (past its polling): a later refused config leaves it standing."""
        return not self.unloaded and bool(
            self.version_errors or (self.error is not None and self.error_stage is not LoadStage.CONFIG))


@dataclass(eq=False)
class AgentRecord:
    identity: bytes
    host: str
    gpus: tuple[int, ...]
    models: tuple[str, ...] | None   # None: every model
    draining: bool = False           # the host is stopping (it sent DRAIN)
    cpu_slots: int = 0               # --max-cpu-instances: room for autoscaled CPU instances
    working: frozenset[bytes] = frozenset()   # its instances whose processes run, as its last heartbeat said
    working_at: float = 0.0                    # when that heartbeat came

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models


class Registry:
    """Models, agents and instances, with the lookups the scheduler needs on the hot path.

    Its writers: ``ModelLifecycle`` (models, versions, epochs), ``Membership`` (agents,
    instances, host metrics, the generation), ``Control`` (shared memory regions).
    """

    def __init__(self) -> None:
        self.models: dict[str, ModelRecord] = {}
        self.versions: dict[tuple[str, int], ModelVersion] = {}   # where requests go: one per version
        self.epochs: dict[int, ModelVersion] = {}                  # every live load: loading, serving, draining
        self.agents: dict[bytes, AgentRecord] = {}
        self.instances: dict[bytes, InstanceRecord] = {}
        self.host_metrics: dict[str, HostMetrics] = {}   # host name -> the agent's last HOST_METRICS
        self.tensor_pools: dict[bytes, list] = {}   # gateway or instance -> its shared tensor pools, last reported
        self.custom_metrics = CustomMetrics()       # the Python models' own metric families, over their instances
        self.shared_memory: dict[str, SharedMemoryRegion] = {}  # client shm regions, which every gateway maps
        self.trace_settings: dict | None = None   # Triton's trace settings, which every gateway samples with
        self.generation = 0  # what gateways see changed when it moves: only Membership.changed moves it
        self.startup_begun = False     # the startup loads have begun (BrokerServer.load_repository)
        self._startup_settled = False  # ... and all settled once (later loads do not count)
        self.startup_failure: str | None = None   # a model repository it could not read at startup

    def set_state(self, version: ModelVersion, state: VersionState, reason: str = "") -> None:
        if state == VersionState.READY and version.load_seconds is None:
            version.load_seconds = (time.monotonic_ns() - version.load_started_ns) / 1e9
        version.state, version.reason = state, reason

    def knows(self, model: str) -> bool:
        """Whether requests for ``model`` hear of it ("has no available versions") rather than "is not
        found": the gateways' model table holds the same records (table())."""
        record = self.models.get(model)
        return record is not None and record.known_to_requests

    def latest_ready(self, model: str) -> ModelVersion | None:
        record = self.models.get(model)
        if record is None:
            return None
        latest, latest_number = None, -1
        for number, version in record.versions.items():   # asked per request: no sorting
            if number > latest_number and version.state is VersionState.READY:
                latest, latest_number = version, number
        return latest

    def resolve_step(self, model: str, number: int) -> ModelVersion | None:
        """The version an ensemble step goes to: ``number``, or for -1 the latest ready one."""
        if number < 0:
            return self.latest_ready(model)
        return self.versions.get((model, number))

    def healthy(self, version: ModelVersion) -> bool:
        """Whether a version can serve; an ensemble can while every model its steps use can."""
        if not version.ensemble:
            return version.healthy
        for step in version.definition.config.ensemble_scheduling.step:
            member = self.resolve_step(step.model_name, step.model_version)
            if member is None or member.state != VersionState.READY or not self.healthy(member):
                return False
        return True

    def loading_done(self) -> bool:
        """No first load in progress; a reload loading beside a serving version does not count."""
        return all(v.state != VersionState.LOADING or v.replaces is not None for v in self.epochs.values())

    def server_ready(self) -> bool:
        """Triton's strict readiness: every loaded model version is READY; unloaded ones do not count."""
        loaded = [r for r in self.models.values() if not r.unloaded and not r.rejected]
        return (all(r.error is None and not r.version_errors for r in loaded)
                and self.loading_done()
                and all(v.state == VersionState.READY and self.healthy(v) for v in self.versions.values()))

    def started(self) -> bool:
        """Whether the models loaded at startup have all settled, ready or failed: Triton serves
        its endpoints only from then on, which non-strict readiness stands for."""
        if not self._startup_settled and self.startup_begun and self.loading_done():
            self._startup_settled = True
        return self._startup_settled

    def table(self) -> Models:
        """The model table gateways cache: states, reasons and configs.

        An unloaded model stays in it without a config, so that requests for it get
        Triton's "has no available versions" rather than "is not found".
        """
        models = []
        for record in self.models.values():
            if not record.known_to_requests:
                continue   # unknown to requests, as in Triton: "Request for unknown model: 'm' is not found"
            rows = {number: VersionRow(number, VersionState.UNAVAILABLE.value, UNLOADED, False)
                    for number in record.unloaded_versions}
            if not record.unloaded:
                for number, version in record.versions.items():
                    rows[number] = VersionRow(number, version.state.value, version.reason, self.healthy(version))
                for number, error in record.version_errors.items():
                    rows[number] = VersionRow(number, VersionState.UNAVAILABLE.value, error, False)
            versions = tuple(rows[number] for number in sorted(rows))
            if record.unloaded:
                models.append(ModelRow(record.name, None, versions, None, None))
            else:
                models.append(ModelRow(record.name, record.error, versions, record.config_json, record.labels))
        return Models(self.generation, tuple(models), self.server_ready(), tuple(self.shared_memory.values()),
                      self.trace_settings, started=self.started(), failed=self.startup_failure)
