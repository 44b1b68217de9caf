"""The gateway's broker link, in-process, against a scripted broker.

The test binds a ROUTER on ``ipc://`` where the broker would be and answers what the
link sends in the order it chooses, falls silent, or is replaced by a new socket (a
broker restarted at the same address), so that matching answers to callers, liveness
and registering again are asserted on values.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from tritium.gateway.broker_link import ANSWER_SLICE_S, BrokerLink, BrokerRefused, Reply
from tests.scripted_peers import ScriptedBroker, at_least, ipc_address
from tritium.errors import Cancelled, NotFound, Unavailable
from tritium.protocol import (
    MISSED_HEARTBEATS,
    PROTOCOL_VERSION,
    Control,
    ControlReply,
    Heartbeat,
    IndexQuery,
    Infer,
    Kind,
    ModelRow,
    Models,
    Refused,
    Reset,
    Response,
    VersionRow,
)

HEARTBEAT_S = 0.1
CONFIG = {"name": "m", "backend": "python", "max_batch_size": 8,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}


def table(generation: int, *models: tuple[str, str]) -> Models:
    """A MODELS push: each (name, state of its version 1)."""
    return Models(generation, tuple(ModelRow(name, None, (VersionRow(1, state, "", True),), dict(CONFIG, name=name), None)
                                    for name, state in models), True, ())


class Gateway:
    """A BrokerLink on its own event loop, and the scripted broker it talks to."""

    def __init__(self, spin_s: float = 0.0, heartbeat_s: float = HEARTBEAT_S, hwm: int = 100_000,
                 pool_bytes: int = 1 << 20, send_every: int = 0) -> None:
        self.address, self.folder = ipc_address("frontend")
        self.broker = ScriptedBroker(self.address)
        self.loop = asyncio.new_event_loop()
        self.link = BrokerLink(self.address, self.loop, heartbeat_interval_s=heartbeat_s, spin_s=spin_s, hwm=hwm,
                               pool_bytes=pool_bytes, send_every=send_every)
        self.peer = self.link.identity.encode()
        self.broker_hb = HEARTBEAT_S        # the interval the broker's heartbeats announce
        self._answered: list = []   # the INFER records requests() returned already

    def run(self, coroutine, timeout_s: float = 5.0):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))

    async def until(self, condition, what: str = "it", timeout_s: float = 5.0):
        """Let the loop run and the broker read until ``condition()`` is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while not (value := condition()):
            assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
            await asyncio.sleep(0.002)
            self.broker.pump()
        return value

    async def unconnected(self, timeout_s: float = 5.0) -> None:
        """Let the loop run until the link has seen its broker's socket close."""
        deadline = time.monotonic() + timeout_s
        while self.link.sock.connected:
            assert time.monotonic() < deadline, "the link did not see its broker go"
            await asyncio.sleep(0.002)

    def greet(self, boot: int = 1, since: int | None = None) -> None:
        """The broker's answer to a HELLO (or to a heartbeat of a gateway it does not know);
        it heartbeats from now on."""
        self.broker.keep_beating(self.peer, boot, self.broker_hb, every=HEARTBEAT_S, since=since)
        self.broker.pump()
        self.broker.tell(self.peer, table(1, ("m", "READY")))

    async def started(self) -> None:
        starting = asyncio.ensure_future(self.link.start(5))
        await self.until(lambda: self.broker.of(Kind.HELLO, self.peer), "the HELLO")
        self.greet()
        await starting

    async def requests(self, count: int) -> list:
        """The INFER records of the next ``count`` requests, once the broker has them all."""
        records = (await self.until(lambda: at_least(count, [
            r for r in self.broker.received if r.kind == Kind.INFER and r not in self._answered]), f"{count} INFER"))[:count]
        self._answered.extend(records)
        return records

    def close(self) -> None:
        self.link.close()
        self.broker.close()
        self.loop.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def gateway():
    gateway = Gateway()
    yield gateway
    gateway.close()


def infer(link: BrokerLink, tag: str) -> asyncio.Future:
    return link.request(Infer(link.next_rid(), "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1,
                              request_id=tag), [tag.encode().ljust(16, b".")])


def response(rid: int, tag: str, final: bool | None = None) -> bytes:
    """A RESPONSE whose parameter and output bytes name the request it answers."""
    answer = Response(rid, [["Y", "BYTES", [1], 16, False]], params={"for": tag}, final=final)
    return answer.encode([tag.encode().ljust(16, b"!")])


def output_bytes(reply: Reply) -> bytes:
    return bytes(reply.record[reply.offset:reply.offset + 16])


