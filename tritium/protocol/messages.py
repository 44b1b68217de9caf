"""Every message kind of the wire protocol as a type: the one place a wire header is built or read.

Each kind is a frozen ``msgspec.Struct`` whose fields name their short wire key
(``field(name="m")``) and say what they are (``Meta(description=...)``, which the docs table
shows). The header's ``k`` is the struct's tag. ``encode(inline)`` gives the record (msgspec packs
the header: cheaper than building a dict for msgpack); ``read_record(frame)`` decodes a record's
header straight into its type, validated (a malformed one raises ``ProtocolError`` naming the
field). ``to_wire()`` / ``from_wire()`` give and read the header as the plain values msgpack
carries. docs/architecture.md's protocol tables are generated from these types
(``python -m tritium.protocol`` prints them), so the two cannot disagree.

Adding an optional field to a kind is one line in its class, e.g. on ``Infer``::

    trace: Annotated[int, doc("trace flags")] = field(default=0, name="tf")

A field at its default is left off the wire (``omit_defaults``), so peers that do not know it
never see it, and it reads back as the default when absent.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta, field

from tritium.errors import ProtocolError, TritiumError
from tritium.protocol.framing import Kind, frame_record, split_record

__all__ = [
    "MESSAGES", "read_record", "error_record", "Message", "ControlOp", "Role",
    "RunningInstance", "Assignment", "ScaledAssignment", "LoadRef", "UNLOADED", "VersionRow", "ModelRow", "SharedMemoryRegion",
    "Hello", "Refused", "Reset", "Heartbeat", "Infer", "Response", "Cancel", "Batch", "BatchDone", "ResponsePart",
    "CancelRunning", "MetricsAsk",
    "Control", "ControlArgs", "ControlArgsUnion", "CONTROL_ARGS", "ModelsQuery", "StatsQuery", "StatusQuery",
    "IndexQuery", "LoadModel", "UnloadModel", "ChangeLogSettings", "RegisterRegion", "UnregisterRegion",
    "TraceSettingsQuery", "TraceDone",
    "ControlReply", "Models", "LogSettings", "Assign", "Unassign", "Scale", "Placed",
    "InstanceFailed", "InstanceExited", "InstanceHealth", "HostMetrics", "Drain", "Drained",
]


def doc(text: str) -> Meta:
    """What a field is, for docs/architecture.md's protocol table."""
    return Meta(description=text)


# Errors cross processes in one shape everywhere: {code, message} (tritium/errors.py).
def _encode_custom(value: Any) -> Any:
    if isinstance(value, TritiumError):
        return value.to_wire()
    raise NotImplementedError(type(value))


def _decode_custom(kind: type, value: Any) -> Any:
    if kind is TritiumError and isinstance(value, dict):
        return TritiumError.from_wire(value)
    raise NotImplementedError(kind)


_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_custom)


class Record(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """A record nested in messages (a table row, an assignment)."""

    def to_wire(self) -> Any:
        """What the receiving side decodes (the header of a message)."""
        return msgspec.msgpack.decode(_encoder.encode(self))

    @classmethod
    def from_wire(cls, wire: Any) -> Any:
        try:
            return msgspec.convert(wire, cls, dec_hook=_decode_custom)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"malformed {cls.__name__} record: {exc}") from None


class Message(Record, frozen=True, omit_defaults=True, gc=False, tag_field="k"):
    """A message kind; its tag is the header's ``k``."""

    DIRECTION = ""   # who sends it to whom, for the docs table
    FOLLOWS = ""     # the frames that follow its record
    external = 0     # external frames after the record (INFER and RESPONSE say how many: their field x)

    @property
    def kind(self) -> Kind:
        return Kind(_tag(type(self)))

    def encode(self, inline: Iterable = ()) -> bytes:
        """The record: this header, then the inline tensor bytes."""
        return frame_record(_encoder.encode(self), inline)


def read_record(frame) -> tuple[Message, memoryview, int]:
    """(the typed header, the record's bytes, offset of its first inline tensor); ProtocolError if
    malformed. msgspec decodes the header bytes straight into its type: no dict in between."""
    view, end = split_record(frame)
    try:
        return _decoder.decode(view[4:end]), view, end
    except msgspec.DecodeError as exc:   # ValidationError included
        raise ProtocolError(f"malformed record header: {exc}") from None


