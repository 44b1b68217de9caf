"""Every message kind of the wire protocol as a type: the one place a wire header is built or read.

Each kind is a frozen, slotted dataclass (see ``tritium.protocol.declare``); ``to_wire()`` gives the
compact msgpack header with short keys, ``from_wire(header)`` reads one back, ``encode(inline)``
gives the record. Senders build these types and receivers read them; ``read(header)`` gives the
type of any decoded header. docs/architecture.md's protocol table is generated from them
(``python -m tritium.protocol`` prints them), so the two cannot disagree.

Adding an optional field to a kind is one line in its class: a field with a default is left off
the wire while it holds that default (so older peers never see it), and reads back as the default
when absent.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from tritium.errors import TritiumError
from tritium.protocol.declare import TUPLE, Codec, compile_wire_type, lenient_enum, nested, on_wire, record
from tritium.protocol.framing import Kind, encode

__all__ = [
    "MESSAGES", "read", "error_record", "ControlOp", "Role",
    "RunningInstance", "Assignment", "ScaledAssignment", "LoadRef", "VersionRow", "ModelRow", "SharedMemoryRegion",
    "Hello", "Refused", "Reset", "Heartbeat", "Infer", "Response", "Batch", "BatchDone", "ResponsePart",
    "Control", "ControlReply", "Models", "LogSettings", "Assign", "Unassign", "Scale", "Placed",
    "InstanceFailed", "InstanceExited", "InstanceHealth", "HostMetrics", "Drain", "Drained",
]

MESSAGES: dict[int, type] = {}   # kind -> its type


def message(kind: Kind, direction: str, follows: str = ""):
    """Decorator: the type of message ``kind``; ``direction`` and ``follows`` (the frames after
    its record) are for the docs table."""
    def make(cls: type) -> type:
        cls = compile_wire_type(cls, kind)
        cls.KIND, cls.DIRECTION, cls.FOLLOWS = kind, direction, follows
        cls.encode = _encode_record
        MESSAGES[int(kind)] = cls
        return cls
    return make


def _encode_record(self, inline: Iterable = ()) -> bytes:
    """The record: this header, then the inline tensor bytes."""
    return encode(self.to_wire(), inline)


def read(header: dict) -> Any:
    """The typed message of a decoded header (``protocol.decode`` checked its kind)."""
    return MESSAGES[header["k"]].from_wire(header)


# -- shared value shapes ------------------------------------------------------------------

# Errors cross processes in one shape everywhere: {code, message} (tritium/errors.py).
ERROR = Codec(TritiumError.to_wire, TritiumError.from_wire, "{code, message}")


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


class Role(str, enum.Enum):
    GATEWAY = "gateway"
    AGENT = "agent"
    INSTANCE = "instance"


@record
class RunningInstance:
    """An instance a registering agent still runs, which a restarted broker may keep."""

    iid: str = on_wire("iid", "instance id")
    model: str = on_wire("m", "model")
    version: int = on_wire("v", "version")
    identity: str = on_wire("id", "load identity")
    key: str = on_wire("key", "instance key")
    name: str = on_wire("name", "instance name")
    kind: str = on_wire("kind", "CPU or GPU")
    device: int = on_wire("device", "device id")
    credit: int = on_wire("credit", "batches it may hold")
    scaled: bool = on_wire("scaled", "started by autoscaling")
    pid: int = on_wire("pid", "process id")


@record
class Assignment:
    """One load a host agent is to run: the host-independent config and the shipped files."""

    model: str = on_wire("m", "model")
    version: int = on_wire("v", "version")
    epoch: int = on_wire("e", "the load's epoch")
    config: dict = on_wire("config", "the host-independent config as Triton's JSON")
    files: dict | None = on_wire("files", "the load API's file overrides", None)
    identity: str | None = on_wire("id", "the load identity", None)
    adopt: tuple[str, ...] = on_wire("adopt", "running instances (iids) it may keep for this load", (), TUPLE)


@record
class ScaledAssignment:
    assignment: Assignment = on_wire("assignment", "the load", codec=nested(Assignment))
    count: int = on_wire("count", "instances it keeps running")


@record
class LoadRef:
    model: str = on_wire("m", "model")
    version: int = on_wire("v", "version")
    epoch: int = on_wire("e", "the load's epoch")


@record(positional=True)
class VersionRow:
    version: int = on_wire("v", "version")
    state: str = on_wire("state", "READY, LOADING, UNAVAILABLE, ...")
    reason: str = on_wire("reason", "why it is in that state")
    healthy: bool = on_wire("healthy", "every instance's is_ready()")


@record
class ModelRow:
    """One model of the table gateways keep (all its versions)."""

    name: str = on_wire("name", "model name")
    error: str | None = on_wire("error", "why it failed to load")
    versions: tuple[VersionRow, ...] = on_wire("versions", "its versions", codec=nested(VersionRow, many=True))
    config: dict | None = on_wire("config", "its config as Triton's JSON (None once unloaded)")
    labels: dict | None = on_wire("labels", "classification labels per output")


@record
class SharedMemoryRegion:
    name: str = on_wire("name", "region name")
    key: str = on_wire("key", "shared memory key")
    offset: int = on_wire("offset", "offset into it")
    byte_size: int = on_wire("byte_size", "bytes")


# -- connecting -------------------------------------------------------------------------


@message(Kind.HELLO, "any peer -> broker")
class Hello:
    """First message of a peer: who it is."""

    role: Role = on_wire("role", "`gateway`, `agent` or `instance`", codec=lenient_enum(Role))
    protocol_version: int = on_wire("pv", "protocol version")
    heartbeat_s: float | None = on_wire("hb", "its heartbeat interval", None)
    # an agent
    host: str | None = on_wire("host", "agent: host name", None)
    gpus: tuple[int, ...] | None = on_wire("gpus", "agent: its GPUs", None, TUPLE)
    models: tuple[str, ...] | None = on_wire("models", "agent: the models it serves (none: any)", None, TUPLE)
    cpu_slots: int | None = on_wire("cpu_slots", "agent: CPU instances it runs at most", None)
    running: tuple[RunningInstance, ...] | None = on_wire(
        "running", "agent: the instances it still runs, when registering with a restarted broker", None,
        nested(RunningInstance, many=True))
    # an instance
    agent: str | None = on_wire("agent", "instance: its agent", None)
    model: str | None = on_wire("m", "instance: model", None)
    version: int | None = on_wire("v", "instance: version", None)
    epoch: int | None = on_wire("e", "instance: the load's epoch", None)
    boot: int | None = on_wire("boot", "instance: the broker process it was started for", None)
    name: str | None = on_wire("name", "instance: instance key", None)
    kind: str | None = on_wire("kind", "instance: CPU or GPU", None)
    credit: int | None = on_wire("credit", "instance: batches it may hold at once", None)


@message(Kind.REFUSED, "broker -> peer")
class Refused:
    reason: str = on_wire("reason", "why (wrong protocol version, unknown role)")


@message(Kind.RESET, "broker -> agent, instance")
class Reset:
    """"I do not know you": say HELLO again (an instance without `e` exits instead)."""

    boot: int | None = on_wire("boot", "agent: register again with this broker process", None)
    epoch: int | None = on_wire("e", "instance: the restarted broker keeps it, as this load's", None)


@message(Kind.HEARTBEAT, "both ways")
class Heartbeat:
    """Every heartbeat interval; any message counts as a sign of life."""

    boot: int | None = on_wire("boot", "broker: its process's id", None)
    heartbeat_s: float | None = on_wire("hb", "the sender's interval", None)
    role: Role | None = on_wire("role", "gateway, agent", None, lenient_enum(Role))
    protocol_version: int | None = on_wire("pv", "gateway: so that a new broker process can register it", None)
    iid: str | None = on_wire("iid", "an instance's heartbeat thread: its instance", None)
    agent: str | None = on_wire("agent", "instance: its agent", None)
    joined: bool = on_wire("joined", "instance: it has said HELLO", False)


# -- inference (the hot path) -----------------------------------------------------------


@message(Kind.INFER, "gateway -> broker -> instance", "input tensors")
class Infer:
    """One inference request (also from an instance: a model calling another model)."""

    rid: int = on_wire("rid", "request number of the sender; echoed in the RESPONSE")
    model: str = on_wire("m", "model")
    inputs: list = on_wire("inputs", "tensor descriptors")
    version: int | None = on_wire("v", "concrete version (the gateway resolves latest)", None)
    batch_size: int | None = on_wire("bs", "batch size of the request", None)
    request_id: str | None = on_wire("id", "the client's request id", None)
    outputs: list | None = on_wire("outputs", "requested output names (absent: all)", None)
    params: dict | None = on_wire("params", "request parameters", None)
    sequence_id: int | str | None = on_wire("cid", "sequence (correlation) id", None)
    sequence_flags: int = on_wire("sf", "sequence flags: 1 START, 2 END", 0)
    external: int = on_wire("x", "external frames that follow", 0)


@message(Kind.RESPONSE, "instance -> broker -> gateway", "output tensors")
class Response:
    """The answer to one request: outputs, or an error."""

    rid: int = on_wire("rid", "the request's rid")
    outputs: list | None = on_wire("outputs", "tensor descriptors", None)
    params: dict | None = on_wire("params", "response parameters", None)
    error: TritiumError | None = on_wire("err", "instead of outputs", None, ERROR)
    model_error: bool = on_wire("model_error", "a model's own error: passed on without the request id", False)
    final: bool | None = on_wire("final", "decoupled models: False while more responses follow", None)
    empty: bool = on_wire("empty", "a decoupled model's response without outputs", False)
    external: int = on_wire("x", "external frames that follow", 0)


@message(Kind.BATCH, "broker -> instance", "the INFER records, as received")
class Batch:
    number: int = on_wire("b", "batch number, echoed in BATCH_DONE")
    count: int = on_wire("n", "INFER records that follow")
    slots: list | None = on_wire("sl", "stateful models: the sequence slot of each request", None)


@message(Kind.BATCH_DONE, "instance -> broker", "one RESPONSE record per request, in order")
class BatchDone:
    number: int = on_wire("b", "the batch")
    ok: list = on_wire("ok", "per request: a result (true) or an error")
    response_frames: list = on_wire("x", "per response: its external frames")
    timings: list = on_wire("t", "[compute_input_ns, compute_infer_ns, compute_output_ns]")
    still_open: list | None = on_wire("open", "decoupled batches (no responses follow): requests still open", None)


@message(Kind.RESPONSE_PART, "instance -> broker", "one RESPONSE record (with `final`) of a decoupled model")
class ResponsePart:
    batch: int = on_wire("b", "the batch")
    index: int = on_wire("i", "the request's index in it")


# -- control plane ----------------------------------------------------------------------


@message(Kind.CONTROL, "gateway / serve -> broker")
class Control:
    rid: int = on_wire("rid", "request number")
    op: ControlOp = on_wire("op", "`" + "`, `".join(op.value for op in ControlOp) + "`", codec=lenient_enum(ControlOp))
    args: dict | None = on_wire("args", "its arguments", None)


@message(Kind.CONTROL_REPLY, "broker -> asker")
class ControlReply:
    """A `load` is answered when it is done, after the model table has been pushed."""

    rid: int = on_wire("rid", "the CONTROL's rid")
    result: Any = on_wire("ok", "the result", None)
    error: TritiumError | None = on_wire("err", "instead of a result", None, ERROR)


@message(Kind.MODELS, "broker -> gateways")
class Models:
    """The model table, pushed whenever it changes."""

    generation: int = on_wire("generation", "increases with every change")
    models: tuple[ModelRow, ...] = on_wire("models", "every model", codec=nested(ModelRow, many=True))
    ready: bool = on_wire("ready", "strict server readiness")
    shared_memory: tuple[SharedMemoryRegion, ...] = on_wire(
        "shm", "client shared memory regions", codec=nested(SharedMemoryRegion, many=True))


@message(Kind.LOG_SETTINGS, "broker -> gateway, agent, instance")
class LogSettings:
    settings: dict = on_wire("settings", "Triton's logging keys")


# -- placing instances ------------------------------------------------------------------


@message(Kind.ASSIGN, "broker -> agent")
class Assign:
    """Start instances of these loads."""

    models: tuple[Assignment, ...] = on_wire("models", "the loads", codec=nested(Assignment, many=True))
    scale: tuple[ScaledAssignment, ...] = on_wire(
        "scale", "answering a HELLO: autoscaled loads it keeps running", (), nested(ScaledAssignment, many=True))
    complete: bool = on_wire("complete", "answering a HELLO: stop whatever was not kept", False)


@message(Kind.UNASSIGN, "broker -> agent")
class Unassign:
    models: tuple[LoadRef, ...] = on_wire("models", "stop these loads' instances", codec=nested(LoadRef, many=True))


@message(Kind.SCALE, "broker -> agent")
class Scale:
    """Run this many instances of an autoscaled load on this host."""

    assignment: Assignment = on_wire("assignment", "the load", codec=nested(Assignment))
    count: int = on_wire("count", "instances of it on this host")
    stop: tuple[str, ...] = on_wire("stop", "instance keys to stop first", (), TUPLE)


@message(Kind.PLACED, "agent -> broker")
class Placed:
    """The instances an agent started for a load, or why it could not."""

    model: str = on_wire("m", "model")
    version: int = on_wire("v", "version")
    epoch: int = on_wire("e", "the load's epoch")
    boot: int | None = on_wire("boot", "the broker process that assigned it")
    instances: list | None = on_wire("instances", "instance keys", None)
    adopted: dict | None = on_wire("adopted", "{key: iid} the running instances it kept for this load", None)
    error: str | None = on_wire("err", "why it could not", None)


@message(Kind.INSTANCE_FAILED, "instance -> broker")
class InstanceFailed:
    """Initialization failed; the process exits after sending this."""

    model: str = on_wire("m", "model")
    version: int = on_wire("v", "version")
    epoch: int = on_wire("e", "the load's epoch")
    name: str = on_wire("name", "instance key")
    boot: int | None = on_wire("boot", "the broker process it was started for")
    agent: str = on_wire("agent", "its agent")
    kind: str = on_wire("kind", "CPU or GPU")
    heartbeat_s: float = on_wire("hb", "its heartbeat interval")
    error: str = on_wire("err", "why")


@message(Kind.INSTANCE_EXITED, "agent -> broker")
class InstanceExited:
    """A load fails when one of its instances dies before it was ready."""

    iid: str = on_wire("iid", "instance id")
    why: str = on_wire("why", "how it ended")
    code: int = on_wire("code", "exit status")
    epoch: int = on_wire("e", "its load's epoch")
    name: str = on_wire("name", "instance key")
    stopped: bool = on_wire("stopped", "stopped on purpose")
    boot: int | None = on_wire("boot", "the broker process it was started for")


@message(Kind.INSTANCE_HEALTH, "instance -> broker")
class InstanceHealth:
    ready: bool = on_wire("ready", "a Python model's is_ready() changed its answer")


@message(Kind.HOST_METRICS, "agent -> broker")
class HostMetrics:
    """Every metrics interval."""

    host: str = on_wire("host", "host name")
    cpu_utilization: float = on_wire("cpu_utilization", "0..1")
    memory_total: int = on_wire("memory_total", "bytes")
    memory_used: int = on_wire("memory_used", "bytes")
    gpus: list = on_wire("gpus", "per GPU: uuid, utilization, memory_total, memory_used, power_usage, power_limit")


@message(Kind.DRAIN, "agent -> broker")
class Drain:
    """This host is stopping: its instances get no new batches."""


@message(Kind.DRAINED, "broker -> agent")
class Drained:
    """The host's instances hold no more work."""