def test_start_says_hello_and_waits_for_the_first_model_table(gateway):
    async def scenario():
        starting = asyncio.ensure_future(gateway.link.start(5))
        hello = (await gateway.until(lambda: gateway.broker.of(Kind.HELLO, gateway.peer), "the HELLO"))[0]
        await gateway.until(lambda: len(gateway.broker.of(Kind.HEARTBEAT, gateway.peer)) >= 2, "two heartbeats")
        waited = starting.done()
        gateway.greet(boot=4)
        await starting
        return hello, waited

    hello, waited = gateway.run(scenario())
    assert hello == {"k": Kind.HELLO, "role": "gateway", "pv": PROTOCOL_VERSION, "hb": HEARTBEAT_S}
    assert not waited   # no table yet: start() still waits
    assert gateway.link.broker_boot == 4 and gateway.link.models.generation == 1
    assert gateway.link.models.get("m").ready_versions == (1,)


def test_a_broker_that_refuses_the_gateway_ends_its_start_with_the_reason(gateway):
    reason = "protocol version 6 is not this broker's 7"

    async def scenario():
        starting = asyncio.ensure_future(gateway.link.start(5))
        await gateway.until(lambda: gateway.broker.of(Kind.HELLO, gateway.peer), "the HELLO")
        gateway.broker.tell(gateway.peer, Refused(reason))
        with pytest.raises(BrokerRefused, match=reason):
            await starting
        return gateway.link.refused.result()

    assert gateway.run(scenario()) == reason


def test_a_refusal_after_start_is_told_to_the_gateway_once(gateway):
    async def scenario():
        await gateway.started()
        assert not gateway.link.refused.done()
        gateway.broker.tell(gateway.peer, Refused("first"))
        gateway.broker.tell(gateway.peer, Refused("second"))
        return await asyncio.wait_for(asyncio.shield(gateway.link.refused), 5)

    assert gateway.run(scenario()) == "first"


def test_answers_in_any_order_reach_the_request_they_answer(gateway):
    tags = ["a", "b", "c", "d", "e"]

    async def scenario():
        await gateway.started()
        futures = [infer(gateway.link, tag) for tag in tags]
        sent = await gateway.requests(len(tags))
        by_tag = {r.header["id"]: r.header["rid"] for r in sent}
        assert len(set(by_tag.values())) == len(tags)   # each request its own number
        gateway.broker.send(gateway.peer, Response(10_000, params={"for": "nobody"}).encode())
        gateway.broker.send(gateway.peer, response(by_tag["d"], "d"), response(by_tag["a"], "a"))   # two in one
        for tag in ("e", "b", "c"):
            gateway.broker.send(gateway.peer, response(by_tag[tag], tag))
        return await asyncio.gather(*futures)

    replies = gateway.run(scenario())
    assert [r.message.params["for"] for r in replies] == tags
    assert [output_bytes(r) for r in replies] == [tag.encode().ljust(16, b"!") for tag in tags]
    assert gateway.link.waiting == 0