class ControlOp(str, enum.Enum):
    """What a CONTROL asks of the broker."""

    MODELS = "models"                  # the model table
    STATS = "stats"                    # Triton's inference statistics (args: model, version)
    STATUS = "status"                  # loading done, readiness, failures
    INDEX = "index"                    # the repository index (args: ready)
    LOAD = "load"                      # answered once loaded (args: model, parameters)
    UNLOAD = "unload"                  # args: model, unload_dependents
    LOG_SETTINGS = "log_settings"      # args: changes
    SHM_REGISTER = "shm_register"      # args: name, key, offset, byte_size
    SHM_UNREGISTER = "shm_unregister"  # args: name (absent: every region)
    TRACE_SETTINGS = "trace_settings"  # Triton's trace settings (args: model, changes)
    TRACE_DONE = "trace_done"          # a gateway wrote a trace (args: model), for trace_count


class Role(str, enum.Enum):
    GATEWAY = "gateway"
    AGENT = "agent"
    INSTANCE = "instance"


# -- records inside messages ------------------------------------------------------------


class RunningInstance(Record, frozen=True):
    """An instance a registering agent still runs, which a restarted broker may keep."""

    iid: Annotated[str, doc("instance id")]
    model: Annotated[str, doc("model")] = field(name="m")
    version: Annotated[int, doc("version")] = field(name="v")
    identity: Annotated[str, doc("load identity")] = field(name="id")
    key: Annotated[str, doc("instance key")]
    name: Annotated[str, doc("instance name")]
    instance_kind: Annotated[str, doc("CPU or GPU")] = field(name="kind")
    device: Annotated[int, doc("device id")]
    credit: Annotated[int, doc("batches it may hold")]
    scaled: Annotated[bool, doc("started by autoscaling")]
    pid: Annotated[int, doc("process id")]


class Assignment(Record, frozen=True):
    """One load a host agent is to run."""

    model: Annotated[str, doc("model")] = field(name="m")
    version: Annotated[int, doc("version")] = field(name="v")
    epoch: Annotated[int, doc("the load's epoch")] = field(name="e")
    config: Annotated[dict, doc("the host-independent config as Triton's JSON")]
    files: Annotated[dict | None, doc("the load API's file overrides")] = None
    identity: Annotated[str | None, doc("the load identity")] = field(default=None, name="id")
    adopt: Annotated[tuple[str, ...], doc("running instances (iids) it may keep for this load")] = ()
    update: Annotated[bool, doc("the serving load's instance groups changed: keep the running instances the "
                                "new groups match, start the others, list the rest as leaving")] = False


class ScaledAssignment(Record, frozen=True):
    assignment: Annotated[Assignment, doc("the load")]
    count: Annotated[int, doc("instances it keeps running")]


class LoadRef(Record, frozen=True):
    model: Annotated[str, doc("model")] = field(name="m")
    version: Annotated[int, doc("version")] = field(name="v")
    epoch: Annotated[int, doc("the load's epoch")] = field(name="e")
    instances: Annotated[tuple[str, ...], doc("only these instance keys of it (none: all)")] = ()


UNLOADED = "unloaded"   # the reason of a version unloaded on purpose: a model Triton still knows


class VersionRow(Record, frozen=True, array_like=True):
    version: Annotated[int, doc("version")]
    state: Annotated[str, doc("READY, LOADING, UNAVAILABLE, ...")]
    reason: Annotated[str, doc("why it is in that state")]
    healthy: Annotated[bool, doc("every instance's is_ready()")]


class ModelRow(Record, frozen=True):
    """One model of the table gateways keep (all its versions)."""

    name: Annotated[str, doc("model name")]
    error: Annotated[str | None, doc("why it failed to load")]
    versions: Annotated[tuple[VersionRow, ...], doc("its versions")]
    config: Annotated[dict | None, doc("its config as Triton's JSON (none once unloaded)")]
    labels: Annotated[dict | None, doc("classification labels per output")]


class SharedMemoryRegion(Record, frozen=True):
    name: Annotated[str, doc("region name")]
    key: Annotated[str, doc("shared memory key")]
    offset: Annotated[int, doc("offset into it")]
    byte_size: Annotated[int, doc("bytes")]


# -- connecting -------------------------------------------------------------------------


