"""The wire protocol between gateway, broker, host agents and instance processes.

Every message is a ZeroMQ multipart ``[header, frame0, frame1, ...]`` (a ROUTER adds
the peer identity in front). ``header`` is a small msgpack map; tensor bytes always
travel as frames of their own, never inside msgpack, so the broker can route them
without reading or copying them.

The header's ``k`` key is the message ``Kind``; the other keys of each kind are
listed with it below (short names keep headers small; the TypedDicts document them).
A peer announces ``PROTOCOL_VERSION`` in its HELLO and the broker refuses another one.

Hot path, per inference request::

    gateway  --INFER [h, inputs...]-->                 broker
    broker   --BATCH [h, (INFER h, inputs...) * n]-->  instance   (INFER headers forwarded as-is)
    instance --BATCH_DONE [h, (RESPONSE h, outputs...) * n]--> broker
    broker   --RESPONSE [h, outputs...]-->             gateway    (RESPONSE headers forwarded as-is)
"""

from __future__ import annotations

import enum
from typing import Any, TypedDict

import msgpack

from tritium.errors import ProtocolError

PROTOCOL_VERSION = 1


class Kind(enum.IntEnum):
    # any peer -> broker, first message: who it is
    HELLO = 1
    # broker -> peer: refused (wrong protocol version, unknown role)
    REFUSED = 2
    # gateway -> broker: one inference request; frames = input tensors
    INFER = 10
    # instance -> broker -> gateway: the answer to one request; frames = output tensors
    RESPONSE = 11
    # broker -> instance: requests to execute together
    BATCH = 20
    # instance -> broker: the responses of one batch, in request order
    BATCH_DONE = 21
    # gateway/serve -> broker: a control-plane question (models, stats, status)
    CONTROL = 30
    # broker -> asker: the answer to a CONTROL
    CONTROL_REPLY = 31
    # broker -> gateway: the model table changed (pushed)
    MODELS = 32
    # broker -> agent: start instances of these model versions
    ASSIGN = 40
    # broker -> agent: stop the instances of these model versions
    UNASSIGN = 41
    # agent -> broker: the instances it started for a model version (or why it could not)
    PLACED = 42
    # instance -> broker: initialization failed; the process exits after sending this
    INSTANCE_FAILED = 43
    # agent -> broker: an instance process ended
    INSTANCE_EXITED = 44
    # any direction: liveness when nothing else flows
    HEARTBEAT = 50


class InferHeader(TypedDict, total=False):
    k: int
    rid: int              # gateway-local request number; echoed in the RESPONSE
    m: str                # model name
    v: int                # concrete model version (the gateway resolves "latest")
    id: str               # the client's request id, when it gave one
    bs: int               # batch size of the request (1 for non-batching models)
    inputs: list          # [[name, datatype, shape], ...], one frame each, in order
    outputs: list | None  # requested output names; None means all of them
    params: dict          # request parameters


class ResponseHeader(TypedDict, total=False):
    k: int
    rid: int
    outputs: list         # [[name, datatype, shape], ...], one frame each, in order
    params: dict          # response parameters
    err: dict             # {"code": ErrorCode, "message": str} instead of outputs
    final: bool           # False while a decoupled model has more responses to send


class BatchHeader(TypedDict):
    k: int
    b: int                # batch number, echoed in BATCH_DONE
    n: int                # number of requests that follow


class BatchDoneHeader(TypedDict, total=False):
    k: int
    b: int
    frames: list          # frames per response that follows (header frame excluded)
    ok: list              # per response: True for a result, False for an error
    t: list               # [compute_input_ns, compute_infer_ns, compute_output_ns]


_packer = msgpack.Packer(use_bin_type=True)


def pack(header: dict[str, Any]) -> bytes:
    return _packer.pack(header)


def unpack(raw: bytes | memoryview) -> dict[str, Any]:
    """Decode a header; anything that is not a msgpack map with a known kind is a ProtocolError."""
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable message header: {exc}") from exc
    if not isinstance(header, dict) or "k" not in header:
        raise ProtocolError("message header is not a map with a kind")
    try:
        header["k"] = Kind(header["k"])
    except ValueError as exc:
        raise ProtocolError(f"unknown message kind {header['k']!r}") from exc
    return header


def error_response(rid: int, error: dict) -> bytes:
    """The RESPONSE header that answers request ``rid`` with an error."""
    return pack({"k": Kind.RESPONSE, "rid": rid, "err": error})


# Exit codes of tritium processes, so that supervisors and systemd can tell why one ended.
class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    INIT_FAILED = 3          # an instance could not initialize its model: do not restart it
    MODEL_LOAD_FAILED = 4    # serve: a model failed at startup (Triton's --exit-on-error)
    PROTOCOL_MISMATCH = 5