@pytest.mark.parametrize("send_every, messages", [(0, [7]), (3, [3, 3, 1]), (7, [7]), (1, [1] * 7)])
def test_a_turns_requests_go_to_the_broker_as_many_at_a_time_as_told(send_every, messages):
    gateway = Gateway(send_every=send_every)
    tags = [f"r{n}" for n in range(7)]

    async def scenario():
        await gateway.started()
        futures = [infer(gateway.link, tag) for tag in tags]   # one turn: the loop does not run in between
        time.sleep(0.2)   # (still the same turn) what left early is at the broker now
        early = [r for r in gateway.broker.pump() if r.kind == Kind.INFER]
        sent = await gateway.requests(len(tags))
        for record in sent:
            gateway.broker.send(gateway.peer, response(record.header["rid"], record.header["id"]))
        return early, sent, await asyncio.gather(*futures)

    try:
        early, sent, replies = gateway.run(scenario())
    finally:
        gateway.close()
    sizes = [sum(1 for r in sent if r.message == number) for number in sorted({r.message for r in sent})]
    assert sizes == messages
    assert len(early) == (len(tags) // send_every * send_every if send_every else 0)
    assert [r.header["id"] for r in sent] == tags   # in the order read
    assert [r.message.params["for"] for r in replies] == tags


def test_a_request_given_up_on_is_cancelled_once_and_still_gets_its_answer(gateway):
    async def scenario():
        await gateway.started()
        asked = infer(gateway.link, "a")
        (sent,) = await gateway.requests(1)
        rid = sent.header["rid"]
        gateway.link.cancel(rid, "m", 1)
        (cancel,) = await gateway.until(lambda: [r for r in gateway.broker.received if r.kind == Kind.CANCEL])
        gateway.broker.tell(gateway.peer, Response(rid, error=Cancelled("the client cancelled the request")))
        reply = await asked
        gateway.link.cancel(rid, "m", 1)   # answered already: nothing to tell the broker
        await asyncio.sleep(0.05)
        return cancel.header, reply, [r for r in gateway.broker.received if r.kind == Kind.CANCEL]

    cancel, reply, cancels = gateway.run(scenario())
    assert cancel == {"k": Kind.CANCEL, "rid": reply.message.rid, "m": "m", "v": 1}
    assert reply.message.error.message == "the client cancelled the request"
    assert len(cancels) == 1 and gateway.link.waiting == 0


def test_a_control_request_gets_its_reply(gateway):
    async def scenario():
        await gateway.started()
        asked = gateway.link.request(Control(gateway.link.next_rid(), IndexQuery(ready=True)))
        (control,) = await gateway.until(lambda: [r for r in gateway.broker.received if r.kind == Kind.CONTROL])
        gateway.broker.tell(gateway.peer, ControlReply(control.header["rid"],
                                                       [{"name": "m", "version": "1", "state": "READY"}]))
        return control.header, await asked

    control, reply = gateway.run(scenario())
    assert control["args"] == {"op": "index", "ready": True}
    assert reply.message == ControlReply(control["rid"], [{"name": "m", "version": "1", "state": "READY"}])


def test_a_stream_gets_every_part_in_order_and_ends_with_the_final_one(gateway):
    async def scenario():
        await gateway.started()
        gateway.link.request_stream_then(Infer(gateway.link.next_rid(), "m", [], version=1, batch_size=1), (), (),
                                         answers.append)
        (sent,) = await gateway.requests(1)
        rid = sent.header["rid"]
        gateway.broker.send(gateway.peer, response(rid, "one", final=False))
        gateway.broker.send(gateway.peer, response(rid, "two", final=False), response(rid, "end", final=True))
        gateway.broker.send(gateway.peer, response(rid, "late"))   # after the final one: nobody waits
        await gateway.until(lambda: len(answers) == 3, "three answers")

    answers: list = []
    gateway.run(scenario())
    gateway.run(gateway.until(lambda: gateway.broker.of(Kind.HEARTBEAT, gateway.peer)))
    assert [answer.message.params["for"] for answer in answers] == ["one", "two", "end"]
    assert gateway.link.waiting == 0


def test_a_silent_broker_fails_each_request_once_and_new_ones_at_once_until_it_answers_again(gateway):
    lost = f"lost contact with the broker at {gateway.address}; the request was not answered"
    outcomes: list = []

    async def scenario():
        await gateway.started()
        gateway.link.request_then(Infer(gateway.link.next_rid(), "m", [], version=1, batch_size=1), (), (),
                                  outcomes.append)
        (held,) = await gateway.requests(1)
        gateway.broker.stop_beating()
        gateway.broker.tell(gateway.peer, Heartbeat(1, HEARTBEAT_S))   # the last word
        silent_since = time.monotonic()
        await gateway.until(lambda: outcomes, "the failure")
        noticed_after = time.monotonic() - silent_since
        refused = infer(gateway.link, "while-lost")
        assert refused.done()   # at once, without waiting on the broker
        gateway.broker.send(gateway.peer, response(held.header["rid"], "late"))   # too late: nobody waits
        gateway.broker.keep_beating(gateway.peer, 1, HEARTBEAT_S)
        await gateway.until(lambda: not gateway.link.broker_lost, "the broker heard again")
        served = infer(gateway.link, "after")
        (sent,) = await gateway.requests(1)
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "after"))
        return noticed_after, refused.exception(), await served

    noticed_after, refused, served = gateway.run(scenario())
    # after MISSED_HEARTBEATS intervals of silence, not before (and not much after, load allowing)
    assert HEARTBEAT_S * MISSED_HEARTBEATS <= noticed_after <= HEARTBEAT_S * MISSED_HEARTBEATS + 1.0
    assert len(outcomes) == 1 and isinstance(outcomes[0], Unavailable) and outcomes[0].message == lost
    assert isinstance(refused, Unavailable) and refused.message == lost
    assert served.message.params["for"] == "after"


def test_large_tensors_wait_in_the_pool_until_their_request_is_answered(gateway):
    """The scripted broker is libzmq's, which reads no pools: the tensors reach it as bytes."""
    tensors = {tag: os.urandom(100_000 + index) for index, tag in enumerate(["a", "b", "c", "d"])}
    outcomes: list = []

    def large(tag: str, stream: bool = False) -> None:
        request = Infer(gateway.link.next_rid(), "m", [["X", "UINT8", [1, len(tensors[tag])], len(tensors[tag]), True]],
                        version=1, batch_size=1, request_id=tag, external=1)
        send = gateway.link.request_stream_then if stream else gateway.link.request_then
        send(request, (), [memoryview(tensors[tag])], outcomes.append)

    async def scenario():
        await gateway.started()
        for tag in "ab":
            large(tag)
        large("c", stream=True)
        sent = await gateway.requests(3)
        in_use = [gateway.link.slots.pool.in_use]
        rid = {r.header["id"]: r.header["rid"] for r in sent}
        gateway.broker.send(gateway.peer, response(rid["a"], "a"))
        gateway.broker.send(gateway.peer, response(rid["c"], "c", final=False))
        await gateway.until(lambda: len(outcomes) == 2, "two answers")
        in_use.append(gateway.link.slots.pool.in_use)
        gateway.broker.send(gateway.peer, response(rid["c"], "c", final=True))
        await gateway.until(lambda: len(outcomes) == 3, "the stream's end")
        in_use.append(gateway.link.slots.pool.in_use)
        gateway.broker.stop_beating()                   # "b" is failed when the broker falls silent...
        await gateway.until(lambda: len(outcomes) == 4, "the failure", timeout_s=10)
        in_use.append(gateway.link.slots.pool.in_use)   # ...but a silent broker may still run it: its slot is kept
        gateway.broker.send(gateway.peer, response(rid["b"], "b"))   # its late answer: read, nobody waits
        gateway.broker.keep_beating(gateway.peer, 1, HEARTBEAT_S)
        await gateway.until(lambda: gateway.link.slots.pool.in_use == 0, "the late answer")
        in_use.append(gateway.link.slots.pool.in_use)
        large("d")
        await gateway.requests(1)
        in_use.append(gateway.link.slots.pool.in_use)
        gateway.broker.keep_beating(gateway.peer, 2, HEARTBEAT_S)   # a new broker process: what the old one held is gone
        await gateway.until(lambda: len(outcomes) == 5, "the restart's failure")
        in_use.append(gateway.link.slots.pool.in_use)
        return in_use

    in_use = gateway.run(scenario(), timeout_s=15)
    assert in_use == [3, 2, 1, 1, 0, 1, 0]
    received = {r.header["id"]: r.external for r in gateway.broker.received if r.kind == Kind.INFER}
    assert received == {tag: (tensors[tag],) for tag in "abcd"}