class Hello(Message, frozen=True, tag=int(Kind.HELLO)):
    """First message of a peer: who it is."""

    DIRECTION = "any peer -> broker"

    role: Annotated[Role, doc("`gateway`, `agent` or `instance`")]
    protocol_version: Annotated[int, doc("protocol version")] = field(name="pv")
    heartbeat_s: Annotated[float | None, doc("its heartbeat interval")] = field(default=None, name="hb")
    host: Annotated[str | None, doc("agent: host name")] = None
    gpus: Annotated[tuple[int, ...] | None, doc("agent: its GPUs")] = None
    models: Annotated[tuple[str, ...] | None, doc("agent: the models it serves (none: any)")] = None
    cpu_slots: Annotated[int | None, doc("agent: CPU instances it runs at most")] = None
    running: Annotated[tuple[RunningInstance, ...] | None,
                       doc("agent: the instances it still runs, when registering with a restarted broker")] = None
    agent: Annotated[str | None, doc("instance: its agent")] = None
    model: Annotated[str | None, doc("instance: model")] = field(default=None, name="m")
    version: Annotated[int | None, doc("instance: version")] = field(default=None, name="v")
    epoch: Annotated[int | None, doc("instance: the load's epoch")] = field(default=None, name="e")
    boot: Annotated[int | None, doc("instance: the broker process it was started for")] = None
    name: Annotated[str | None, doc("instance: instance key")] = None
    instance_kind: Annotated[str | None, doc("instance: CPU or GPU")] = field(default=None, name="kind")
    credit: Annotated[int | None, doc("instance: batches it may hold at once")] = None
    device: Annotated[int | None, doc("instance: its GPU on its host (0 for CPU instances)")] = field(
        default=None, name="dev")
    group: Annotated[int | None, doc("instance: the index of its instance group in the config")] = None
    passive: Annotated[bool | None, doc("instance: of a passive instance group (initialized, never given a "
                                        "request)")] = None
    warmed: Annotated[list | None, doc("instance, its first HELLO: the warmup executions it ran, [requests, "
                                       "compute_input_ns, compute_infer_ns, compute_output_ns] each")] = None


class Refused(Message, frozen=True, tag=int(Kind.REFUSED)):
    DIRECTION = "broker -> peer"

    reason: Annotated[str, doc("why (wrong protocol version, unknown role)")]


class Reset(Message, frozen=True, tag=int(Kind.RESET)):
    """"I do not know you": say HELLO again (an instance without `e` exits instead). Repeated
    to an instance that does not answer, on its heartbeat socket too: its main thread may wait
    in a model's execute on a BLS call the previous broker process held, and the heartbeat
    thread has the BLS socket ask the new process which calls it got (HEARTBEAT `nr`)."""

    DIRECTION = "broker -> agent, instance"

    boot: Annotated[int | None, doc("agent: register again with this broker process; instance: the "
                                              "process that keeps it")] = None
    epoch: Annotated[int | None, doc("instance: the restarted broker keeps it, as this load's")] = field(
        default=None, name="e")


class Heartbeat(Message, frozen=True, tag=int(Kind.HEARTBEAT)):
    """Every heartbeat interval; any message counts as a sign of life."""

    DIRECTION = "both ways"

    boot: Annotated[int | None, doc("broker: its process's id; gateway, with `hd`: the draining process's")] = None
    heartbeat_s: Annotated[float | None, doc("the sender's interval")] = field(default=None, name="hb")
    role: Annotated[Role | None, doc("gateway, agent")] = None
    protocol_version: Annotated[int | None, doc("gateway: so that a new broker process can register it")] = field(
        default=None, name="pv")
    iid: Annotated[str | None, doc("an instance's heartbeat thread: its instance")] = None
    agent: Annotated[str | None, doc("instance: its agent")] = None
    joined: Annotated[bool, doc("instance: it has said HELLO")] = False
    pools: Annotated[list[tuple[str, int, int, int, int]] | None, doc(
        "gateway, instance: its shared tensor pools, each (kind, size, bytes in use, tensors sent as bytes "
        "for want of room, times the pool was made anew)")] = field(default=None, name="pl")
    working: Annotated[list[str] | None, doc(
        "agent: its instances whose processes run (neither exited nor stopped by a signal): one of them silent on "
        "its own heartbeats is kept (its model may hold Python's GIL in a long call)")] = field(
        default=None, name="wk")
    custom_metrics: Annotated[list | None, doc(
        "instance: its Python model's custom metrics, each family [name, description, kind (0 counter, 1 gauge, "
        "2 histogram), [[labels, state]]], the state what this instance did to the series: a counter's [total], a "
        "gauge's [sets, last set, increments since], a histogram's [bounds, counts, sum]")] = field(
        default=None, name="cm")
    metrics_for: Annotated[int | None, doc("instance: the METRICS_ASK this heartbeat answers (its number)")] = field(
        default=None, name="ma")
    next_rid: Annotated[int | None, doc(
        "gateway, or an instance's BLS socket once it heard of a new broker process: the lowest rid it has not "
        "sent yet (every request it sent before this heartbeat has a lower one)")] = field(
        default=None, name="nr")
    since: Annotated[int | None, doc(
        "broker, when it registers a gateway that heartbeats or answers a BLS socket's `nr`: the first rid this "
        "broker process heard from it (a request or a heartbeat's `nr`); the peer's requests below it went to a "
        "previous process")] = field(
        default=None, name="sn")
    draining: Annotated[bool, doc(
        "broker: it drains (SIGTERM) and exits once done; a gateway holds its new requests for the next broker "
        "process")] = field(default=False, name="dr")
    holding: Annotated[bool, doc(
        "gateway: it holds its new requests, having heard the broker drain (what it sent before has arrived)")] = field(
        default=False, name="hd")