def error_record(rid: int, error: TritiumError | dict, model_error: bool = False) -> bytes:
    """The RESPONSE record that answers request ``rid`` with an error; ``model_error``: a model's
    own error, which the gateway passes on without the request id, as Triton does."""
    if isinstance(error, dict):
        error = TritiumError.from_wire(error)
    return Response(rid, error=error, model_error=model_error).encode()


# -- the docs table ---------------------------------------------------------------------


_RECORDS = (RunningInstance, Assignment, ScaledAssignment, LoadRef, ModelRow, VersionRow, SharedMemoryRegion)


def protocol_table() -> str:
    """docs/architecture.md's tables of message kinds and of the records inside them, from the types above."""
    rows = ["| kind | direction | header fields (besides `k`) | what follows |", "|---|---|---|---|"]
    for kind in Kind:
        cls = MESSAGES[int(kind)]
        about = " ".join((cls.__doc__ or "").split())
        text = " ".join(part for part in (about, _fields_text(cls)) if part)
        rows.append(f"| {kind.name} ({int(kind)}) | {cls.DIRECTION} | {text} | {cls.FOLLOWS} |")
    rows += ["", "| record | wire form | fields |", "|---|---|---|"]
    for cls in _RECORDS:
        form = "list" if cls.WIRE_SHAPE.startswith("[") else "map"
        rows.append(f"| {cls.__name__} | {form} | {_fields_text(cls)} |")
    return "\n".join(rows) + "\n"


def _fields_text(cls: type) -> str:
    return "; ".join(f"`{wire.key}`{' ' + wire.codec.shape if wire.codec and wire.codec.shape else ''} {wire.doc}"
                     for _, wire in cls.WIRE_FIELDS)