def test_a_tensor_the_full_pool_has_no_room_for_is_sent_as_bytes_and_said_once(caplog):
    gateway = Gateway(pool_bytes=2 * 128 * 1024)   # room for two tensors of 100 KB
    tensors = [os.urandom(100_000) for _ in range(4)]

    async def scenario():
        await gateway.started()
        for index, tensor in enumerate(tensors):
            gateway.link.request_then(Infer(gateway.link.next_rid(), "m", [["X", "UINT8", [1, 100_000], 100_000, True]],
                                            version=1, batch_size=1, request_id=str(index), external=1),
                                      (), [tensor], lambda outcome: None)
        await gateway.requests(4)

    try:
        gateway.run(scenario())
        received = {r.header["id"]: r.external for r in gateway.broker.received if r.kind == Kind.INFER}
        assert received == {str(index): (tensor,) for index, tensor in enumerate(tensors)}
        assert gateway.link.slots.pool.in_use == 2
        full = [r.message for r in caplog.records if "tensor pool" in r.message]
        assert full == ["the shared tensor pool (--tensor-pool-mb, 0.25 MiB) is full: large tensors cross the local "
                        "sockets as bytes until the requests holding it are answered (said at most once a minute; "
                        "tritium_tensor_pool_overflows_total counts each such tensor)"]
    finally:
        gateway.close()


@pytest.mark.parametrize("send_every", [0, 1], ids=["sent at the turn's end", "sent at once"])
@pytest.mark.parametrize("links", ["zmtp", "libzmq"])
def test_requests_the_link_cannot_queue_for_an_unreachable_broker_fail_at_once(links, send_every, monkeypatch):
    if links == "libzmq":
        monkeypatch.setenv("TRITIUM_LIBZMQ_LINKS", "1")
    gateway = Gateway(heartbeat_s=10.0, hwm=4, send_every=send_every)   # no heartbeats of its own meanwhile
    gateway.broker_hb = 10.0                     # and a broker that is not called lost for 30 s
    queued: list[asyncio.Future] = []

    async def scenario():
        await gateway.started()
        gateway.broker.close()   # gone, nobody at the address: what the link sends waits for it
        await asyncio.sleep(0.05)
        for turn in range(12):   # one message per event-loop turn
            queued.append(infer(gateway.link, f"turn-{turn}"))
            await asyncio.sleep(0.01)
        return [future.done() for future in queued], gateway.link.waiting

    try:
        done, waiting = gateway.run(scenario())
        # the first turns' messages wait for the broker (the high-water mark's 4 on tritium's own
        # link, a message or two more gone into the dying connection; libzmq counts its own way);
        # every later one fails at once, with the reason, and the event loop never blocks on the link
        fewest = 4 if links == "zmtp" else 1
        assert done == sorted(done) and fewest <= done.count(False) <= 6 and waiting == done.count(False)
        refused = [future.exception() for future in queued if future.done()]
        assert {type(error) for error in refused} == {Unavailable}
        assert {error.message for error in refused} == {
            f"the link to the broker at {gateway.address} already holds 4 messages the broker has not read; "
            "the request was not sent"}
    finally:
        gateway.close()
        for future in queued:   # those still waiting fail as the gateway shuts down
            future.exception()