# -- inference (the hot path) -----------------------------------------------------------


class Infer(Message, frozen=True, tag=int(Kind.INFER)):
    """One inference request (also from an instance: a model calling another model)."""

    DIRECTION = "gateway -> broker -> instance"
    FOLLOWS = "input tensors"

    rid: Annotated[int, doc("request number of the sender; echoed in the RESPONSE")]
    model: Annotated[str, doc("model")] = field(name="m")
    inputs: Annotated[list, doc("tensor descriptors")]
    version: Annotated[int | None, doc("concrete version (the gateway resolves latest)")] = field(
        default=None, name="v")
    batch_size: Annotated[int | None, doc("batch size of the request")] = field(default=None, name="bs")
    request_id: Annotated[str | None, doc("the client's request id")] = field(default=None, name="id")
    outputs: Annotated[list | None, doc("requested output names (absent: all)")] = None
    params: Annotated[dict | None, doc("request parameters")] = None
    sequence_id: Annotated[int | str | None, doc("sequence (correlation) id")] = field(default=None, name="cid")
    sequence_flags: Annotated[int, doc("sequence flags: 1 START, 2 END")] = field(default=0, name="sf")
    external: Annotated[int, doc("external frames that follow")] = field(default=0, name="x")
    trace: Annotated[bytes | None, doc("traced requests: the trace id (16 bytes) and its model span's id (8)")] = field(
        default=None, name="tr")
    trace_tensors: Annotated[bool, doc("traced requests: its ensemble steps' and BLS calls' tensors are traced too "
                                       "(trace level TENSORS)")] = field(default=False, name="tt")
    one_answer: Annotated[bool, doc("a BLS call made without decoupled=True: a decoupled model refuses it")] = field(
        default=False, name="one")


class Response(Message, frozen=True, tag=int(Kind.RESPONSE)):
    """The answer to one request: outputs, or an error."""

    DIRECTION = "instance -> broker -> gateway"
    FOLLOWS = "output tensors"

    rid: Annotated[int, doc("the request's rid")]
    outputs: Annotated[list | None, doc("tensor descriptors")] = None
    params: Annotated[dict | None, doc("response parameters")] = None
    error: Annotated[TritiumError | None, doc("instead of outputs")] = field(default=None, name="err")
    final: Annotated[bool | None, doc("decoupled models: false while more responses follow")] = None
    empty: Annotated[bool, doc("a decoupled model's response without outputs")] = False
    external: Annotated[int, doc("external frames that follow")] = field(default=0, name="x")
    trace: Annotated[dict | None, doc("traced requests: every stamp made after the gateway, "
                                      "{at, ts, batch, steps}")] = field(default=None, name="tr")


class Cancel(Message, frozen=True, tag=int(Kind.CANCEL)):
    """The client of a request gave up on it: its gRPC call was cancelled or ran past its
    deadline, its HTTP connection was reset or lost (or, for `/generate_stream`, half-closed),
    or a model cancelled its BLS response iterator. A
    request still queued leaves its queue, answered CANCELLED; one already running runs to its
    end, its instance told (CANCEL_RUNNING); one sent to its instance but waiting there behind
    another batch is answered CANCELLED by the instance, unrun."""

    DIRECTION = "gateway or instance (BLS) -> broker"

    rid: Annotated[int, doc("the request's rid")]
    model: Annotated[str, doc("its model")] = field(name="m")
    version: Annotated[int, doc("its version, as its INFER said (-1: a BLS request's latest)")] = field(name="v")


