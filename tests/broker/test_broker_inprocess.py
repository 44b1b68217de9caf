"""The broker process's loop, in-process, over ``inproc://`` with scripted peers.

A test plays the gateway, the host agent and the instance with DEALER sockets of its
own and drives the broker turn by turn (``Broker.turn``), so that orderings, failures and
liveness are exact and asserted on the messages and the broker's state, not on logs.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.broker.inprocess_world import CONFIG, HEARTBEAT_S, World, answer, infer
from tritium.broker.rate_limiter import ResourceFlag
from tritium.logs import LogSettings
from tritium.errors import Cancelled, ErrorCode, InternalError
from tritium.protocol import (PROTOCOL_VERSION, BatchDone, Cancel, Control, Heartbeat, Hello, IndexQuery, Infer, Kind,
                              Response, Role, encode, error_record)


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path)
    yield world
    world.close()


def test_a_gateway_that_says_hello_gets_the_boot_id_the_model_table_and_the_log_settings(world):
    gateway = world.gateway()
    beat = gateway.headers(Kind.HEARTBEAT)[0]
    assert beat["boot"] == world.broker.boot and beat["hb"] == HEARTBEAT_S
    table = gateway.headers(Kind.MODELS)[-1]
    assert [(m["name"], m["versions"]) for m in table["models"]] == [("m", [[1, "LOADING", "", True]])]
    assert gateway.headers(Kind.LOG_SETTINGS)
    assert b"gw-1" in world.broker.gateways


def test_a_request_goes_to_the_instance_untouched_and_its_answer_back_with_statistics(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    world.until(lambda: any(v[1] == "READY" for m in gateway.headers(Kind.MODELS)[-1]["models"] for v in m["versions"]))
    sent = infer(gateway, rid=7, value=3)
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    assert (batch["k"], batch["n"], header["rid"], raw) == (Kind.BATCH, 1, 7, sent)   # the very record
    answer(instance, batch, [(header, raw)])
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((response, body),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 7 and body.endswith(bytes([3]) * 16)
    stats = world.broker.registry.versions[("m", 1)].stats.as_dict("m", 1)
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["compute_infer"]["ns"] == 2_000
    assert stats["execution_count"] == 1


def test_requests_wait_for_a_busy_instance_and_leave_together_each_gateway_answered_once(world):
    first, second = world.gateway(b"gw-1"), world.gateway(b"gw-2")
    _, instance = world.serving_instance()
    infer(first, rid=1)
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 1)
    infer(first, rid=2)
    infer(second, rid=3)
    infer(first, rid=4)
    for _ in range(20):    # one batch at a time for a batching model: the rest wait in the broker
        world.broker.turn(2)
    instance.collect()
    assert len(instance.headers(Kind.BATCH)) == 1
    (batch_one,) = instance.messages
    answer(instance, batch_one[0][0], batch_one[1:])
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 2)
    batch_two = instance.messages[-1]
    assert [h["rid"] for h, _ in batch_two[1:]] == [2, 3, 4]
    first.messages.clear()
    second.messages.clear()
    answer(instance, batch_two[0][0], batch_two[1:])
    world.until(lambda: first.headers(Kind.RESPONSE) and second.headers(Kind.RESPONSE))
    assert [[h["rid"] for h, _ in m if h["k"] == Kind.RESPONSE] for m in first.messages] == [[2, 4]]  # one message
    assert [h["rid"] for h in second.headers(Kind.RESPONSE)] == [3]


def test_the_requests_of_one_message_leave_for_an_idle_instance_as_one_batch(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()   # idle, and taking two batches at a time
    records = [Infer(rid, "m", [["X", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode([bytes([rid]) * 16])
               for rid in (1, 2, 3)]
    gateway.send(*records)   # one message, as a gateway sends the requests of one of its turns
    world.until(lambda: instance.headers(Kind.BATCH))
    for _ in range(5):
        world.broker.turn(2)
    instance.collect()
    # one batch of the three (as Triton's batcher finds them queued), not the first alone and the
    # second alone on the instance's second credit, the third after them
    assert [[h["rid"] for h, _ in message[1:]] for message in instance.messages if message[0][0]["k"] == Kind.BATCH] \
        == [[1, 2, 3]]


def test_a_host_that_falls_silent_is_dropped_and_the_request_it_held_is_answered_503(world):
    gateway = world.gateway()
    world.serving_instance()
    infer(gateway, rid=5)
    world.until(lambda: world.broker.scheduler.holds_work(list(world.broker.registry.instances.values())))
    keep_gateway_alive = Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION).encode()

    def silent_host_dropped() -> bool:
        gateway.send(keep_gateway_alive)
        return bool(gateway.headers(Kind.RESPONSE))

    world.until(silent_host_dropped, timeout_s=4 * HEARTBEAT_S * 3)
    ((response, _),) = gateway.records(Kind.RESPONSE)
    assert response["rid"] == 5 and response["err"]["code"] == 5   # UNAVAILABLE
    assert "was lost with its host h" in response["err"]["message"]
    assert world.broker.registry.agents == {} and world.broker.registry.instances == {}


def test_a_malformed_record_is_dropped_and_the_gateway_keeps_being_served(world):
    gateway = world.gateway()
    gateway.send(b"\x05\x00\x00\x00garbage-that-is-no-msgpack")
    gateway.send(Control(9, IndexQuery(ready=False)).encode())
    world.until(lambda: gateway.headers(Kind.CONTROL_REPLY))
    (reply,) = gateway.headers(Kind.CONTROL_REPLY)
    assert reply["rid"] == 9 and [e["name"] for e in reply["ok"]] == ["m"]


def test_a_peer_of_another_protocol_version_is_refused_with_the_reason(world):
    agent = world.peer("back", b"old-agent")
    agent.send(Hello(Role.AGENT, PROTOCOL_VERSION - 1, host="h", gpus=()).encode())
    world.until(lambda: agent.headers(Kind.REFUSED))
    (refused,) = agent.headers(Kind.REFUSED)
    assert refused["reason"] == (f"protocol version {PROTOCOL_VERSION - 1} refused; this broker speaks "
                                 f"version {PROTOCOL_VERSION}")
    assert b"old-agent" not in world.broker.registry.agents


def test_the_log_settings_the_broker_is_started_with_reach_a_gateway_that_says_hello(world):
    world.broker.log_settings = LogSettings(log_verbose_level=2)   # as tritium broker hands them on
    gateway = world.gateway()
    assert gateway.headers(Kind.LOG_SETTINGS)[-1]["settings"]["log_verbose_level"] == 2


def test_an_instance_the_rate_limiter_cannot_take_after_the_load_is_refused_and_the_model_serves_on(tmp_path):
    """A resource given for device 0 only: an instance joining later on GPU 1 could never run."""
    limited = CONFIG + 'instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]'
    world = World(tmp_path, limited, rate_limit_resources=(ResourceFlag("R", 1, 0),))
    try:
        agent, _ = world.serving_instance()
        version = world.broker.registry.versions[("m", 1)]
        late = world.peer("back", b"instance-2")
        late.send(Hello(Role.INSTANCE, PROTOCOL_VERSION, heartbeat_s=HEARTBEAT_S, agent="agent-1", model="m",
                        version=1, epoch=version.epoch, name="m_0@gpu1", boot=world.broker.boot, credit=2,
                        instance_kind="GPU", device=1).encode())
        world.until(lambda: late.headers(Kind.REFUSED))
        assert late.headers(Kind.REFUSED)[0]["reason"] == (
            'Invalid argument: Resource count for "R" is limited to 0 which will prevent scheduling of one or more '
            "model instances, the minimum required count is 1")
        assert [i.iid for i in version.instances] == [b"instance-1"] and version.state.value == "READY"
    finally:
        world.close()


def test_a_cancelled_request_leaves_its_queue_answered_cancelled_and_a_running_ones_instance_is_told(world):
    gateway = world.gateway()
    _, instance = world.serving_instance()
    beats = world.peer("back", b"instance-1/hb")   # the instance's heartbeat thread
    beats.send(Heartbeat(heartbeat_s=HEARTBEAT_S, iid="instance-1", agent="agent-1", joined=True).encode())
    infer(gateway, rid=1)
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 1)
    infer(gateway, rid=2)
    infer(gateway, rid=3)
    for _ in range(20):    # 2 and 3 wait in the broker for the busy instance
        world.broker.turn(2)
    gateway.send(Cancel(2, "m", 1).encode(), Cancel(1, "m", 1).encode(), Cancel(3, "m", 7).encode())
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((cancelled, _),) = gateway.records(Kind.RESPONSE)
    assert cancelled["rid"] == 2
    assert cancelled["err"] == {"code": ErrorCode.CANCELLED.value, "message": "the client cancelled the request"}
    stats = world.broker.registry.versions[("m", 1)].stats
    assert stats.as_dict("m", 1)["inference_stats"]["fail"]["count"] == 1
    assert stats.failures == {"CANCELED": 1}
    # The running one: its instance is told on both sockets (the heartbeat thread's sees it during execute).
    world.until(lambda: instance.headers(Kind.CANCEL_RUNNING) and beats.headers(Kind.CANCEL_RUNNING))
    (batch_one,) = [m for m in instance.messages if m[0][0]["k"] == Kind.BATCH]
    told = [{"k": Kind.CANCEL_RUNNING, "b": batch_one[0][0]["b"], "i": 0}]
    assert instance.headers(Kind.CANCEL_RUNNING) == told and beats.headers(Kind.CANCEL_RUNNING) == told
    answer(instance, batch_one[0][0], batch_one[1:])
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 2)
    assert [h["rid"] for h, _ in instance.messages[-1][1:]] == [3]   # the cancelled request is gone
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    assert [h["rid"] for h in gateway.headers(Kind.RESPONSE)] == [2, 1]   # the running one was answered


def test_a_request_cancelled_while_it_waits_at_its_instance_counts_as_canceled_when_dropped_there(tmp_path):
    """A model without batching: the instance holds a second request on its second credit while
    the first runs. Its cancel goes to the instance (which drops it unrun, answering CANCELLED);
    the broker counts that failure as CANCELED, as Triton counts a request dropped from its queue."""
    world = World(tmp_path, CONFIG.replace("max_batch_size: 8", "max_batch_size: 0").replace("dynamic_batching { }", ""))
    try:
        gateway = world.gateway()
        _, instance = world.serving_instance()
        infer(gateway, rid=1)
        infer(gateway, rid=2)
        world.until(lambda: len(instance.headers(Kind.BATCH)) == 2)
        gateway.send(Cancel(2, "m", 1).encode())
        world.until(lambda: instance.headers(Kind.CANCEL_RUNNING))
        first, second = [m for m in instance.messages if m[0][0]["k"] == Kind.BATCH]
        assert instance.headers(Kind.CANCEL_RUNNING) == [{"k": Kind.CANCEL_RUNNING, "b": second[0][0]["b"], "i": 0}]
        assert not gateway.headers(Kind.RESPONSE)   # the instance answers it
        answer(instance, first[0][0], first[1:])
        instance.send(BatchDone(second[0][0]["b"], [False], [0], (0, 0, 0), ran=False).encode(),
                      error_record(2, Cancelled.by_client()))
        world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    finally:
        world.close()
    assert [(h["rid"], (h.get("err") or {}).get("code")) for h in gateway.headers(Kind.RESPONSE)] == [
        (1, None), (2, ErrorCode.CANCELLED.value)]
    stats = world.broker.registry.versions[("m", 1)].stats
    assert stats.failures == {"CANCELED": 1}
    assert stats.as_dict("m", 1)["inference_stats"]["success"]["count"] == 1
    assert stats.execution_count == 1   # the dropped request's batch never ran


def test_a_cancelled_running_request_that_fails_otherwise_counts_as_a_backend_failure(world):
    """The client gave up on a running request, and the model failed it for its own reason:
    that failure is the backend's. One that ran and was answered CANCELLED counts CANCELED."""
    gateway = world.gateway()
    _, instance = world.serving_instance()
    for rid, error in ((1, InternalError("the model failed")), (2, Cancelled.by_client())):
        infer(gateway, rid=rid)
        world.until(lambda: len(instance.headers(Kind.BATCH)) == rid)
        gateway.send(Cancel(rid, "m", 1).encode())
        world.until(lambda: len(instance.headers(Kind.CANCEL_RUNNING)) == rid)
        batch = instance.headers(Kind.BATCH)[-1]
        instance.send(BatchDone(batch["b"], [False], [0], (0, 0, 0)).encode(), error_record(rid, error))
        world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == rid)
    stats = world.broker.registry.versions[("m", 1)].stats
    assert stats.failures == {"BACKEND": 1, "CANCELED": 1}
    assert stats.execution_count == 2   # a Python model's failed executions count, as in Triton