def test_the_link_reconnects_to_a_broker_restarted_at_its_address_and_registers_by_heartbeat(gateway):
    gateway.broker_hb = 2.0   # the link waits 3 x 2 s before calling it lost: the restart is what it sees

    async def scenario():
        await gateway.started()
        held = infer(gateway.link, "held")
        await gateway.requests(1)
        gateway.broker.close()   # the broker process is gone, and a new one binds the address
        await gateway.unconnected()
        meanwhile = infer(gateway.link, "meanwhile")   # sent while no broker listens: the new one gets it
        gateway.broker = ScriptedBroker(gateway.address)
        beat = (await gateway.until(lambda: gateway.broker.of(Kind.HEARTBEAT, gateway.peer), "a heartbeat"))[0]
        (kept,) = await gateway.requests(1)
        gateway.greet(boot=2, since=kept.header["rid"])   # the new broker registers the gateway it heard
        await asyncio.wait([held], timeout=2)
        failure = held.exception()
        waited = meanwhile.done()
        gateway.broker.send(gateway.peer, response(kept.header["rid"], "meanwhile"))
        served = infer(gateway.link, "new")
        (sent,) = await gateway.requests(1)
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "new"))
        return beat, kept, failure, waited, await meanwhile, await served

    beat, kept, failure, waited, meanwhile, served = gateway.run(scenario())
    assert beat == {"k": Kind.HEARTBEAT, "role": "gateway", "pv": PROTOCOL_VERSION, "hb": HEARTBEAT_S,
                    "pl": [["request", 1 << 20, 0, 0, 0]],   # its pool for large inputs: 1 MiB, none held
                    "nr": 3}   # "held" was 1, "meanwhile" 2: every request before the heartbeat is below 3
    assert kept.header["rid"] == 2 and kept.header["id"] == "meanwhile"
    assert isinstance(failure, Unavailable)
    assert failure.message == f"the broker at {gateway.address} restarted; the request was lost"
    assert not waited, "the request the new broker got waits for its answer"
    assert meanwhile.message.params["for"] == "meanwhile" and output_bytes(meanwhile) == b"meanwhile!!!!!!!"
    assert served.message.params["for"] == "new" and gateway.link.broker_boot == 2


def test_while_the_broker_drains_new_requests_wait_in_the_gateway_and_go_to_the_next_broker_process(gateway):
    gateway.broker_hb = 2.0   # the restart is shorter than the link's patience

    async def scenario():
        await gateway.started()
        before = infer(gateway.link, "before")
        (first,) = await gateway.requests(1)
        beats = len(gateway.broker.of(Kind.HEARTBEAT, gateway.peer))
        gateway.broker.tell(gateway.peer, Heartbeat(1, 2.0, draining=True))   # SIGTERM: the broker drains
        confirmed = (await gateway.until(lambda: gateway.broker.of(Kind.HEARTBEAT, gateway.peer)[beats:],
                                         "the gateway saying it holds"))[0]
        during = infer(gateway.link, "during")   # held here: the draining broker never sees it
        given_up = infer(gateway.link, "given-up")
        gateway.link.cancel(3, "m", 1)   # its client gives up while it is held
        gateway.broker.send(gateway.peer, response(first.header["rid"], "before"))
        answered_before = await before
        await asyncio.sleep(3 * HEARTBEAT_S)
        gateway.broker.pump()
        unsent = [r for r in gateway.broker.received if r.kind == Kind.INFER][1:]
        gateway.broker.close()   # the old process exits, the next one binds the address
        gateway.broker = ScriptedBroker(gateway.address)
        beat = (await gateway.until(lambda: gateway.broker.of(Kind.HEARTBEAT, gateway.peer), "a heartbeat"))[0]
        gateway.greet(boot=2, since=beat["nr"])
        (sent,) = await gateway.requests(1)
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "during"))
        await asyncio.sleep(5 * HEARTBEAT_S)
        gateway.broker.pump()
        after = [r.header["rid"] for r in gateway.broker.received if r.kind in (Kind.INFER, Kind.CANCEL)]
        return confirmed, answered_before, unsent, beat, sent, await during, given_up.exception(), after

    confirmed, answered_before, unsent, beat, sent, during, given_up, after = gateway.run(scenario())
    assert isinstance(given_up, Cancelled) and after == [2], "answered CANCELLED here, never sent"
    assert confirmed["hd"] is True and confirmed["nr"] == 2   # "before" (1) was sent before it
    assert answered_before.message.params["for"] == "before"   # the draining broker answers what it got
    assert unsent == [], "nothing is sent to a draining broker once the gateway holds"
    assert beat["nr"] == 2 and beat["hd"] is True   # "during" (2) is not sent yet
    assert sent.header["rid"] == 2 and sent.header["id"] == "during"
    assert during.message.params["for"] == "during" and not gateway.link.holding