class Batch(Message, frozen=True, tag=int(Kind.BATCH)):
    DIRECTION = "broker -> instance"
    FOLLOWS = "the INFER records, as received"

    number: Annotated[int, doc("batch number, echoed in BATCH_DONE")] = field(name="b")
    count: Annotated[int, doc("INFER records that follow")] = field(name="n")
    slots: Annotated[list | None, doc("stateful models: the sequence slot of each request")] = field(
        default=None, name="sl")
    trace: Annotated[dict | None, doc("traced requests: the broker's stamps, {at, r: {index: [queue_start_ns, "
                                      "compute_start_ns]}}")] = field(default=None, name="tr")
    lone: Annotated[bool, doc("requests come one at a time: a decoupled model's instance gives up its CPU once "
                              "after the batch's first response, so that it leaves at once")] = False


class BatchDone(Message, frozen=True, tag=int(Kind.BATCH_DONE)):
    DIRECTION = "instance -> broker"
    FOLLOWS = "one RESPONSE record per request, in order"

    number: Annotated[int, doc("the batch")] = field(name="b")
    ok: Annotated[list[bool], doc("per request: a result (true) or an error")]
    response_frames: Annotated[list[int], doc("per response: its external frames")] = field(name="rx")
    timings: Annotated[tuple[int, int, int], doc("[compute_input_ns, compute_infer_ns, compute_output_ns]")] = \
        field(name="t")
    still_open: Annotated[list[int] | None, doc("decoupled batches (no responses follow): requests still open")] = field(
        default=None, name="open")
    ran: Annotated[bool, doc("false: none of its requests ran (each was cancelled while the batch waited at "
                             "the instance): no execution to count")] = True
    rescheduled: Annotated[list[int] | None, doc("iterative sequences: requests the model released to run again "
                                                 "(no response follows for them; `ok` and `rx` skip them)")] = field(
        default=None, name="rs")
    raised: Annotated[bool, doc("decoupled batches: execute raised, which fails each request of the batch, "
                                "one answered before too, and counts no execution (Triton's statistics)")] = field(
        default=False, name="x")


class ResponsePart(Message, frozen=True, tag=int(Kind.RESPONSE_PART)):
    DIRECTION = "instance -> broker"
    FOLLOWS = "one RESPONSE record (with `final`) of a decoupled model"

    batch: Annotated[int, doc("the batch")] = field(name="b")
    index: Annotated[int, doc("the request's index in it")] = field(name="i")


class CancelRunning(Message, frozen=True, tag=int(Kind.CANCEL_RUNNING)):
    """The client of a request the instance runs or holds gave up on it (CANCEL): a Python model
    sees it through `request.is_cancelled()` and `response_sender.is_cancelled()`; a request
    of a batch not started yet is answered CANCELLED when its batch comes up, without running
    (not a sequence's). Sent to the instance's heartbeat socket (seen even during an execute)
    and to its data socket."""

    DIRECTION = "broker -> instance"

    batch: Annotated[int, doc("the batch")] = field(name="b")
    index: Annotated[int, doc("the request's index in it")] = field(name="i")


class MetricsAsk(Message, frozen=True, tag=int(Kind.METRICS_ASK)):
    """A `/metrics` scrape: the instance's heartbeat thread answers at once with a HEARTBEAT
    carrying its model's custom metrics (`cm`) and this ask's number (`ma`), so that the scrape
    shows every change the model made before it. Sent to the heartbeat socket of each instance
    of a Python model."""

    DIRECTION = "broker -> instance"

    number: Annotated[int, doc("the ask, echoed by the answering HEARTBEAT")] = field(name="n")


# -- control plane ----------------------------------------------------------------------


class ControlArgs(Record, frozen=True, omit_defaults=True, gc=False, tag_field="op"):
    """What a CONTROL asks: one record per operation, its tag (``op``) a ControlOp value."""

    @property
    def op(self) -> ControlOp:
        return ControlOp(self.__struct_config__.tag)


class ModelsQuery(ControlArgs, frozen=True, tag=ControlOp.MODELS.value):
    """The model table."""