@pytest.mark.parametrize("done_header, responses", [
    ({"t": [1, 2]}, 1),                                  # does not decode: two timings, not three
    ({"ok": [True, True], "rx": [0, 0]}, 1),             # decodes, but two results for one request
    ({}, 0),                                             # its RESPONSE record is missing
], ids=["two-timings", "two-results", "no-response"])
def test_an_instance_answer_that_does_not_match_its_batch_fails_its_requests_and_the_instance_serves_on(
        world, done_header, responses):
    """Nothing an instance sends leaves a request unanswered: a BATCH_DONE that does not decode, or
    does not hold one result per request, answers the batch's requests with an internal error
    naming the instance and model, and the instance gets the next batch."""
    gateway = world.gateway()
    _, instance = world.serving_instance()
    infer(gateway, rid=1, value=5)
    world.until(lambda: instance.headers(Kind.BATCH))
    ((batch, _), (header, raw)) = instance.messages[-1]
    response = Response(1, [["Y", "FP32", [1, 4], 16, False]]).encode([raw[-16:]])
    instance.send(encode({"k": Kind.BATCH_DONE, "b": batch["b"], "ok": [True], "rx": [0], "t": [1, 2, 3],
                          **done_header}), *[response][:responses])
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    ((failed, _),) = gateway.records(Kind.RESPONSE)
    assert failed["rid"] == 1 and failed["err"]["code"] == ErrorCode.INTERNAL.value
    assert failed["err"]["message"].startswith(f"instance 'm_0' of model 'm' version 1 answered batch {batch['b']} ")
    assert world.broker.registry.versions[("m", 1)].stats.failures == {"BACKEND": 1}
    infer(gateway, rid=2, value=7)
    world.until(lambda: len(instance.headers(Kind.BATCH)) == 2)
    ((batch, _), *records) = instance.messages[-1]
    answer(instance, batch, records)
    world.until(lambda: len(gateway.headers(Kind.RESPONSE)) == 2)
    served = gateway.records(Kind.RESPONSE)[-1]
    assert served[0]["rid"] == 2 and "err" not in served[0] and served[1].endswith(bytes([7]) * 16)


