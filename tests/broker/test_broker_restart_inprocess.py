"""A broker restart seen by the gateways that live through it, in-process with scripted peers.

The old process, draining, tells its gateways so, serves what they sent before they heard
it, and exits only once each holds its new requests. The new process gets requests before
the gateways heartbeat, with the old process's model table: it tells each gateway where its
own requests begin (``since``), queues their requests for the versions it is still taking
over, and keeps its table of loading versions from them until the takeover is over.
"""

from __future__ import annotations

import time

import pytest

from tests.broker.inprocess_world import HEARTBEAT_S, World, answer, infer
from tritium.errors import Unavailable
from tritium.protocol import PROTOCOL_VERSION, Cancel, Control, Heartbeat, IndexQuery, Infer, Kind, Role, decode


def returning_heartbeat(next_rid: int) -> bytes:
    """What a gateway of the previous broker process sends: it never says HELLO again."""
    return Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION, next_rid=next_rid).encode()


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path)
    yield world
    world.close()


def test_a_returning_gateways_request_waits_for_the_version_taken_over_and_is_served(world):
    gateway = world.peer("front", b"gw-old")
    sent = infer(gateway, rid=7, value=5)   # before its first heartbeat reaches the new broker
    gateway.send(returning_heartbeat(next_rid=8))
    world.until(lambda: gateway.headers(Kind.HEARTBEAT))
    quiet = world.peer("front", b"gw-quiet")   # heartbeats before it sends anything
    quiet.send(returning_heartbeat(next_rid=3))
    world.until(lambda: quiet.headers(Kind.HEARTBEAT))
    before_ready = [h["k"] for h in gateway.headers(Kind.RESPONSE) + gateway.headers(Kind.MODELS)]

    _, instance = world.serving_instance()   # the worker host comes back; its instance says HELLO
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    answer(instance, batch, [(header, raw)])
    world.until(lambda: gateway.headers(Kind.RESPONSE) and gateway.headers(Kind.MODELS))

    assert gateway.headers(Kind.HEARTBEAT)[0]["sn"] == 7 and quiet.headers(Kind.HEARTBEAT)[0]["sn"] == 3
    assert before_ready == [], "neither an answer nor the table of loading versions while it is taken over"
    assert (header["rid"], raw) == (7, sent)
    ((response, body),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 7 and "err" not in response and body.endswith(bytes([5]) * 16)
    assert [[v[1] for v in m["versions"]] for m in gateway.headers(Kind.MODELS)[-1]["models"]] == [["READY"]]
    assert world.broker.registry.versions[("m", 1)].stats.as_dict("m", 1)["inference_stats"]["success"]["count"] == 1


def test_a_gateway_that_says_hello_gets_the_table_at_once_and_is_told_no_boundary(world):
    gateway = world.gateway()   # HELLO, and World.gateway waits for the table
    assert "sn" not in gateway.headers(Kind.HEARTBEAT)[0]
    assert [[v[1] for v in m["versions"]] for m in gateway.headers(Kind.MODELS)[-1]["models"]] == [["LOADING"]]


def test_a_returning_gateway_that_makes_a_control_call_gets_the_table_at_once(world):
    gateway = world.peer("front", b"gw-old")
    gateway.send(returning_heartbeat(next_rid=4))
    world.until(lambda: gateway.headers(Kind.HEARTBEAT))
    assert not gateway.headers(Kind.MODELS)
    gateway.send(Control(4, IndexQuery(ready=False)).encode())   # its client must see what a call did
    world.until(lambda: gateway.headers(Kind.MODELS) and gateway.headers(Kind.CONTROL_REPLY))
    assert [[v[1] for v in m["versions"]] for m in gateway.headers(Kind.MODELS)[-1]["models"]] == [["LOADING"]]


def test_when_the_hold_ends_without_the_version_what_waited_is_answered_not_ready_and_the_table_sent(world):
    gateway = world.peer("front", b"gw-old")
    infer(gateway, rid=1)
    gateway.send(returning_heartbeat(next_rid=2))
    world.until(lambda: gateway.headers(Kind.HEARTBEAT))
    world.broker.turn(5)
    gateway.collect()
    assert not gateway.headers(Kind.RESPONSE) and not gateway.headers(Kind.MODELS)
    world.broker.hold.until_ns = time.monotonic_ns()   # no worker host came back within the hold
    world.until(lambda: gateway.headers(Kind.RESPONSE) and gateway.headers(Kind.MODELS))
    ((response, _),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 1
    assert response["err"]["message"] == "Request for unknown model: 'm' version 1 is not at ready state"
    assert [[v[1] for v in m["versions"]] for m in gateway.headers(Kind.MODELS)[-1]["models"]] == [["LOADING"]]
    infer(gateway, rid=2)   # after the hold, a loading version is refused at once, as before
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    assert decode(gateway.records(Kind.RESPONSE)[1][1])[0]["rid"] == 2


def holding_heartbeat(next_rid: int, boot: int) -> bytes:
    """A gateway holding its new requests for the drain of broker process ``boot``."""
    return Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION, next_rid=next_rid,
                     holding=True, boot=boot).encode()


def test_a_draining_broker_serves_what_came_before_its_gateways_hold_and_exits_once_they_do(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    infer(gateway, rid=1, value=1)
    world.until(lambda: instance.headers(Kind.BATCH))
    world.broker.drain()
    world.until(lambda: any(h.get("dr") for h in gateway.headers(Kind.HEARTBEAT)))
    infer(gateway, rid=2, value=2)   # sent before the gateway read of the drain
    answered: set[int] = set()

    def answer_batches() -> bool:
        for message in instance.messages:
            if message[0][0]["k"] == Kind.BATCH and message[0][0]["b"] not in answered:
                answered.add(message[0][0]["b"])
                answer(instance, message[0][0], message[1:])
        return len(gateway.headers(Kind.RESPONSE)) == 2

    world.until(answer_batches)
    world.broker.turn(5)
    still_running = world.broker._running   # idle, but the gateway has not said it holds
    gateway.send(holding_heartbeat(next_rid=3, boot=world.broker.boot))
    world.until(lambda: not world.broker._running)
    assert [(h["rid"], "err" in h) for h in gateway.headers(Kind.RESPONSE)] == [(1, False), (2, False)]
    assert still_running


def test_a_draining_broker_waits_two_heartbeats_at_most_for_a_gateway_that_does_not_say_it_holds(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    infer(gateway, rid=1)
    world.until(lambda: instance.headers(Kind.BATCH))
    world.broker.drain()
    started = time.monotonic()
    world.until(lambda: time.monotonic() - started > 2 * HEARTBEAT_S + 0.05)
    infer(gateway, rid=2)   # from a gateway that never said it holds, after it had the time to
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((refused, _),) = gateway.records(Kind.RESPONSE)
    assert (refused["rid"], refused["err"]["message"]) == (2, "the server is shutting down")
    ((batch, _), *records) = [m for m in instance.messages if m[0][0]["k"] == Kind.BATCH][0]
    answer(instance, batch, records)
    world.until(lambda: not world.broker._running)
    assert [h["rid"] for h in gateway.headers(Kind.RESPONSE)] == [2, 1]


def bls_call(peer, rid: int, version: int, value: int = 3) -> None:
    peer.send(Infer(rid, "m", [["X", "FP32", [1, 4], 16, False]], version=version, batch_size=1).encode(
        [bytes([value]) * 16]))


def test_a_bls_call_made_across_the_restart_waits_for_the_version_and_its_socket_learns_where_calls_begin(world):
    """An instance's BLS socket sent a call to the new process before it heard of it: the call
    queues for the version taken over and is answered once it is READY; the socket's question gets
    the call's rid as the first the process heard on it (again when it asks again, its first
    question's answer having been meant for a process that died meanwhile), and a socket that sent
    nothing before its question gets its own ``nr`` back. A call for the latest version waits until
    the takeover decides which version that is (then goes to it); one cancelled meanwhile is
    answered CANCELLED at once."""
    bls = world.peer("back", b"instance-9/bls")
    bls_call(bls, 5, version=1)
    bls.send(Heartbeat(next_rid=6).encode())
    quiet = world.peer("back", b"instance-8/bls")
    quiet.send(Heartbeat(next_rid=3).encode())
    latest = world.peer("back", b"instance-7/bls")
    bls_call(latest, 1, version=-1, value=4)
    gone = world.peer("back", b"instance-6/bls")
    bls_call(gone, 2, version=-1)
    gone.send(Cancel(2, "m", -1).encode())
    world.until(lambda: bls.headers(Kind.HEARTBEAT) and quiet.headers(Kind.HEARTBEAT)
                and gone.headers(Kind.RESPONSE))
    assert not bls.headers(Kind.RESPONSE) and not latest.headers(Kind.RESPONSE), "answered during the takeover"
    assert gone.headers(Kind.RESPONSE)[0]["err"]["message"] == "the client cancelled the request"
    bls.send(Heartbeat(next_rid=7).encode())
    world.until(lambda: len(bls.headers(Kind.HEARTBEAT)) == 2)

    _, instance = world.serving_instance()
    answered: set[int] = set()

    def serve() -> bool:   # every batch the instance gets, answered
        for index, ((batch, _), *queued) in enumerate(instance.messages):
            if batch["k"] == Kind.BATCH and index not in answered:
                answered.add(index)
                answer(instance, batch, queued)
        return bool(bls.headers(Kind.RESPONSE) and latest.headers(Kind.RESPONSE))

    world.until(serve)
    assert sorted(header["rid"] for header in instance.headers(Kind.INFER)) == [1, 5]

    assert [(told["sn"], told["boot"]) for told in bls.headers(Kind.HEARTBEAT)] == [(5, world.broker.boot)] * 2
    assert quiet.headers(Kind.HEARTBEAT)[0]["sn"] == 3
    ((response, body),) = bls.records(Kind.RESPONSE)
    assert response["rid"] == 5 and "err" not in response and body.endswith(bytes([3]) * 16)
    ((response, body),) = latest.records(Kind.RESPONSE)
    assert response["rid"] == 1 and "err" not in response and body.endswith(bytes([4]) * 16)
    assert len(gone.headers(Kind.RESPONSE)) == 1


def test_a_latest_version_call_during_the_takeover_is_answered_not_ready_if_no_version_comes_back(world):
    """The hold ends without the version: the call for the latest version is answered as it would
    have been on arrival."""
    latest = world.peer("back", b"instance-7/bls")
    bls_call(latest, 1, version=-1)
    for _ in range(20):
        world.broker.turn(5)
        latest.collect()
    assert not latest.messages, "answered while its version was taken over"
    world.broker.hold.until_ns = 0   # the hold's time is up
    world.until(lambda: latest.headers(Kind.RESPONSE))
    assert latest.headers(Kind.RESPONSE)[0]["err"]["message"] == \
        "Model m - Error when running inference: Request for unknown model: 'm' has no available versions"


def test_a_draining_broker_exits_only_once_a_latest_version_call_waiting_for_the_takeover_is_answered(world):
    latest = world.peer("back", b"instance-7/bls")
    bls_call(latest, 1, version=-1)
    world.broker.drain()
    for _ in range(20):
        world.broker.turn(5)
        latest.collect()
    assert world.broker._running and not latest.messages
    world.broker.hold.until_ns = 0
    world.until(lambda: not world.broker._running)
    assert latest.headers(Kind.RESPONSE)[0]["err"]["message"] == \
        "Model m - Error when running inference: Request for unknown model: 'm' has no available versions"


def test_a_broker_forced_to_exit_answers_a_latest_version_call_waiting_for_the_takeover(world):
    latest = world.peer("back", b"instance-7/bls")
    bls_call(latest, 1, version=-1)
    for _ in range(5):
        world.broker.turn(5)
    world.broker.scheduler.fail_everything(Unavailable("the server is shutting down"))
    world.until(lambda: latest.headers(Kind.RESPONSE))
    assert latest.headers(Kind.RESPONSE)[0]["err"]["message"] == "the server is shutting down"


def test_a_draining_process_registers_a_returning_gateway_draining_and_ignores_a_hold_for_another(world):
    """Two restarts in a row: the gateway registers by heartbeat with a process that drains
    already, and is told so in the heartbeat that registers it. Its heartbeat that still holds
    for the previous process does not count as holding for this one: the requests it held, sent
    now, are served, and this process exits only once the gateway holds for it."""
    _, instance = world.serving_instance()
    world.broker.drain()
    gateway = world.peer("front", b"gw-old")
    gateway.send(holding_heartbeat(next_rid=1, boot=world.broker.boot - 1))
    world.until(lambda: gateway.headers(Kind.HEARTBEAT))
    gateway.send(holding_heartbeat(next_rid=1, boot=world.broker.boot - 1))   # before it read that
    infer(gateway, rid=1, value=4)   # held for this process, sent once the gateway heard it
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    answer(instance, batch, [(header, raw)])
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    world.broker.turn(5)
    still_running = world.broker._running
    gateway.send(holding_heartbeat(next_rid=2, boot=world.broker.boot))
    world.until(lambda: not world.broker._running)
    registered = gateway.headers(Kind.HEARTBEAT)[0]
    assert registered.get("dr") is True and registered["sn"] == 1
    ((response, body),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 1 and "err" not in response and body.endswith(bytes([4]) * 16)
    assert still_running, "it took the hold for the previous process as one for itself"