def test_a_next_broker_process_that_drains_already_gets_the_held_requests_and_the_gateway_holds_again(gateway):
    """Two restarts in a row: the process that registers the gateway drains from its first heartbeat.
    The requests held for it go to it (it serves what came before the gateway holds), and the
    gateway holds its new requests again at once, saying so after the held ones."""
    gateway.broker_hb = 2.0

    async def scenario():
        await gateway.started()
        gateway.broker.tell(gateway.peer, Heartbeat(1, 2.0, draining=True))
        await gateway.until(lambda: gateway.link.holding, "holding")
        during = infer(gateway.link, "during")
        gateway.broker.close()
        gateway.broker = ScriptedBroker(gateway.address)
        beat = (await gateway.until(lambda: gateway.broker.of(Kind.HEARTBEAT, gateway.peer), "a heartbeat"))[0]
        gateway.broker.tell(gateway.peer, Heartbeat(2, 2.0, since=beat["nr"], draining=True))
        (sent,) = await gateway.requests(1)
        await gateway.until(lambda: [b for b in gateway.broker.of(Kind.HEARTBEAT, gateway.peer) if b["hd"]],
                            "the gateway saying it holds again")
        after = infer(gateway.link, "after")   # held for the process after this one
        await asyncio.sleep(3 * HEARTBEAT_S)
        gateway.broker.pump()
        kinds = [(r.kind, r.header.get("id"), r.header.get("boot")) for r in gateway.broker.received
                 if r.kind == Kind.INFER or (r.kind == Kind.HEARTBEAT and r.header.get("hd"))]
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "during"))
        return kinds, await during, after.done(), gateway.link.holding

    kinds, during, after_done, holding = gateway.run(scenario())
    # Before it heard the new process it still said it held, for the previous one (boot 1).
    stale = [k for k in kinds[:kinds.index((Kind.INFER, "during", None))]]
    assert stale and {k[2] for k in stale} == {1}, kinds
    assert kinds[len(stale) + 1] == (Kind.HEARTBEAT, None, 2), "holding for the new process, after the held"
    assert [k for k in kinds if k[0] == Kind.INFER] == [(Kind.INFER, "during", None)], "'after' is held"
    assert during.message.params["for"] == "during"
    assert holding and not after_done


def test_a_gateway_that_was_stopped_does_not_take_the_broker_s_silence_for_a_loss(gateway):
    """Ctrl-Z stops every process of a server at once: once continued, the gateway's beat comes
    round before any heartbeat of the broker's, and the silence it finds was its own: the request
    the broker holds is not failed for a lost contact."""
    async def scenario():
        await gateway.started()
        during = infer(gateway.link, "during")
        (sent,) = await gateway.requests(1)
        await asyncio.sleep(0.02)   # what the broker sent is read: nothing of it waits in the socket
        time.sleep(HEARTBEAT_S * MISSED_HEARTBEATS * 3)   # the loop stopped, and the broker's beats with it
        await asyncio.sleep(0.02)   # the gateway's beat comes round first
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "during"))
        await gateway.until(lambda: during.done(), "the answer")
        return during.result()

    assert gateway.run(scenario()).message.params["for"] == "during"


def test_requests_held_for_a_broker_that_never_comes_back_fail_once_contact_is_lost(gateway):
    async def scenario():
        await gateway.started()
        gateway.broker.stop_beating()
        gateway.broker.tell(gateway.peer, Heartbeat(1, HEARTBEAT_S, draining=True))
        await gateway.until(lambda: gateway.link.holding, "holding")
        held = infer(gateway.link, "held")
        await asyncio.wait([held], timeout=HEARTBEAT_S * MISSED_HEARTBEATS + 2)
        return held.exception()

    failure = gateway.run(scenario())
    assert failure.message == f"lost contact with the broker at {gateway.address}; the request was not answered"
    assert [r for r in gateway.broker.received if r.kind == Kind.INFER] == []
    assert gateway.link.slots.usage()[1] == 0 and gateway.link.waiting == 0


def test_a_broker_restarted_without_saying_where_its_requests_begin_fails_every_request_waiting(gateway):
    gateway.broker_hb = 2.0

    async def scenario():
        await gateway.started()
        held = infer(gateway.link, "held")
        await gateway.requests(1)
        gateway.broker.close()
        await gateway.unconnected()
        meanwhile = infer(gateway.link, "meanwhile")
        gateway.broker = ScriptedBroker(gateway.address)
        await gateway.requests(1)
        gateway.greet(boot=2)
        await asyncio.wait([held, meanwhile], timeout=2)
        return held.exception(), meanwhile.exception()

    lost = f"the broker at {gateway.address} restarted; the request was lost"
    assert [error.message for error in gateway.run(scenario())] == [lost, lost]


def test_a_reset_from_the_broker_fails_nothing_and_the_heartbeats_register_the_gateway_again(gateway):
    async def scenario():
        await gateway.started()
        held = infer(gateway.link, "held")
        (sent,) = await gateway.requests(1)
        gateway.broker.tell(gateway.peer, Reset())
        beats = len(gateway.broker.of(Kind.HEARTBEAT, gateway.peer))
        await gateway.until(lambda: len(gateway.broker.of(Kind.HEARTBEAT, gateway.peer)) > beats + 1, "heartbeats")
        assert not held.done()
        gateway.broker.send(gateway.peer, response(sent.header["rid"], "held"))
        return await held

    assert gateway.run(scenario()).message.params["for"] == "held"
    assert all(b["pv"] == PROTOCOL_VERSION and b["role"] == "gateway" for b in gateway.broker.of(Kind.HEARTBEAT))


