"""Records: how a message header and its tensors become ZeroMQ frames, and back.

A record is one frame::

    [u32 little-endian header length][msgpack header][inline tensor bytes...]

followed by ``header["x"]`` external frames (0 when absent). Tensors smaller than
``INLINE_LIMIT`` ride inline after the header: ZeroMQ copies frames that small anyway,
and one frame per request instead of one per tensor is what keeps the per-request cost
of every hop low (pyzmq's cost is per frame, see docs/architecture.md). Larger tensors
travel as external frames of their own, zero-copy. Tensor bytes are never inside
msgpack, and the broker never reads or copies them: it decodes headers and forwards
the frames it received.

Tensor descriptors are ``[name, datatype, shape, nbytes, external]``; inline tensors lie
back to back after the header in descriptor order, external ones are the following
frames in descriptor order.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from tritium.errors import ProtocolError

PROTOCOL_VERSION = 14   # 14: instance groups updated in place (ASSIGN update, PLACED leaving, UNASSIGN instances)
INLINE_LIMIT = 64 * 1024
_PREFIX = struct.Struct("<I")


class Kind(enum.IntEnum):
    # any peer -> broker, first message: who it is
    HELLO = 1
    # broker -> peer: refused (wrong protocol version, unknown role)
    REFUSED = 2
    # broker -> peer: "I do not know you" (the broker restarted, or dropped the peer): say HELLO again.
    # To an instance: with ``boot`` and ``e``, a new broker keeps it (HELLO again as that load's);
    # without, it exits and its agent restarts it.
    RESET = 3
    # gateway -> broker: one inference request; inline/external tensors = inputs
    INFER = 10
    # instance -> broker -> gateway: the answer to one request; tensors = outputs
    RESPONSE = 11
    # gateway or instance (BLS) -> broker: the client of a request gave up on it (a queued one leaves its queue)
    CANCEL = 12
    # broker -> instance: requests to execute together (the INFER records follow)
    BATCH = 20
    # instance -> broker: the RESPONSE records of one batch follow, in request order
    BATCH_DONE = 21
    # instance -> broker: one response of a decoupled model, while its batch is open
    RESPONSE_PART = 22
    # broker -> instance: the client of a request it runs gave up on it (the model may see it)
    CANCEL_RUNNING = 23
    # broker -> instance (its heartbeat socket): a /metrics scrape wants the model's custom metrics now
    METRICS_ASK = 24
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
    # instance -> broker: whether it can serve, when that changes (Python models' is_ready)
    INSTANCE_HEALTH = 45
    # agent -> broker: the host's CPU, memory and GPU figures, every metrics interval
    HOST_METRICS = 46
    # broker -> agent: run this many instances of an autoscaled model version ("stop": which ones go)
    SCALE = 47
    # any direction, every heartbeat interval; the broker's carry its ``boot`` id
    HEARTBEAT = 50
    # broker -> gateway, agent, instance: Triton's logging settings changed (or on joining)
    LOG_SETTINGS = 51
    # agent -> broker: this host is stopping; send its instances no more batches
    DRAIN = 52
    # broker -> agent: the instances of a draining host hold no more work
    DRAINED = 53


_KINDS = frozenset(int(k) for k in Kind)

# A peer silent for this many heartbeat intervals is gone: the broker drops it, and a
# gateway or agent that stops hearing the broker fails what it sent and waits for it.
MISSED_HEARTBEATS = 3
# An instance's heartbeat socket is named its iid followed by this: the broker reaches the
# thread that owns it (CANCEL_RUNNING during a long execute) while the main thread computes.
HEARTBEAT_SUFFIX = b"/hb"
# An instance's socket for its model's BLS calls is named its iid followed by this: the broker
# tells it where a restarted process's calls begin (a HEARTBEAT's ``sn``, workers/bls.py).
BLS_SUFFIX = b"/bls"
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0


def own_stall(last_beat: float, now: float, interval_s: float) -> float:
    """How much later than its interval this process's heartbeat loop came round (it was
    stopped, by Ctrl-Z or SIGSTOP, or not scheduled): its peers' silence over that time is its
    own, and is not counted against them. 0 for the usual lateness, under half an interval."""
    stall = now - last_beat - interval_s
    return stall if stall > interval_s / 2 else 0.0

# Gateways and agents reconnect to a lost broker after 100 ms, backing off to one attempt a
# second: a restarted broker is found within a second of binding (an attempt on a closed
# port costs next to nothing).
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000


_packer = msgpack.Packer(use_bin_type=True)


def encode(header: dict[str, Any], inline: Iterable = ()) -> bytes:
    """One record: the header, then the inline tensor bytes."""
    return frame_record(_packer.pack(header), inline)


def frame_record(packed_header: bytes, inline: Iterable = ()) -> bytes:
    """One record of a header already packed as msgpack, then the inline tensor bytes."""
    return b"".join([_PREFIX.pack(len(packed_header)), packed_header, *inline])


def decode(frame) -> tuple[dict[str, Any], memoryview, int]:
    """(header as a dict, the record's bytes, offset of its first inline tensor); ProtocolError if malformed.
    Readers of one kind's fields use ``messages.read_record``, which gives the typed header."""
    view, end = split_record(frame)
    try:
        header = msgpack.unpackb(view[4:end], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable record header: {exc}") from exc
    if not isinstance(header, dict) or header.get("k") not in _KINDS:
        raise ProtocolError(f"record header without a known kind: {str(header)[:80]}")
    return header, view, end


def split_record(frame) -> tuple[memoryview, int]:
    """(the record's bytes, where its header ends and its first inline tensor starts); ProtocolError
    if the length prefix does not fit the frame."""
    view = memoryview(frame.buffer if hasattr(frame, "buffer") else frame)
    if len(view) < 4:
        raise ProtocolError("record shorter than its length prefix")
    (length,) = _PREFIX.unpack_from(view, 0)
    end = 4 + length
    if end > len(view):
        raise ProtocolError(f"record header of {length} bytes overruns the {len(view)}-byte frame")
    return view, end


def record_body(frame) -> tuple[memoryview, int]:
    """(the record's bytes, offset of its first inline tensor) of a record already decoded once."""
    view = memoryview(frame.buffer if hasattr(frame, "buffer") else frame)
    return view, 4 + _PREFIX.unpack_from(view, 0)[0]


def pack_tensors(tensors: Iterable[tuple[str, str, list, Any]]) -> tuple[list, list, list]:
    """(descriptors, inline buffers, external buffers) of ``(name, datatype, shape, bytes)`` tensors:
    each rides inline or as an external frame by its size."""
    descriptors: list[list] = []
    inline: list = []
    external: list = []
    for name, datatype, shape, data in tensors:
        nbytes = len(data)
        is_external = nbytes >= INLINE_LIMIT
        descriptors.append([name, datatype, shape, nbytes, is_external])
        (external if is_external else inline).append(data)
    return descriptors, inline, external


def tensor_views(descriptors: Sequence, view: memoryview, offset: int, frames: Sequence) -> list[memoryview]:
    """The bytes of each described tensor: slices of the record, or the external frames."""
    views = []
    external = iter(frames)
    for descriptor in descriptors:
        if descriptor[4]:
            frame = next(external, None)
            if frame is None:
                raise ProtocolError(f"tensor '{descriptor[0]}' is external but its frame is missing")
            views.append(memoryview(frame.buffer if hasattr(frame, "buffer") else frame))
        else:
            end = offset + descriptor[3]
            if end > len(view):
                raise ProtocolError(f"tensor '{descriptor[0]}' overruns its record")
            views.append(view[offset:end])
            offset = end
    return views
