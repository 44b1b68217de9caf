"""Records that do not read as their kind's type, through the broker's loop in-process: the asker of a
malformed INFER or CONTROL gets the error, a peer of another protocol version is refused, and the broker keeps
serving (the harness of test_broker_inprocess). The records are hand-built: no type builds them."""

from __future__ import annotations

import pytest

from tests.broker.inprocess_world import World
from tritium.errors import ErrorCode
from tritium.protocol import PROTOCOL_VERSION, Control, Infer, Kind, StatusQuery, encode


@pytest.fixture
def world(tmp_path):
    world = World(tmp_path)
    yield world
    world.close()


def test_a_malformed_infer_is_answered_with_the_field_it_lacks(world):
    gateway = world.gateway()
    gateway.send(encode({"k": Kind.INFER, "rid": 4, "m": "m", "v": 1}))   # no inputs
    world.until(lambda: gateway.headers(Kind.RESPONSE))
    (response,) = gateway.headers(Kind.RESPONSE)
    assert response["rid"] == 4 and response["err"]["code"] == ErrorCode.INVALID_ARG
    assert response["err"]["message"] == ("malformed inference request: malformed record header: "
                                          "Object missing required field `inputs`")
    gateway.send(Control(9, StatusQuery()).encode())
    world.until(lambda: gateway.headers(Kind.CONTROL_REPLY))
    assert gateway.headers(Kind.CONTROL_REPLY)[0]["rid"] == 9


def test_a_malformed_control_is_answered_and_the_next_one_served(world):
    gateway = world.gateway()
    gateway.send(encode({"k": Kind.CONTROL, "rid": 5, "args": {"op": "no-such-op"}}))
    gateway.send(encode({"k": Kind.CONTROL, "rid": 6}))   # no operation at all
    world.until(lambda: len(gateway.headers(Kind.CONTROL_REPLY)) == 2)
    first, second = gateway.headers(Kind.CONTROL_REPLY)
    assert (first["rid"], second["rid"]) == (5, 6)
    for reply in (first, second):
        assert reply["err"]["code"] == ErrorCode.INVALID_ARG
        assert reply["err"]["message"].startswith("malformed control request: malformed record header: ")
    assert "no-such-op" in first["err"]["message"]
    gateway.send(Control(7, StatusQuery()).encode())
    world.until(lambda: len(gateway.headers(Kind.CONTROL_REPLY)) == 3)
    third = gateway.headers(Kind.CONTROL_REPLY)[2]
    assert third["rid"] == 7 and "err" not in third and third["ok"]["ready"] in (True, False)


def test_the_requests_after_a_malformed_one_in_the_same_message_are_served(world):
    gateway = world.gateway()
    gateway.send(encode({"k": Kind.CONTROL, "rid": 11}), Control(12, StatusQuery()).encode(),
                 encode({"k": Kind.INFER, "rid": 13, "m": "m", "v": 1}), Control(14, StatusQuery()).encode())
    world.until(lambda: len(gateway.headers(Kind.CONTROL_REPLY)) == 3 and gateway.headers(Kind.RESPONSE))
    replies = {reply["rid"]: reply for reply in gateway.headers(Kind.CONTROL_REPLY)}
    assert replies[11]["err"]["code"] == ErrorCode.INVALID_ARG
    assert "err" not in replies[12] and "err" not in replies[14]
    (response,) = gateway.headers(Kind.RESPONSE)
    assert response["rid"] == 13 and response["err"]["code"] == ErrorCode.INVALID_ARG


def test_a_hello_of_another_version_that_does_not_read_as_this_ones_is_refused(world):
    agent = world.peer("back", b"newer-agent")
    agent.send(encode({"k": Kind.HELLO, "role": "agent", "pv": PROTOCOL_VERSION + 1, "host": ["a", "list"]}))
    world.until(lambda: agent.headers(Kind.REFUSED))
    (refused,) = agent.headers(Kind.REFUSED)
    assert refused["reason"] == (f"protocol version {PROTOCOL_VERSION + 1} refused; this broker speaks "
                                 f"version {PROTOCOL_VERSION}")
    assert b"newer-agent" not in world.broker.registry.agents


def test_a_models_control_on_its_bls_socket_is_answered_there_malformed_or_not(world):
    """A model's load_model / is_model_ready: its CONTROL comes on the backend, from its BLS socket."""
    world.serving_instance()
    bls = world.peer("back", b"instance-1/bls")
    bls.send(encode({"k": Kind.CONTROL, "rid": 3, "args": {"op": "no-such-op"}}))
    bls.send(Control(4, StatusQuery()).encode())
    world.until(lambda: len(bls.headers(Kind.CONTROL_REPLY)) == 2)
    malformed, status = bls.headers(Kind.CONTROL_REPLY)
    assert malformed["rid"] == 3 and malformed["err"]["message"].startswith("malformed control request: ")
    assert status["rid"] == 4 and status["ok"]["ready"] is True


def test_a_models_bls_call_with_inputs_the_called_model_does_not_take_is_refused_with_tritons_words(world):
    """Triton's core checks a BLS call's inputs by name before it runs; the broker does, as the
    gateway does for clients (a call reaching the model without its input would fail there)."""
    world.serving_instance()
    bls = world.peer("back", b"instance-1/bls")
    bls.send(Infer(3, "m", [], version=1, batch_size=1).encode())
    bls.send(Infer(4, "m", [["WRONG", "FP32", [1, 4], 16, False]], version=1, batch_size=1).encode([bytes(16)]))
    world.until(lambda: len(bls.headers(Kind.RESPONSE)) == 2)
    missing, unexpected = bls.headers(Kind.RESPONSE)
    assert (missing["rid"], missing["err"]["code"]) == (3, ErrorCode.INVALID_ARG)
    assert missing["err"]["message"] == (
        "Model m - Error when running inference: [request id: <id_unknown>] expected 1 inputs but got 0 inputs "
        "for model 'm'. Got input(s) [], but missing required input(s) ['X']. Please provide all required input(s).")
    assert unexpected["err"]["message"] == ("Model m - Error when running inference: [request id: <id_unknown>] "
                                            "unexpected inference input 'WRONG' for model 'm'")
    bls.send(Infer(5, "m", [["X", "INT32", [1, 4], 16, False]], version=1, batch_size=1).encode([bytes(16)]))
    bls.send(Infer(6, "m", [["X", "FP32", [1, 5], 20, False]], version=1, batch_size=1).encode([bytes(20)]))
    bls.send(Infer(7, "m", [["X", "FP32", [9, 4], 144, False]], version=1, batch_size=9).encode([bytes(144)]))
    world.until(lambda: len(bls.headers(Kind.RESPONSE)) == 5)
    datatype, shape, batch = (r["err"]["message"] for r in bls.headers(Kind.RESPONSE)[2:])
    prefix = "Model m - Error when running inference: [request id: <id_unknown>] "
    assert datatype == prefix + "inference input 'X' data-type is 'INT32', but model 'm' expects 'FP32'"
    assert shape.startswith(prefix + "unexpected shape for input 'X' for model 'm'. Expected [-1,4], got [1,5]. "
                                     "NOTE: Setting a non-zero max_batch_size")
    assert batch == prefix + "inference request batch-size must be <= 8 for 'm'"
