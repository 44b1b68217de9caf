"""The gateway's connection to the broker: one DEALER socket driven by the event loop.

The socket's file descriptor is watched with ``loop.add_reader``; every wake-up drains
every message that is ready (ZeroMQ's descriptor is edge-triggered, so after each send
the socket is checked again). Requests made during one event-loop turn leave together
in one multipart message (or ``send_every`` at a time, the rest at the turn's end); replies
are matched to waiting futures by ``rid``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import zmq

from tritium.gateway.model_table import ModelTable
from tritium.gateway.shared_memory import SharedMemoryRegions
from tritium import logs
from tritium.errors import Cancelled, TritiumError, Unavailable
from tritium.hosts import host_name
from tritium.protocol import (
    DEFAULT_HEARTBEAT_INTERVAL_S,
    MISSED_HEARTBEATS,
    PROTOCOL_VERSION,
    Cancel,
    Control,
    ControlReply,
    Heartbeat,
    Hello,
    Infer,
    LogSettings,
    Models,
    Refused,
    Response,
    Role,
    own_stall,
    read_record,
)
from tritium.links import LinkSocket, connect_dealer
from tritium.zmtp import PoolUse
from tritium.security import CurveKeys
from tritium.shared_pool import DEFAULT_POOL_BYTES, request_slots
from tritium.zmtp import ZmtpDealer
from tritium.zmqio import LONE_ANSWERS_BEFORE_POLLING, POLL_WHILE_AT_MOST, cpu_is_free

log = logging.getLogger(__name__)

_POOL_FULL = ("the shared tensor pool (--tensor-pool-mb, {mib:g} MiB) is full: large tensors cross the local sockets "
              "as bytes until the requests holding it are answered")



class Reply(NamedTuple):
    message: Response | ControlReply
    record: memoryview     # the whole record the header came in
    offset: int            # where its inline tensors start
    external: list         # its external frames


Deliver = Callable[["Reply | TritiumError"], None]


def _settle(future: asyncio.Future, outcome: "Reply | TritiumError") -> None:
    if future.done():
        return
    if isinstance(outcome, TritiumError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class BrokerRefused(Exception):
    """The broker will not serve this gateway (it speaks another protocol version): retrying
    cannot help, so the gateway stops."""


class BrokerLink:
    """The socket, the requests waiting for answers, and whether the broker still answers.

    Both sides heartbeat. When the broker falls silent for ``MISSED_HEARTBEATS``
    intervals, every request waiting on it is answered with an error and new ones are
    refused at once; ZeroMQ keeps reconnecting (1 s, backing off to 32 s). A broker that
    comes back as a new process (a new ``boot`` id) has lost what the old one held, so
    those requests fail too; the gateway registers again just by heartbeating.
    """

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop | None = None,
                 heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
                 curve: CurveKeys | None = None, spin_s: float = 0.0, hwm: int = 100_000,
                 pool_bytes: int = DEFAULT_POOL_BYTES, send_every: int = 0) -> None:
        self.address = address
        self.hwm = hwm   # messages the link holds while the broker does not read them (one a turn, or more)
        self.spin_s = spin_s
        # A turn's messages go to the broker every this many, the rest at the turn's end (0: all
        # then). Sending the first ones early lets the broker and an instance start on them while
        # this process reads the rest, where they run on other CPUs (--gateway-send-every).
        self.send_every = send_every
        self.loop = loop or asyncio.get_running_loop()
        self.identity = f"gw-{host_name()}-{os.getpid()}"
        self.on_trace_settings: Callable[[dict | None], None] = lambda settings: None   # gateway/tracing.py
        self.sock: LinkSocket = connect_dealer(address, self.identity, curve, "gateway", hwm, pools=PoolUse.VIEW)
        # Large input tensors go to the broker as references into shared memory (a local link only).
        self.slots = request_slots(pool_bytes, _POOL_FULL) if pool_bytes and isinstance(self.sock, ZmtpDealer) else None
        self.models = ModelTable()
        self.shared_memory = SharedMemoryRegions()   # follows the broker's list, like the model table
        self._models_received = asyncio.Event()
        # the broker's reason, once it refuses this gateway (gateway/server.py stops on it)
        self.refused: asyncio.Future[str] = self.loop.create_future()
        self._pending: dict[int, Deliver] = {}   # rid -> called once with the Reply or an error
        self._streams: dict[int, Deliver] = {}   # rid -> called with each of 0..N answers (decoupled), the last final
        self._next_rid = 1
        self._outbox: list = []
        self._outbox_requests = 0   # the new requests in it (INFER and CONTROL, not those held and sent again)
        self._fd = self.sock.fileno()
        self.loop.add_reader(self._fd, self._drain)
        self._drain_scheduled = False
        self._rest: tuple[list, int] | None = None   # a message's records not yet handled, after a slice
        self._spinning = False
        self._spin_until = 0.0
        self._lone_in_a_row = 0   # answers in a row to requests that were out alone
        self._alone_rid = 0       # the request out alone since it was sent, if any
        self.heartbeat_interval_s = heartbeat_interval_s
        self.broker_boot: int | None = None
        self.broker_lost = False
        # The broker drains (a restart, or a stop): new requests wait here for the next broker
        # process, (rid, record, frames) in rid order, until it answers or contact is lost.
        self.holding = False
        self._held: list[tuple[int, bytes, list]] = []
        self._broker_interval = 0.0   # the broker's heartbeat interval, as its heartbeats say
        self._last_heard = self._last_beat = self.loop.time()
        self._beat_handle = self.loop.call_later(heartbeat_interval_s, self._beat)

    async def start(self, timeout_s: float | None = None) -> None:
        """Say hello and wait for the first model table; BrokerRefused when the broker will not
        serve this gateway, TimeoutError after ``timeout_s`` (None: wait for the broker as long as it takes)."""
        self._post(Hello(Role.GATEWAY, PROTOCOL_VERSION, heartbeat_s=self.heartbeat_interval_s).encode())
        models = asyncio.ensure_future(self._models_received.wait())
        either: set[asyncio.Future[Any]] = {models, self.refused}
        await asyncio.wait(either, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if self.refused.done():
            models.cancel()
            raise BrokerRefused(self.refused.result())
        if not models.done():
            models.cancel()
            raise TimeoutError(f"no model table from the broker at {self.address} within {timeout_s} s")

    def close(self) -> None:
        self._beat_handle.cancel()
        self.loop.remove_reader(self._fd)
        self._rest = None   # its answers' requests are failed just below
        self._fail_waiting(Unavailable("the gateway is shutting down"))
        self.sock.close()

    @property
    def waiting(self) -> int:
        """Requests sent to the broker and not yet (finally) answered."""
        return len(self._pending) + len(self._streams)

    @property
    def polling(self) -> bool:
        """Whether the link checks its socket on every event-loop turn now (``spin_s``) rather than
        sleeping until the socket wakes the loop."""
        return self._spinning

    def _fail_unsent(self, parts: list) -> None:
        """Answer the requests of a turn's message the link could not take (their rids read back
        from its records: this path is rare, the request path keeps no list of its own)."""
        error = Unavailable(f"the link to the broker at {self.address} already holds {self.hwm} messages the broker "
                            "has not read; the request was not sent")
        log.warning("%s", error)
        position = 0
        while position < len(parts):
            message = read_record(parts[position])[0]
            position += 1 + message.external
            if not isinstance(message, (Infer, Control)):   # a HEARTBEAT or HELLO: nobody waits on it
                continue
            rid = message.rid
            if self.slots is not None:
                self.slots.release(rid)
            deliver = self._pending.pop(rid, None)
            if deliver is not None:
                _call(deliver, error)
            elif (deliver := self._streams.pop(rid, None)) is not None:
                _call(deliver, error)

    def _fail_waiting(self, error: TritiumError, gone: bool = True) -> None:
        """Answer every request waiting with ``error``. ``gone``: the broker that held them is gone
        (restarted, or this gateway is closing), so their tensors' slots are free; a broker only
        silent may still run them, and their slots are freed as their answers come (those of the
        requests held here, never sent, at once)."""
        self._lone_in_a_row = 0
        pending, self._pending = self._pending, {}
        streams, self._streams = self._streams, {}
        held, self._held = self._held, []
        if gone and self.slots is not None:
            self.slots.release_all()
        elif self.slots is not None:
            for rid, _, _ in held:
                self.slots.release(rid)
        for deliver in [*pending.values(), *streams.values()]:
            _call(deliver, error)

    # -- liveness -----------------------------------------------------------------------

    def _beat(self) -> None:
        self._beat_handle = self.loop.call_later(self.heartbeat_interval_s, self._beat)
        self._send_heartbeat()
        now = self.loop.time()
        self._last_heard = min(now, self._last_heard + own_stall(self._last_beat, now, self.heartbeat_interval_s))
        self._last_beat = now
        silent_s = now - self._last_heard
        if not self.broker_lost and silent_s > max(self.heartbeat_interval_s, self._broker_interval) * MISSED_HEARTBEATS:
            self.broker_lost = True
            log.error("the broker at %s has not answered for %.1f s; failing %d request(s) waiting on it",
                      self.address, silent_s, self.waiting)
            self._fail_waiting(self.lost_error(), gone=False)

    def _send_heartbeat(self) -> None:
        pools = None if self.slots is None else [("request", *self.slots.usage())]
        unsent = self._held[0][0] if self._held else self._next_rid
        self._post(Heartbeat(heartbeat_s=self.heartbeat_interval_s, role=Role.GATEWAY,
                             protocol_version=PROTOCOL_VERSION, pools=pools, next_rid=unsent,
                             holding=self.holding, boot=self.broker_boot if self.holding else None).encode())

    def lost_error(self) -> Unavailable:
        return Unavailable(f"lost contact with the broker at {self.address}; the request was not answered")

    def _heard_broker(self, beat: Heartbeat) -> None:
        boot = beat.boot
        if self.broker_boot is not None and boot != self.broker_boot:
            self._previous_broker_gone(beat.since)
            self._send_held()
        self.broker_boot = boot
        self._broker_interval = beat.heartbeat_s or 0.0
        if beat.draining and not self.holding:   # a new process may drain already
            self.holding = True
            log.info("the broker at %s drains: new requests wait for the next broker process", self.address)
            self._send_heartbeat()   # tells it that what this gateway sent before has arrived

    def _previous_broker_gone(self, since: int | None) -> None:
        """A new broker process answers: the requests the previous one held are lost. Those it got
        itself (from ``since`` on: the link sends in rid order over one connection at a time) are
        its to answer, held while it takes the running instances over."""
        error = Unavailable(f"the broker at {self.address} restarted; the request was lost")
        if since is None:   # a broker that does not say
            log.warning("the broker restarted; failing %d request(s) the previous one held", self.waiting)
            self._fail_waiting(error)
            return
        lost = [rid for rid in [*self._pending, *self._streams] if rid < since]
        log.warning("the broker restarted; failing %d request(s) the previous one held, %d sent to the new one "
                    "wait for it", len(lost), self.waiting - len(lost))
        if self.slots is not None:   # those failed already on lost contact too: no process will read them
            self.slots.release_below(since)
        for rid in lost:
            deliver = self._pending.pop(rid, None) or self._streams.pop(rid, None)
            if deliver is not None:
                _call(deliver, error)
        self._lone_in_a_row = 0

    def _send_held(self) -> None:
        """The next broker process answers: the requests held while the previous one drained go to it."""
        held, self._held = self._held, []
        self.holding = False
        if held:
            log.info("sending the %d request(s) held while the broker restarted", len(held))
        for _, record, external in held:
            self._post(record, external)

    def next_rid(self) -> int:
        """The number of a new request (INFER or CONTROL): its answer comes back with it. Numbers
        rise in the order requests are sent, which is what lets a new broker process tell the
        gateway where its predecessor's requests end."""
        rid = self._next_rid
        self._next_rid = rid + 1
        return rid

    def request(self, request: Infer | Control, inline=(), external=()) -> asyncio.Future:
        """Send INFER or CONTROL (numbered by ``next_rid``); the future resolves to the broker's Reply."""
        future = self.loop.create_future()
        self.request_then(request, inline, external, partial(_settle, future))
        return future

    def request_then(self, request: Infer | Control, inline, external, deliver: Deliver) -> None:
        """Send INFER or CONTROL; ``deliver`` is called once, with the Reply or an error.

        The inference hot path: no future and no task per request, the answer is handled
        in the same event-loop turn that reads it.
        """
        if self.broker_lost:
            deliver(self.lost_error())
            return
        self._pending[self._send_request(request, inline, external)] = deliver
        self._send_early()

    def request_stream_then(self, request: Infer, inline, external, deliver: Deliver) -> None:
        """Send an INFER answered 0..N times: ``deliver`` gets each Reply as it comes, the last one
        ``final``, or one error that ends it."""
        if self.broker_lost:
            deliver(self.lost_error())
            return
        self._streams[self._send_request(request, inline, external)] = deliver
        self._send_early()

    def cancel(self, rid: int, model: str, version: int) -> None:
        """Tell the broker the client of request ``rid`` gave up on it. Its answer still comes
        (CANCELLED, or its result if it was running) and is delivered as any other."""
        if self._held and self._drop_held(rid):
            return
        if rid in self._pending or rid in self._streams:
            self._post(Cancel(rid, model, version).encode())

    def _drop_held(self, rid: int) -> bool:
        """A request held for the next broker process, given up: answered CANCELLED here, never sent."""
        for index, (held_rid, _, _) in enumerate(self._held):
            if held_rid == rid:
                del self._held[index]
                if self.slots is not None:
                    self.slots.release(rid)
                deliver = self._pending.pop(rid, None) or self._streams.pop(rid, None)
                if deliver is not None:   # answered after the caller's own give-up path has run, as from a broker
                    self.loop.call_soon(_call, deliver, Cancelled.by_client())
                return True
        return False

    def _send_request(self, request: Infer | Control, inline, external) -> int:
        """Queue the request for this turn's send; return its rid."""
        self._alone_rid = 0 if self.waiting else request.rid
        record = request.encode(inline)
        if external and self.slots is not None:
            external = self.slots.place(request.rid, external)
        if self.holding:
            self._held.append((request.rid, record, external))
        else:
            self._post(record, external)
            self._outbox_requests += 1
        return request.rid

    def _send_early(self) -> None:
        """Once ``send_every`` requests wait in this turn's message, it goes now (called once the
        last is registered: a send the link refuses answers each of them)."""
        if self.send_every and self._outbox_requests >= self.send_every:
            self._send_outbox()   # the turn's end sends what comes after

    def _post(self, record: bytes, external=()) -> None:
        if not self._outbox:
            self.loop.call_soon(self._flush)
        self._outbox.append(record)
        self._outbox.extend(external)

    def _flush(self) -> None:
        """The turn's end: its messages not sent yet go to the broker; then, while requests come
        one at a time, the link polls for the answer (the request may have left early)."""
        if self._outbox and not self._send_outbox():
            return
        if not self._drain_scheduled and self.spin_s and 0 < self.waiting <= POLL_WHILE_AT_MOST \
                and self.one_at_a_time:
            self._poll()

    def _send_outbox(self) -> bool:
        """Send the messages posted since the last send as one; False when the broker is out of reach."""
        parts, self._outbox = self._outbox, []
        self._outbox_requests = 0
        try:
            self.sock.send_parts(parts, zmq.NOBLOCK)   # a libzmq socket would block the event loop at its high-water mark
        except zmq.Again:   # the broker out of reach, not yet declared lost, and hwm turns queued for it
            self._fail_unsent(parts)
            return False
        # libzmq's fd is edge-triggered: a send may have consumed the readiness edge.
        if not self._drain_scheduled and self.sock.edge_triggered and self.sock.has_message():
            self._drain_scheduled = True
            self.loop.call_soon(self._drain)
        return True

    def _count_lone(self, rid: int) -> None:
        """Request ``rid`` was (finally) answered: one more in a row that was out alone, or none."""
        alone = rid == self._alone_rid and not self.waiting
        self._lone_in_a_row = self._lone_in_a_row + 1 if alone else 0

    @property
    def one_at_a_time(self) -> bool:
        """Whether requests come one at a time (the last ones were each out alone, from their send
        to their answer): polling pays then; under load an answer is usually queued before the
        loop looks."""
        return self._lone_in_a_row >= LONE_ANSWERS_BEFORE_POLLING

    def _poll(self) -> None:
        """Poll for ``spin_s`` from now (``_spin``)."""
        self._spin_until = time.perf_counter() + self.spin_s   # loop.time() counts whole milliseconds
        if not self._spinning:
            self._spinning = True
            self.loop.call_soon(self._spin)

    def _spin(self) -> None:
        """Poll for the answers to what was just sent (or, after a lone answer, for the client's
        next request), one check per event-loop turn.

        While a callback is ready the event loop polls its descriptors without blocking, so
        HTTP and gRPC connections are served between checks; the CPU is yielded between them,
        and the polling stops as soon as another thread takes it. Sleeping instead would cost
        a wake-up when the answer comes.
        """
        if not self._drain_scheduled and self.sock.has_message():
            self._drain()   # perhaps a heartbeat, not the answer: then the polling goes on
        if self.waiting <= POLL_WHILE_AT_MOST and time.perf_counter() < self._spin_until and cpu_is_free():
            self.loop.call_soon(self._spin)
        else:
            self._spinning = False

    def _drain(self) -> None:
        self._drain_scheduled = False
        if self._rest is not None:
            return   # a message is half handled: its rest first, then the socket (_handle_rest)
        sock = self.sock
        while self._rest is None:
            try:
                parts = sock.recv_parts()
            except zmq.Again:
                return
            self._last_heard = self.loop.time()
            if self.broker_lost:
                self.broker_lost = False
                log.info("the broker at %s answers again", self.address)
            self._dispatch_safely(parts, 0)

    def _handle_rest(self) -> None:
        """The rest of a message whose answers took a slice: what the loop read meanwhile (the
        clients' next requests) goes to the broker first."""
        rest, self._rest = self._rest, None
        if rest is None:
            return   # the link closed meanwhile
        parts, position = rest
        if self._outbox:
            self._send_outbox()
        self._dispatch_safely(parts, position)
        if self._rest is None:
            self._drain()

    def _dispatch_safely(self, parts: list, position: int) -> None:
        try:
            self._dispatch(parts, position)
        except TritiumError as exc:
            log.warning("dropped a message from the broker: %s", exc)
        except Exception:
            log.exception("error handling a message from the broker")

    def _dispatch(self, parts: list, position: int) -> None:
        slice_ends = time.perf_counter() + ANSWER_SLICE_S
        while position < len(parts):
            if time.perf_counter() > slice_ends and self.waiting <= len(parts) - position:
                # Nothing else is out at the broker (all that waits may be in this message), so
                # its instances idle while these answers are written: let the loop read the
                # requests that came meanwhile and send them on before the rest.
                self._rest = (parts, position)
                self.loop.call_soon(self._handle_rest)
                return
            message, record, offset = read_record(parts[position])
            external = parts[position + 1:position + 1 + message.external]
            position += 1 + message.external
            if isinstance(message, Response):
                if self.slots is not None and self.slots.holding and message.final is not False:
                    self.slots.release(message.rid)   # read by its instance, whether anyone still waits or not
                streamed = self._streams.get(message.rid)
                if streamed is not None:
                    if message.final is not False:
                        del self._streams[message.rid]
                        self._count_lone(message.rid)
                    _call(streamed, Reply(message, record, offset, external))
                    if self.spin_s and self.one_at_a_time:
                        # the stream's next response, or its client's next request, is likely on its way
                        self._poll()
                    continue
                self._answered(Reply(message, record, offset, external))
            elif isinstance(message, ControlReply):
                self._answered(Reply(message, record, offset, external))
            elif isinstance(message, Heartbeat):
                self._heard_broker(message)
            elif isinstance(message, Models):
                self.models.update(message)
                self.shared_memory.apply(message.shared_memory)
                self.on_trace_settings(message.trace)
                self._models_received.set()
            elif isinstance(message, LogSettings):
                logs.apply_wire(message.settings)
            elif isinstance(message, Refused):
                log.error("the broker refused this gateway: %s", message.reason)
                if not self.refused.done():
                    self.refused.set_result(message.reason)

    def _answered(self, reply: Reply) -> None:
        rid = reply.message.rid
        deliver = self._pending.pop(rid, None)
        if deliver is None:
            return
        self._count_lone(rid)   # before the answer is delivered, which may send (a trace's TRACE_DONE)
        _call(deliver, reply)
        if self.spin_s and self.one_at_a_time:
            # The client's next request is likely on its way, and while the loop polls, the
            # connections are read without a wake-up.
            self._poll()


# How long a message's answers are handed out before the event loop reads its connections again,
# when nothing else is out at the broker. Writing an answer wakes its client, which on a busy
# machine may take the gateway's CPU before the next write; a message of many answers then takes
# milliseconds, and the requests those clients send meanwhile would wait for its end and reach
# the broker all together, while the broker and the instances had nothing to do.
ANSWER_SLICE_S = 400e-6


def _call(deliver: Deliver, outcome: "Reply | TritiumError") -> None:
    """One request's answer; its failure must not cost the answers after it in the message."""
    try:
        deliver(outcome)
    except Exception:
        log.exception("error answering a request")
