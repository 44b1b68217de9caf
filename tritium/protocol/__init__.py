"""The wire protocol between gateway, broker, host agents and instance processes.

A message is a ZeroMQ multipart of *records* (a ROUTER adds the peer identity in front);
``framing`` turns a header and its tensors into a record and back. Every header is one of
the message types of ``messages`` (the header's ``k`` is its ``Kind``): senders build
those types and receivers read them, so no other module knows a wire key. Several
records may share one multipart (a gateway sends every INFER of one event-loop turn
together; the broker answers a gateway with every RESPONSE of a batch together).

Hot path, per inference request::

    gateway  --INFER record(s)-->                          broker
    broker   --[BATCH record, INFER record(s) as received]--> instance
    instance --[BATCH_DONE record, RESPONSE record(s)]-->   broker
    broker   --RESPONSE record(s) as received-->           gateway

A decoupled model answers each request 0..N times: every response travels as a
RESPONSE_PART (then the RESPONSE record, with ``final`` on the last one), and its
BATCH_DONE carries no responses, only the requests still open. Instances also send
INFER to the broker themselves (BLS: a model calling another model), on a socket of
their own; the broker answers them like a gateway.
"""

from tritium.protocol.framing import (  # noqa: F401  (re-exported)
    BLS_SUFFIX,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    HEARTBEAT_SUFFIX,
    INLINE_LIMIT,
    MISSED_HEARTBEATS,
    PROTOCOL_VERSION,
    RECONNECT_IVL_MAX_MS,
    RECONNECT_IVL_MS,
    Kind,
    ProtocolError,
    decode,
    encode,
    frame_record,
    own_stall,
    pack_tensors,
    record_body,
    split_record,
    tensor_views,
)
from tritium.protocol.messages import *  # noqa: F401,F403  (every message type; see messages.__all__)