def test_an_instance_silent_while_its_host_says_its_process_runs_is_kept_and_dropped_once_not(world, caplog):
    """A model holding Python's GIL in a long call starves its instance's heartbeats; Triton keeps a
    stub that computes, and so does the broker while the instance runs a batch and its host agent
    says its process runs. Without a batch, or once the agent no longer lists it, it is dropped."""
    gateway = world.gateway()
    agent, instance = world.serving_instance()
    keep_gateway = Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION).encode()

    def agent_says(working: list[str], until):
        def condition() -> bool:
            gateway.send(keep_gateway)
            agent.send(Heartbeat(heartbeat_s=HEARTBEAT_S, role=Role.AGENT, working=working).encode())
            return until()
        return condition

    infer(gateway, rid=5)
    world.until(agent_says(["instance-1"], lambda: bool(instance.headers(Kind.BATCH))))   # running, never answered
    kept_until = time.monotonic() + 2 * HEARTBEAT_S * 3   # twice its limit
    with caplog.at_level(logging.WARNING):
        world.until(agent_says(["instance-1"], lambda: time.monotonic() > kept_until), timeout_s=5)
    assert b"instance-1" in world.broker.registry.instances and not gateway.headers(Kind.RESPONSE)
    assert "has not answered heartbeats for 1 s while running a batch, but its process runs (its host agent " \
           "says so): kept" in caplog.text
    world.until(agent_says([], lambda: b"instance-1" not in world.broker.registry.instances), timeout_s=5)
    assert len(world.broker.registry.versions[("m", 1)].batcher) == 1   # its request waits for the restarted one


def test_an_idle_silent_instance_is_dropped_even_while_its_process_runs(world):
    """Kept only while it computes: an instance silent without work has stopped serving."""
    gateway = world.gateway()
    agent, _ = world.serving_instance()

    def agent_says_it_runs() -> bool:
        gateway.send(Heartbeat(heartbeat_s=1.0, role=Role.GATEWAY, protocol_version=PROTOCOL_VERSION).encode())
        agent.send(Heartbeat(heartbeat_s=HEARTBEAT_S, role=Role.AGENT, working=["instance-1"]).encode())
        return b"instance-1" not in world.broker.registry.instances

    world.until(agent_says_it_runs, timeout_s=5)