def test_a_models_push_replaces_the_model_table(gateway):
    async def scenario():
        await gateway.started()
        gateway.broker.tell(gateway.peer, table(2, ("n", "READY"), ("m", "UNLOADING")))
        await gateway.until(lambda: gateway.link.models.generation == 2, "the new table")

    gateway.run(scenario())
    models = gateway.link.models
    assert sorted(models.models) == ["m", "n"]
    assert models.get("n").ready_versions == (1,) and models.resolve("n", None)[1] == 1
    assert models.get("m").versions == {1: ("UNLOADING", "")} and models.get("m").ready_versions == ()
    with pytest.raises(NotFound):
        models.get("gone")


@pytest.fixture
def polling_gateway(monkeypatch, request):
    # The polling also stops when another thread takes the CPU, which on a test machine may come at
    # any time: a CPU that always comes straight back leaves the window as the only limit.
    monkeypatch.setattr("tritium.gateway.broker_link.cpu_is_free", lambda: True)
    # no heartbeat of its own to send (and poll after) meanwhile; the param: --gateway-send-every
    gateway = Gateway(spin_s=0.3, heartbeat_s=10.0, send_every=getattr(request, "param", 0))
    yield gateway
    gateway.close()


async def _answer_one(gateway: Gateway, tag: str, after_s: float = 0.0) -> Reply:
    future = infer(gateway.link, tag)
    (sent,) = await gateway.requests(1)
    later = time.monotonic() + after_s
    await gateway.until(lambda: time.monotonic() >= later, "the wait")   # the broker heartbeats meanwhile
    gateway.broker.send(gateway.peer, response(sent.header["rid"], tag))
    return await future


async def _one_at_a_time(gateway: Gateway) -> None:
    """Started, then two requests, one after the other, each answered alone."""
    await gateway.started()
    await _answer_one(gateway, "a")
    await _answer_one(gateway, "b")


def test_a_lone_answer_is_followed_by_polling_for_the_clients_next_request(polling_gateway):
    async def scenario():
        await polling_gateway.started()
        await _answer_one(polling_gateway, "a")
        # answered after the window of the polling for it, so that what follows is the polling after it
        reply = await _answer_one(polling_gateway, "b", after_s=0.4)
        answered = time.perf_counter()
        polling_after_answer = polling_gateway.link.polling
        await polling_gateway.until(lambda: not polling_gateway.link.polling, "the end of the polling")
        return reply, polling_after_answer, time.perf_counter() - answered

    reply, polling_after_answer, lasted = polling_gateway.run(scenario())
    assert output_bytes(reply) == b"b".ljust(16, b"!")
    assert polling_after_answer   # two requests out alone in a row: the loop polls for the client's next one
    assert 0.15 <= lasted < 2.0   # the 0.3 s window, then it sleeps


def test_a_single_lone_answer_is_not_followed_by_polling(polling_gateway):
    async def scenario():
        await polling_gateway.started()
        await _answer_one(polling_gateway, "a", after_s=0.4)   # the last of a burst, perhaps
        return polling_gateway.link.polling

    assert polling_gateway.run(scenario()) is False


@pytest.mark.parametrize("polling_gateway", [0, 1], indirect=True, ids=["sent at the turn's end", "sent at once"])
def test_once_requests_come_one_at_a_time_the_link_polls_for_the_answer(polling_gateway):
    async def scenario():
        await _one_at_a_time(polling_gateway)
        later = time.monotonic() + 0.4
        await polling_gateway.until(lambda: time.monotonic() >= later, "the end of the polling after b")
        assert not polling_gateway.link.polling
        future = infer(polling_gateway.link, "c")
        await polling_gateway.until(lambda: polling_gateway.link.polling, "the polling for c's answer")
        (sent,) = await polling_gateway.requests(1)
        polling_gateway.broker.send(polling_gateway.peer, response(sent.header["rid"], "c"))
        return await future

    assert output_bytes(polling_gateway.run(scenario())) == b"c".ljust(16, b"!")


def test_requests_out_together_are_not_one_at_a_time(polling_gateway):
    async def scenario():
        await _one_at_a_time(polling_gateway)
        assert polling_gateway.link.one_at_a_time
        futures = [infer(polling_gateway.link, tag) for tag in ("c", "d")]
        sent = await polling_gateway.requests(2)
        polling_gateway.broker.send(polling_gateway.peer, *[response(r.header["rid"], r.header["id"]) for r in sent])
        await asyncio.gather(*futures)
        after_two = polling_gateway.link.one_at_a_time   # the last of them was answered with nothing else out
        await _answer_one(polling_gateway, "e")
        return after_two, polling_gateway.link.one_at_a_time

    assert polling_gateway.run(scenario()) == (False, False)   # one request alone is not yet a run of them


def test_without_polling_a_link_sleeps_after_an_answer(gateway):
    async def scenario():
        await _one_at_a_time(gateway)
        return gateway.link.polling

    assert gateway.run(scenario()) is False