class StatsQuery(ControlArgs, frozen=True, tag=ControlOp.STATS.value):
    """Triton's inference statistics."""

    model: Annotated[str | None, doc("one model (none: every ready version)")] = None
    version: Annotated[int | None, doc("one version of it")] = None


class StatusQuery(ControlArgs, frozen=True, tag=ControlOp.STATUS.value):
    """Loading done, readiness, failures."""


class IndexQuery(ControlArgs, frozen=True, tag=ControlOp.INDEX.value):
    """The repository index."""

    ready: Annotated[bool, doc("only ready models")] = False


class LoadModel(ControlArgs, frozen=True, tag=ControlOp.LOAD.value):
    """Load a model; answered when it is loaded."""

    model: Annotated[str, doc("model name")]
    parameters: Annotated[dict[str, Any], doc("the repository API's parameters (`config`, `file:...`)")] = \
        field(default_factory=dict)


class UnloadModel(ControlArgs, frozen=True, tag=ControlOp.UNLOAD.value):
    """Unload a model."""

    model: Annotated[str, doc("model name")]
    unload_dependents: Annotated[bool, doc("the ensembles using it too")] = False


class ChangeLogSettings(ControlArgs, frozen=True, tag=ControlOp.LOG_SETTINGS.value):
    """Triton's log settings, after `changes`, in every process."""

    changes: Annotated[dict[str, Any], doc("Triton's log settings to change (none: just read them)")] = \
        field(default_factory=dict)


class RegisterRegion(ControlArgs, frozen=True, tag=ControlOp.SHM_REGISTER.value):
    """A client's system shared memory region (the gateway checked it maps)."""

    name: Annotated[str, doc("region name")]
    key: Annotated[str, doc("shared memory key")]
    offset: Annotated[int, doc("byte offset")]
    byte_size: Annotated[int, doc("bytes")]


class UnregisterRegion(ControlArgs, frozen=True, tag=ControlOp.SHM_UNREGISTER.value):
    """Forget a shared memory region."""

    name: Annotated[str | None, doc("region name (none: every region)")] = None


class TraceSettingsQuery(ControlArgs, frozen=True, tag=ControlOp.TRACE_SETTINGS.value):
    """Triton's trace settings, global or a model's, after `changes`."""

    model: Annotated[str | None, doc("model name (none: the global settings)")] = None
    changes: Annotated[dict[str, Any], doc("settings to change")] = field(default_factory=dict)
    startup: Annotated[dict[str, Any] | None, doc("the asking gateway's startup settings, seeding the broker's")] = None


class TraceDone(ControlArgs, frozen=True, tag=ControlOp.TRACE_DONE.value):
    """A gateway finished a trace (counted against `trace_count`; written to the trace file here)."""

    model: Annotated[str, doc("model name")]
    tree: Annotated[Any, doc("the trace, for the broker's trace file (none: exported by the gateway)")] = None
    startup: Annotated[dict[str, Any] | None, doc("the gateway's startup settings")] = None


ControlArgsUnion = (ModelsQuery | StatsQuery | StatusQuery | IndexQuery | LoadModel | UnloadModel | ChangeLogSettings
                    | RegisterRegion | UnregisterRegion | TraceSettingsQuery | TraceDone)
CONTROL_ARGS: tuple[type[ControlArgs], ...] = typing.get_args(ControlArgsUnion)


class Control(Message, frozen=True, tag=int(Kind.CONTROL)):
    DIRECTION = "gateway / serve / instance (a model's load_model...) -> broker"

    rid: Annotated[int, doc("request number")]
    args: Annotated[ControlArgsUnion, doc("the operation (`op`) and its arguments, one of the CONTROL records")]

    @property
    def op(self) -> ControlOp:
        return self.args.op


class ControlReply(Message, frozen=True, tag=int(Kind.CONTROL_REPLY)):
    """A `load` is answered when it is done, after the model table has been pushed."""

    DIRECTION = "broker -> asker"

    rid: Annotated[int, doc("the CONTROL's rid")]
    result: Annotated[Any, doc("the result")] = field(default=None, name="ok")
    error: Annotated[TritiumError | None, doc("instead of a result")] = field(default=None, name="err")