async def _stream_one(gateway: Gateway, parts: list, after_s: float = 0.0) -> list:
    """One streamed request answered alone with ``parts`` (the last final); the answers it got."""
    answers: list = []
    gateway.link.request_stream_then(Infer(gateway.link.next_rid(), "m", [], version=1, batch_size=1), (), (),
                                     answers.append)
    (sent,) = await gateway.requests(1)
    later = time.monotonic() + after_s
    await gateway.until(lambda: time.monotonic() >= later, "the wait")
    for index, tag in enumerate(parts):
        gateway.broker.send(gateway.peer, response(sent.header["rid"], tag, final=index == len(parts) - 1))
    await gateway.until(lambda: len(answers) == len(parts), "the stream's answers")
    return answers


def test_streamed_requests_answered_one_at_a_time_are_followed_by_polling(polling_gateway):
    async def scenario():
        await polling_gateway.started()
        await _stream_one(polling_gateway, ["a"])
        # answered after the window of the polling for it, so that what follows is the polling after it
        answers = await _stream_one(polling_gateway, ["b1", "b2"], after_s=0.4)
        return answers, polling_gateway.link.one_at_a_time, polling_gateway.link.polling

    answers, one_at_a_time, polling = polling_gateway.run(scenario())
    assert [answer.message.params["for"] for answer in answers] == ["b1", "b2"]
    assert one_at_a_time and polling   # as after unary answers: the client's next request is likely on its way


def test_a_streams_partial_answer_is_followed_by_polling_for_the_next_one(polling_gateway):
    async def scenario():
        await polling_gateway.started()
        await _stream_one(polling_gateway, ["a"])
        await _stream_one(polling_gateway, ["b"])
        answers: list = []
        polling_gateway.link.request_stream_then(Infer(polling_gateway.link.next_rid(), "m", [], version=1,
                                                       batch_size=1), (), (), answers.append)
        (sent,) = await polling_gateway.requests(1)
        later = time.monotonic() + 0.4   # past the polling for the first answer
        await polling_gateway.until(lambda: time.monotonic() >= later, "the end of the polling for c1")
        before = polling_gateway.link.polling
        polling_gateway.broker.send(polling_gateway.peer, response(sent.header["rid"], "c1", final=False))
        await polling_gateway.until(lambda: answers, "the first part")
        return before, polling_gateway.link.polling

    assert polling_gateway.run(scenario()) == (False, True)


def test_without_polling_a_link_sleeps_between_a_streams_answers(gateway):
    async def scenario():
        await gateway.started()
        await _stream_one(gateway, ["a"])
        await _stream_one(gateway, ["b"])
        return gateway.link.one_at_a_time, gateway.link.polling

    assert gateway.run(scenario()) == (True, False)


def _slow_message_of_answers(gateway: Gateway, others_out: int) -> list:
    """Four requests answered in one message, with ``others_out`` more requests still out; the
    first answer's delivery outlasts a slice (a write whose client took the gateway's CPU) and
    that client's next request is read after it. Per answer: whether the broker had that next
    request by the time the answer was delivered."""
    tags = ["a", "b", "c", "d"]
    seen: list = []

    def broker_has_next() -> bool:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            gateway.broker.pump()
            if any(r.header.get("id") == "next" for r in gateway.broker.received):
                return True
            time.sleep(0.005)
        return False

    def on_answer(tag: str):
        def delivered(reply) -> None:
            seen.append((tag, tag != "a" and broker_has_next()))
            if tag == "a":
                time.sleep(2 * ANSWER_SLICE_S)
                gateway.loop.call_soon(infer, gateway.link, "next")
        return delivered

    async def scenario():
        await gateway.started()
        for tag in tags:
            request = Infer(gateway.link.next_rid(), "m", [["X", "FP32", [1, 4], 16, False]], version=1,
                            batch_size=1, request_id=tag)
            gateway.link.request_then(request, [tag.encode().ljust(16, b".")], (), on_answer(tag))
        for other in range(others_out):
            infer(gateway.link, f"other{other}")
        sent = await gateway.requests(len(tags) + others_out)
        rid = {r.header["id"]: r.header["rid"] for r in sent}
        gateway.broker.send(gateway.peer, *(response(rid[tag], tag) for tag in tags))
        await gateway.until(lambda: len(seen) == len(tags), "four answers")

    gateway.run(scenario())
    return seen


def test_a_slow_message_of_answers_sends_the_requests_read_meanwhile_before_its_rest(gateway):
    assert _slow_message_of_answers(gateway, others_out=0) == [("a", False), ("b", True), ("c", True), ("d", True)]


def test_a_slow_message_of_answers_is_handled_whole_while_other_requests_are_out(gateway):
    # the broker has work then: its answers are not delayed for the requests read meanwhile
    assert _slow_message_of_answers(gateway, others_out=1) == [("a", False), ("b", False), ("c", False), ("d", False)]