class Models(Message, frozen=True, tag=int(Kind.MODELS)):
    """The model table, pushed whenever it changes."""

    DIRECTION = "broker -> gateways"

    generation: Annotated[int, doc("increases with every change")]
    models: Annotated[tuple[ModelRow, ...], doc("every model")]
    ready: Annotated[bool, doc("strict server readiness")]
    shared_memory: Annotated[tuple[SharedMemoryRegion, ...], doc("client shared memory regions")] = field(
        name="shm")
    trace: Annotated[dict | None, doc("Triton's trace settings, which every gateway samples with")] = None
    started: Annotated[bool, doc("the startup loads have settled (non-strict readiness)")] = True
    failed: Annotated[str | None, doc("why the server could not start (a model repository it cannot read): "
                                      "neither live nor ready, its model calls answered 'Server not ready'")] = None


class LogSettings(Message, frozen=True, tag=int(Kind.LOG_SETTINGS)):
    DIRECTION = "broker -> gateway, agent, instance"

    settings: Annotated[dict, doc("Triton's logging keys")]


# -- placing instances ------------------------------------------------------------------


class Assign(Message, frozen=True, tag=int(Kind.ASSIGN)):
    """Start instances of these loads."""

    DIRECTION = "broker -> agent"

    models: Annotated[tuple[Assignment, ...], doc("the loads")]
    scale: Annotated[tuple[ScaledAssignment, ...], doc("answering a HELLO: autoscaled loads it keeps running")] = ()
    complete: Annotated[bool, doc("answering a HELLO: stop whatever was not kept")] = False


class Unassign(Message, frozen=True, tag=int(Kind.UNASSIGN)):
    DIRECTION = "broker -> agent"

    models: Annotated[tuple[LoadRef, ...], doc("stop these loads' instances")]


class Scale(Message, frozen=True, tag=int(Kind.SCALE)):
    """Run this many instances of an autoscaled load on this host."""

    DIRECTION = "broker -> agent"

    assignment: Annotated[Assignment, doc("the load")]
    count: Annotated[int, doc("instances of it on this host")]
    stop: Annotated[tuple[str, ...], doc("instance keys to stop first")] = ()


class Placed(Message, frozen=True, tag=int(Kind.PLACED)):
    """The instances an agent started for a load, or why it could not."""

    DIRECTION = "agent -> broker"

    model: Annotated[str, doc("model")] = field(name="m")
    version: Annotated[int, doc("version")] = field(name="v")
    epoch: Annotated[int, doc("the load's epoch")] = field(name="e")
    boot: Annotated[int | None, doc("the broker process that assigned it")]
    instances: Annotated[list | None, doc("instance keys")] = None
    adopted: Annotated[dict | None, doc("{key: iid} the running instances it kept for this load")] = None
    update: Annotated[bool, doc("it answers an ASSIGN update")] = False
    kept: Annotated[list[str] | None, doc("an update's running instance keys the new groups keep")] = None
    leaving: Annotated[list[str] | None, doc("an update's running instance keys the new groups do not keep")] = None
    error: Annotated[TritiumError | None, doc("why it could not")] = field(default=None, name="err")


class InstanceFailed(Message, frozen=True, tag=int(Kind.INSTANCE_FAILED)):
    """Initialization failed; the process exits after sending this."""

    DIRECTION = "instance -> broker"

    model: Annotated[str, doc("model")] = field(name="m")
    version: Annotated[int, doc("version")] = field(name="v")
    epoch: Annotated[int, doc("the load's epoch")] = field(name="e")
    name: Annotated[str, doc("instance key")]
    boot: Annotated[int | None, doc("the broker process it was started for")]
    agent: Annotated[str, doc("its agent")]
    instance_kind: Annotated[str, doc("CPU or GPU")] = field(name="kind")
    heartbeat_s: Annotated[float, doc("its heartbeat interval")] = field(name="hb")
    error: Annotated[TritiumError, doc("why")] = field(name="err")


class InstanceExited(Message, frozen=True, tag=int(Kind.INSTANCE_EXITED)):
    """A load fails when one of its instances dies before it was ready."""

    DIRECTION = "agent -> broker"

    iid: Annotated[str, doc("instance id")]
    why: Annotated[str, doc("how it ended")]
    code: Annotated[int, doc("exit status")]
    epoch: Annotated[int, doc("its load's epoch")] = field(name="e")
    name: Annotated[str, doc("instance key")]
    stopped: Annotated[bool, doc("stopped on purpose")]
    boot: Annotated[int | None, doc("the broker process it was started for")]
    final: Annotated[bool, doc("it said why it ended for good (init failed, refused): not restarted")] = False


class InstanceHealth(Message, frozen=True, tag=int(Kind.INSTANCE_HEALTH)):
    DIRECTION = "instance -> broker"

    ready: Annotated[bool, doc("a Python model's is_ready() changed its answer")]


class HostMetrics(Message, frozen=True, tag=int(Kind.HOST_METRICS)):
    """Every metrics interval."""

    DIRECTION = "agent -> broker"

    host: Annotated[str, doc("host name")]
    cpu_utilization: Annotated[float, doc("0..1")]
    memory_total: Annotated[int, doc("bytes")]
    memory_used: Annotated[int, doc("bytes")]
    gpus: Annotated[list, doc("per GPU: uuid, utilization, memory_total, memory_used, power_usage, power_limit")]


class Drain(Message, frozen=True, tag=int(Kind.DRAIN)):
    """This host is stopping: its instances get no new batches."""

    DIRECTION = "agent -> broker"


class Drained(Message, frozen=True, tag=int(Kind.DRAINED)):
    """The host's instances hold no more work."""

    DIRECTION = "broker -> agent"


def _tag(cls: type[Message]) -> int:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, int), cls   # every kind is tagged with its Kind
    return tag


MESSAGES: dict[int, type[Message]] = {_tag(cls): cls for cls in Message.__subclasses__()}
_decoder = msgspec.msgpack.Decoder(typing.Union[tuple(MESSAGES.values())], dec_hook=_decode_custom)


def error_record(rid: int, error: TritiumError) -> bytes:
    """The RESPONSE record that answers request ``rid`` with an error."""
    return Response(rid, error=error).encode()


# -- the docs tables --------------------------------------------------------------------

_RECORDS: tuple[type[Record], ...] = (RunningInstance, Assignment, ScaledAssignment, LoadRef, ModelRow, VersionRow,
                                      SharedMemoryRegion, *CONTROL_ARGS)


def protocol_table() -> str:
    """docs/architecture.md's tables of message kinds and of the records inside them, from the types above."""
    rows = ["| kind | direction | header fields (besides `k`) | what follows |", "|---|---|---|---|"]
    for kind in Kind:
        cls = MESSAGES[int(kind)]
        about = " ".join((cls.__doc__ or "").split())
        text = " ".join(part for part in (about, _fields_text(cls)) if part)
        rows.append(f"| {kind.name} ({int(kind)}) | {cls.DIRECTION} | {text} | {cls.FOLLOWS} |")
    rows += ["", "| record | wire form | fields |", "|---|---|---|"]
    for record in _RECORDS:
        form = "list" if record.__struct_config__.array_like else "map"
        tag = record.__struct_config__.tag
        tagged = f"`op` `{tag}`" if isinstance(tag, str) else ""
        fields = "; ".join(filter(None, (tagged, _fields_text(record))))
        about = " ".join((record.__doc__ or "").split()) if issubclass(record, ControlArgs) else ""
        rows.append(f"| {record.__name__} | {form} | {' '.join(filter(None, (about, fields)))} |")
    return "\n".join(rows) + "\n"


def _fields_text(cls: type) -> str:
    texts = []
    for info in msgspec.structs.fields(cls):
        shape = _shape(info.type)
        meta = next(m for m in info.type.__metadata__ if isinstance(m, Meta))
        texts.append(f"`{info.encode_name}`{' ' + shape if shape else ''} {meta.description}")
    return "; ".join(texts)


def _shape(annotation: Any) -> str:
    """How a field's records look on the wire ({m, v, e}, [[v, state]]); "" for plain values."""
    if typing.get_origin(annotation) is Annotated:
        return _shape(typing.get_args(annotation)[0])
    if annotation is TritiumError:
        return "{code, message}"
    if annotation is ControlArgsUnion:
        return "{op, ...}"
    if isinstance(annotation, type) and issubclass(annotation, Record):
        keys = ", ".join(info.encode_name for info in msgspec.structs.fields(annotation))
        return f"[{keys}]" if annotation.__struct_config__.array_like else f"{{{keys}}}"
    for argument in typing.get_args(annotation):   # X | None, tuple[X, ...]
        if argument is not type(None) and argument is not Ellipsis and _shape(argument):
            return f"[{_shape(argument)}]" if typing.get_origin(annotation) is tuple else _shape(argument)
    return ""
